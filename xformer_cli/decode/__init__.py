"""Decoding: the decoding plan, the beam search and its step, constraints, shortlists, the
engines (xf and CTranslate2), workers, confidence and pair scoring, and the line handling that
``xf translate`` and ``xf serve`` share (``translate``, ``steering``). Imports ``base``, ``text``,
``settings``, ``model`` and ``data``."""
