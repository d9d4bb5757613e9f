"""Text: the sentencepiece vocabulary and its special ids, language codes and tags, sentence
segmentation, HTML text, language identification, glossaries and the corpus metrics (BLEU, chrF,
TER). Imports only ``base``."""
