"""Model FLOPs of training, the numerator of MFU (model FLOPs utilization, PaLM's Appendix B).

Counted per sentence pair from its own lengths, so padding is never counted: a benchmark sums
them over every pair it trained on and divides by the seconds it took. Forward, per pair with S
source and T target positions (eos and bos included, as ``batching.collate`` makes them), d = d_model:

    encoder layer   2 * (4 d^2 + F d) * S             Q, K, V, O projections and the FFN
                    + 4 * S^2 * d                     q k^T and the weighted sum of v
    decoder layer   2 * (4 d^2 + F d) * T + 4 T^2 d   self-attention and the FFN
                    + 2 * 2 d^2 * (T + S)             cross-attention: Q, O on T; K, V on S
                    + 4 * T * S * d                   cross-attention scores and sum
    output          2 * d * V * T                     the projection onto the vocabulary

with F = 2 d_ff matrix entries in the FFN (3 d_ff for SwiGLU's gate, value and output). Training
is three times the forward pass (the backward pass multiplies by two matrices where the forward
multiplies by one), i.e. 6 * N * tokens for the parameters N each token passes through, plus
the attention terms. Embedding lookups, layer norms, softmax, biases and the loss are not matrix
products and are not counted. Causal self-attention is counted in full (T^2), as PaLM and
torch's FlopCounterMode count it; a flash kernel skips about half of it.
"""

from __future__ import annotations

import numpy as np

from ..settings.options import ModelConfig


def training_flops(cfg: ModelConfig, src_lengths, tgt_lengths) -> float:
    """Forward + backward matrix-product FLOPs of training on pairs of these lengths (no padding)."""
    s = np.asarray(src_lengths, dtype=np.float64)
    t = np.asarray(tgt_lengths, dtype=np.float64)
    d, v = cfg.d_model, cfg.vocab_size
    ffn = (3 if cfg.activation == "swiglu" else 2) * cfg.d_ff * d
    encoder = cfg.encoder_layers * (2 * (4 * d * d + ffn) * s.sum() + 4 * d * (s * s).sum())
    decoder = cfg.decoder_layers * (2 * (4 * d * d + ffn) * t.sum() + 4 * d * (t * t).sum()
                                    + 4 * d * d * (t.sum() + s.sum()) + 4 * d * (t * s).sum())
    output = 2 * d * v * t.sum()
    return 3.0 * float(encoder + decoder + output)
