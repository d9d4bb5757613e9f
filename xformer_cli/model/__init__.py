"""The model: the Transformer itself, checkpoints (saved and loaded with ``weights_only``), the
record of what a model is (``facts``), int8 weights, attention maps and FLOP counts. Imports
``base``, ``text`` and ``settings``."""
