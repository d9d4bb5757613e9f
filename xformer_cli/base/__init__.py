"""What every wing stands on: errors with their one-line messages, the console, atomic file
writes, the one JSON reader, output safety, signals, and the machine (processes, threads,
precision, torch.compile, memory). Imports no other wing."""
