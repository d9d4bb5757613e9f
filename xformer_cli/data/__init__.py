"""Data: the binarized, memory-mapped corpus (``dataset``), batches by tokens (``batching``) and
the sampling of directions in a multilingual corpus. Imports ``base``, ``text`` and
``settings``."""
