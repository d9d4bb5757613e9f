"""Label-smoothed cross-entropy (Szegedy et al., 2016), the paper's training loss (Sec. 5.4).

The smoothed target puts 1 - epsilon on the reference token and spreads epsilon uniformly over
the whole vocabulary: q = (1 - epsilon) * onehot(y) + epsilon / V. Then

    loss = -sum_v q_v log p_v = (1 - epsilon) * nll + epsilon / V * sum_v -log p_v

fairseq spreads epsilon over the V - 1 other tokens instead; the two differ by O(epsilon / V).
"""

from __future__ import annotations

import torch

from .model import PAD_ID


def label_smoothed_loss(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int = PAD_ID
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (..., V), target (...) -> (loss, nll), each summed over the non-pad positions.

    Computed from logsumexp without materializing log-probabilities: with lse = log sum exp z,
    -log p_y = lse - z_y and sum_v -log p_v = V * lse - sum_v z_v. This keeps one (N, V) tensor
    fewer alive for the backward pass than log_softmax would, which matters at V = 37000.
    Half-precision logits (bf16/fp16 autocast) are summed in float32.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    vocab = logits.size(-1)
    lse = torch.logsumexp(logits, dim=-1)  # (...)
    target_logit = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (...)
    keep = target.ne(ignore_index)
    nll = (lse - target_logit).masked_fill(~keep, 0.0).sum()
    if epsilon == 0:
        return nll, nll.detach()
    smooth = (vocab * lse - logits.sum(dim=-1)).masked_fill(~keep, 0.0).sum()
    loss = (1.0 - epsilon) * nll + (epsilon / vocab) * smooth
    return loss, nll.detach()
