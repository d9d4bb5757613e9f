"""Label-smoothed cross-entropy (Szegedy et al., 2016), the paper's training loss (Sec. 5.4).

The smoothed target puts 1 - epsilon on the reference token and spreads epsilon uniformly over
the whole vocabulary: q = (1 - epsilon) * onehot(y) + epsilon / V. Then

    loss = -sum_v q_v log p_v = (1 - epsilon) * nll + epsilon / V * sum_v -log p_v

fairseq spreads epsilon over the V - 1 other tokens instead; the two differ by O(epsilon / V).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..text.vocab import PAD_ID


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


class _FusedOutputLoss(torch.autograd.Function):
    """Output projection and label-smoothed loss in row chunks, gradients computed on the way.

    The (N, V) logits never exist whole: each chunk of rows is projected, reduced to its loss
    terms and turned into its logit gradient while it is still in cache, and that gradient is
    pushed through the projection at once (into grad_x and grad_weight). The backward pass only
    scales the stored gradients by the incoming one. This is the same arithmetic as
    ``label_smoothed_loss(x @ weight.T, target)`` with the backward of autograd, minus the
    passes over (N, V) tensors in memory, which dominate the loss's cost on CPUs.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, target, epsilon: float, chunk_rows: int):
        vocab = weight.size(0)
        work = torch.promote_types(x.dtype, torch.float32)  # softmax math in float32 or better
        want_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        loss = x.new_zeros((), dtype=work)
        nll = x.new_zeros((), dtype=work)
        grad_x = torch.empty_like(x) if want_grad else None
        grad_w = torch.zeros_like(weight, dtype=work) if want_grad else None
        for start in range(0, x.size(0), chunk_rows):
            xc, tc = x[start : start + chunk_rows], target[start : start + chunk_rows]
            z = (xc @ weight.t()).to(work)  # (C, V) logits; under autocast the matmul is bf16/fp16
            if bias is not None:  # a fixed bias (Transformer.output_bias): no gradient
                z += bias.to(work)
            lse = torch.logsumexp(z, dim=-1)  # (C,)
            chunk_nll = (lse - z.gather(-1, tc.unsqueeze(-1)).squeeze(-1)).sum()
            nll += chunk_nll
            loss += chunk_nll if not epsilon else (
                (1.0 - epsilon) * chunk_nll + (epsilon / vocab) * (vocab * lse - z.sum(dim=-1)).sum())
            if want_grad:
                # d loss / d z = softmax(z) - (1 - eps) * onehot(y) - eps / V, in place in z
                g = z.sub_(lse.unsqueeze(-1)).exp_()
                if epsilon:
                    g.sub_(epsilon / vocab)
                g.scatter_add_(-1, tc.unsqueeze(-1), g.new_full((tc.numel(), 1), epsilon - 1.0))
                grad_x[start : start + chunk_rows] = g @ weight.to(work)
                grad_w += g.t() @ xc.to(work)
        if want_grad:
            ctx.save_for_backward(grad_x, grad_w)
        ctx.weight_dtype = weight.dtype
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        grad_x, grad_w = ctx.saved_tensors
        # nll is reported, not trained on: its gradient is ignored (it is returned detached).
        return grad_x * grad_loss.to(grad_x.dtype), (grad_w * grad_loss).to(ctx.weight_dtype), None, None, None, None


def fused_output_loss(
    features: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, epsilon: float, chunk_rows: int = 0,
    rows: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """label_smoothed_loss(features @ weight.T + bias, target) without materializing the logits.

    features (..., D) decoder outputs, weight (V, D) output projection, bias (V,) a fixed logit
    bias (not trained; None: none), target (...). Padding
    rows are dropped before projecting (no work is spent on them). Returns (loss, nll) summed.
    ``chunk_rows`` 0 picks chunks of about 4M logits on CPU (16 MB in float32: cache-sized) and
    64M on GPUs (where passes over memory are cheap and many small kernels are not). ``rows``, the
    positions of the non-pad targets in ``target.reshape(-1)`` (``collate``'s ``target_rows``),
    spares finding them on the device, which makes the host wait for it (a boolean index's size
    is only known there).
    """
    if rows is None:
        keep = target.ne(PAD_ID)
        x, t = features[keep], target[keep]  # (N, D), (N,)
    else:
        x = features.reshape(-1, features.size(-1)).index_select(0, rows)  # the same rows, in order
        t = target.reshape(-1).index_select(0, rows)
    chunk_rows = chunk_rows or max(1, (1 << (26 if x.is_cuda else 22)) // weight.size(0))
    loss, nll = _FusedOutputLoss.apply(x, weight, bias, t, float(epsilon), chunk_rows)
    return loss, nll.detach()


def perplexity(nll: float) -> float:
    """exp of the per-token negative log-likelihood, clamped where exp would overflow a float."""
    return math.exp(min(nll, 700.0))
