"""Formats: what ``xf export`` writes and ``xf import`` reads: CTranslate2, Argos, Marian,
Bergamot (with its page) and Hugging Face. Imports the wings below it, ``decode`` included;
nothing below imports a format."""
