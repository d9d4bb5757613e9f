"""Text: the sentencepiece vocabulary and its special ids, language codes and tags, sentence
segmentation, HTML text, language identification, glossaries, a German sentence's address and its
formality tags, and the corpus metrics (BLEU, chrF, TER, formality accuracy). Imports only
``base``."""
