"""Attention weights as the model computes them: recording, forced decoding, hard alignments.

The weights are the model's own: while ``record`` is active, each chosen ``MultiHeadAttention``
keeps the post-softmax weights (B, H, T, S) of its forward pass (model/transformer.py). Forced decoding runs
the model once over a given target, as in training (bos + target, causal mask), so that every
target position's attention is recorded in one pass. Used by ``xf plot attention`` (all maps) and
``xf translate --print-alignment`` (the cross-attention of one decoder layer).

Alignment indices count subwords (or whitespace-separated words) from 0 on both sides; the
source's and the target's eos are not aligned.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch

from ..base.errors import ConfigError
from ..text.vocab import PAD_ID, BOS_ID, EOS_ID
from .transformer import MultiHeadAttention, Transformer


@contextlib.contextmanager
def record(modules: Sequence[MultiHeadAttention]) -> Iterator[list[list[torch.Tensor]]]:
    """While inside, every call of each module appends its weights (B, H, T, S) to its list."""
    if any(m.training for m in modules):
        raise ValueError("attention is recorded in eval mode (call model.eval())")
    lists: list[list[torch.Tensor]] = []
    for m in modules:
        m.recorded = []
        lists.append(m.recorded)
    try:
        yield lists
    finally:
        for m in modules:
            m.recorded = None


def target_batch(targets: Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
    """The decoder input (N, T) of targets that end in eos: bos + target[:-1], right-padded."""
    prev = torch.full((len(targets), max(len(t) for t in targets)), PAD_ID, dtype=torch.long)
    for i, tokens in enumerate(targets):
        prev[i, 0] = BOS_ID
        prev[i, 1 : len(tokens)] = torch.tensor(list(tokens[:-1]), dtype=torch.long)
    return prev.to(device)


@dataclass
class AttentionMaps:
    """The weights of one forced-decoding pass, one tensor per layer, all heads.

    encoder (B, H, S, S), decoder (B, H, T, T), cross (B, H, T, S): query positions are rows,
    key positions columns; S counts the source's eos, T the target's eos (at the last row it is
    the input token before it that attends, predicting the eos).
    """

    encoder: list[torch.Tensor]
    decoder: list[torch.Tensor]
    cross: list[torch.Tensor]


@torch.inference_mode()
def force_decode(model: Transformer, src: torch.Tensor, targets: Sequence[Sequence[int]]) -> AttentionMaps:
    """All attention weights of ``model`` on src (B, S) and targets (B lists of ids ending in eos)."""
    groups = (
        [layer.self_attn for layer in model.encoder_layers],
        [layer.self_attn for layer in model.decoder_layers],
        [layer.cross_attn for layer in model.decoder_layers],
    )
    with record([m for group in groups for m in group]) as calls:
        model(src, target_batch(targets, src.device), features_only=True)
    per_module = [c[0].float() for c in calls]  # one call each: the whole target at once
    n_enc, n_dec = len(groups[0]), len(groups[1])
    return AttentionMaps(per_module[:n_enc], per_module[n_enc : n_enc + n_dec], per_module[n_enc + n_dec :])


def degeneracies(maps: AttentionMaps, src: torch.Tensor, targets: Sequence[Sequence[int]],
                 max_entropy: float = 0.9) -> list[str]:
    """Why the maps of ``force_decode(model, src, targets)`` are degenerate: one line per failed
    check; none when they are healthy. Checked over the real (unpadded) query rows:

    every head of every layer of each kind (encoder, decoder, cross)
      - is a distribution over the keys it may see: rows sum to 1 with at most 1e-6 on padding,
        and the decoder's causal mask puts exactly zero on future positions;
      - is not collapsed: not every row puts more than 0.99 on one position;
      - (cross-attention) is not one map for every target position: in some sentence a row is
        more than 0.05 (total variation) from that sentence's mean row;
    and the heads of each kind are not all near-uniform: their mean normalized entropy (entropy /
    log n per row, n the keys the row may see, rows with one key left out) is below
    ``max_entropy``. On Multi30k captions ``tiny`` has 0.95 / 0.96 / 0.98 (encoder / decoder /
    cross) at initialisation and 0.78 / 0.73 / 0.88 after 250 updates of 32 pairs
    (tests/test_attention_maps.py); single heads are broader, its first cross-attention layer
    longest (0.91-0.96 then), so the entropy rule is one per kind, not one per head.
    """
    problems: list[str] = []
    src_real = src.ne(PAD_ID)  # (B, S)
    t = max(len(x) for x in targets)
    tgt_real = torch.tensor([[i < len(x) for i in range(t)] for x in targets], device=src.device)  # (B, T)
    causal = torch.ones(t, t, dtype=torch.bool, device=src.device).tril()
    kinds = (
        ("encoder", maps.encoder, src_real[:, :, None] & src_real[:, None, :], src_real),
        ("decoder", maps.decoder, tgt_real[:, :, None] & tgt_real[:, None, :] & causal, tgt_real),
        ("cross", maps.cross, tgt_real[:, :, None] & src_real[:, None, :], tgt_real),
    )
    for kind, layers, allowed, rows in kinds:  # allowed (B, T, S), rows (B, T)
        n = allowed.sum(-1)  # (B, T) keys each row may see
        scored = rows & (n > 1)  # rows with a choice
        ratios = []  # per head: mean entropy / log n, 1 uniform, 0 one-hot
        for layer, weights in enumerate(layers, 1):
            w = weights.float()  # (B, H, T, S)
            for head in range(w.size(1)):
                where = f"{kind} layer {layer} head {head + 1}"
                p = w[:, head]  # (B, T, S)
                if (p.sum(-1) - 1).abs()[rows].max() > 1e-4:
                    problems.append(f"{where}: rows do not sum to 1")
                if p.masked_fill(allowed, 0.0)[rows].max() > (0.0 if kind == "decoder" else 1e-6):
                    problems.append(f"{where}: weight on " + ("future positions" if kind == "decoder" else "padding"))
                entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)  # (B, T)
                ratios.append(float((entropy[scored] / n[scored].float().log()).mean()))
                if (p.amax(-1)[scored] > 0.99).all():
                    problems.append(f"{where}: collapsed, every row on one position")
                if kind == "cross":
                    mean_row = (p * rows[..., None]).sum(1, keepdim=True) / rows.sum(1)[:, None, None]
                    spread = 0.5 * (p - mean_row).abs().sum(-1).masked_fill(~rows, 0.0)  # (B, T)
                    if spread.amax(-1).max() <= 0.05:
                        problems.append(f"{where}: the same map for every target position")
        mean = sum(ratios) / len(ratios)
        if mean >= max_entropy:
            problems.append(f"{kind}: near-uniform, mean entropy {mean:.2f} x log n "
                            f"(heads {min(ratios):.2f}-{max(ratios):.2f})")
    return problems


def resolve_layer(layer: Optional[int], layers: int, what: str = "--alignment-layer") -> int:
    """The 0-based index of a layer given from 1 (negative: from the end, -1 the last).

    None is the penultimate, the layer fairseq aligns with (the only one in a 1-layer decoder).
    """
    if layer is None:
        return max(layers - 2, 0)
    if 1 <= layer <= layers:
        return layer - 1
    if -layers <= layer <= -1:
        return layers + layer
    raise ConfigError(f"{what} {layer}: the model has {layers} decoder layers (1 to {layers}, or -1 to -{layers})")


@torch.inference_mode()
def cross_attention(model: Transformer, src: torch.Tensor, targets: Sequence[Sequence[int]], layer: int) -> torch.Tensor:
    """The head-averaged cross-attention (N, T, S) of 0-based decoder ``layer`` on forced targets.

    Only that layer's cross-attention records, so the other layers run their usual path.
    """
    with record([model.decoder_layers[layer].cross_attn]) as (calls,):
        memory, src_pad = model.encode(src)
        model.decode(target_batch(targets, src.device), memory, src_pad, features_only=True)
    return calls[0].float().mean(dim=1)


def hard_alignments(
    models: Sequence[Transformer], src: torch.Tensor, hypotheses: Sequence[Sequence], layer: Optional[int] = None,
    skip_first: bool = False,
) -> list[list[list[int]]]:
    """For each sentence of src (B, S) and each of its hypotheses (objects with ``.tokens``,
    ending in eos), the source subword index that each target subword (eos excluded) attends to
    most: the argmax over source subwords (eos and padding excluded) of the cross-attention of
    decoder ``layer`` (see resolve_layer) averaged over heads, and over the models of an ensemble.
    skip_first: no subword aligns to source position 0 (a multilingual model's target tag).
    """
    rows = [i for i, hyps in enumerate(hypotheses) for _ in hyps]
    targets = [list(h.tokens) for hyps in hypotheses for h in hyps]
    if not rows:
        return [[] for _ in hypotheses]
    src_rows = src.index_select(0, torch.tensor(rows, device=src.device))
    attn = sum(
        cross_attention(model, src_rows, targets, resolve_layer(layer, len(model.decoder_layers)))
        for model in models
    ) / len(models)  # (N, T, S)
    not_aligned = src_rows.eq(PAD_ID) | src_rows.eq(EOS_ID)  # (N, S)
    if skip_first and src_rows.size(1) > 1:
        not_aligned[:, 0] = True
    best = attn.masked_fill(not_aligned[:, None, :], float("-inf")).argmax(dim=-1).tolist()  # (N, T)
    out: list[list[list[int]]] = [[] for _ in hypotheses]
    for row, tokens, best_row in zip(rows, targets, best):
        out[row].append(best_row[: len(tokens) - 1])
    return out


def word_ids(pieces: Sequence[str]) -> list[int]:
    """The word (0-based) of each sentencepiece piece: a piece starting with ▁ starts a word, so
    words are the whitespace-separated tokens of the decoded text."""
    ids, word = [], -1
    for piece in pieces:
        if piece.startswith("\u2581") or word < 0:
            word += 1
        ids.append(word)
    return ids


def line_word_ids(sp, line: str) -> list[int]:
    """The word (0-based) of each subword of ``sp.encode(line)``, words being the whitespace-separated
    tokens of ``line`` as given: a subword belongs to the word its first byte in the line falls in
    (sentencepiece records where each piece comes from), or to the next word when that byte is
    whitespace. Counting ▁ in the pieces instead would count the words of the normalized text: a
    zero-width space (not whitespace) becomes one there."""
    import bisect
    import re

    ends, offset, at = [], 0, 0  # the byte offset in the UTF-8 line where each word ends
    for match in re.finditer(r"\S+", line):
        offset += len(line[at:match.end()].encode("utf-8"))
        at = match.end()
        ends.append(offset)
    if not ends:
        return []
    pieces = sp.encode(line, out_type="proto").pieces
    return [min(bisect.bisect_right(ends, p.begin), len(ends) - 1) for p in pieces]


def alignment_pairs(alignment: Sequence[int], src_words: Optional[Sequence[int]] = None,
                    tgt_words: Optional[Sequence[int]] = None) -> list[tuple[int, int]]:
    """(source, target) index pairs of a hard alignment (one source index per target subword):
    of subwords, or given the word of each source and target subword (``line_word_ids``,
    ``word_ids``) of words: the distinct pairs of the words of aligned subwords, sorted."""
    if src_words is None or tgt_words is None:
        return [(s, t) for t, s in enumerate(alignment)]
    return sorted({(src_words[s], tgt_words[t]) for t, s in enumerate(alignment)})


def format_alignment(pairs: Sequence[tuple[int, int]]) -> str:
    """Pharaoh format, as fairseq, Moses and fast_align: 'SRC-TGT SRC-TGT ...'."""
    return " ".join(f"{s}-{t}" for s, t in pairs)
