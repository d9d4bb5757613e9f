"""Training: setting a run up, one update, the loss and the schedule, the saved state, the
checkpoint policy, the log, validation, choosing checkpoints on validation, and the plots of
runs. Imports every wing below it, ``decode`` included (validation translates)."""
