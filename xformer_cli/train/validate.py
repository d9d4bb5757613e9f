"""Validation during training: loss and perplexity per target token, and greedy-decoding BLEU.

Each rank evaluates a disjoint share of the validation batches; the sums are combined over ranks,
so every rank gets the same numbers (and takes the same best-checkpoint and stopping decisions).
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import numpy as np
import torch

from ..data.batching import batch_by_size, collate

from ..base.distributed import Env
from ..data.dataset import ParallelDataset
from ..decode.search import greedy_search
from ..model.transformer import Transformer
from ..settings.options import DecodingOptions
from ..text.vocab import EOS_ID
from .loss import fused_output_loss, perplexity

# Output length limit of validation decoding: a * |X| + b subwords. Tighter than translation's
# |X| + 50, so that early, untrained models do not spend minutes producing garbage.
BLEU_DECODING = DecodingOptions(beam_size=1, max_len_a=1.2, max_len_b=10)


def _to(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


@torch.no_grad()
def validation_loss(
    model: Transformer,
    dataset: ParallelDataset,
    batches: Sequence[np.ndarray],
    env: Env,
    autocast: contextlib.AbstractContextManager,
    label_smoothing: float,
) -> dict[str, float]:
    """Label-smoothed loss, nll and perplexity exp(nll) per target token (nats) over ``batches``."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=env.device)  # loss, nll, target tokens
    for idx in batches[env.rank :: env.world_size]:
        batch = _to(collate([dataset[i] for i in idx]), env.device)
        with autocast:
            features = model(batch["src"], batch["prev_output"], features_only=True)
            loss, nll = fused_output_loss(features, model.output_proj.weight, batch["target"], label_smoothing,
                                          bias=model.output_bias)
        sums += torch.stack([loss.double(), nll.double(), torch.tensor(float(batch["ntokens"]), device=env.device, dtype=torch.float64)])
    loss, nll, ntokens = env.sum_tensor(sums).tolist()
    model.train(was_training)
    ntokens = max(ntokens, 1.0)
    return {"loss": loss / ntokens, "nll": nll / ntokens, "ppl": perplexity(nll / ntokens)}


@torch.no_grad()
def validation_bleu(
    model: Transformer,
    dataset: ParallelDataset,
    sp,
    env: Env,
    autocast: contextlib.AbstractContextManager,
    max_tokens: int,
) -> float:
    """Detokenized sacreBLEU of greedy translations of ``dataset`` against its (decoded) targets.

    The references are the target subwords decoded by sentencepiece, i.e. the preprocessed
    (normalized) validation text, not the raw file, which the data directory does not keep.
    """
    import sacrebleu

    was_training = model.training
    model.eval()
    batches = batch_by_size(dataset.src_sizes, max_tokens=max_tokens)  # by source length alone
    mine: list[tuple[int, str]] = []
    for idx in batches[env.rank :: env.world_size]:
        src = collate([dataset[i] for i in idx])["src"].to(env.device)
        with autocast:
            hyps = greedy_search([model], src, BLEU_DECODING)
        for i, nbest in zip(idx.tolist(), hyps):
            tokens = [t for t in nbest[0].tokens if t != EOS_ID] if nbest else []
            mine.append((i, sp.decode(tokens)))
    model.train(was_training)
    translated = dict(pair for part in env.gather(mine) for pair in part)
    order = range(len(dataset))
    hypotheses = [translated[i] for i in order]
    references = [sp.decode(dataset[i][1].tolist()) for i in order]
    return sacrebleu.corpus_bleu(hypotheses, [references]).score
