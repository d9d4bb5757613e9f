"""The non-degeneracy check of attention_maps.degeneracies on a trained checkpoint of the study,
beside the same architecture at initialisation, on held-out pairs (val), as tests/test_attention_maps.py
does for `tiny`; prints one line per kind (encoder / decoder / cross): its mean normalized entropy
(entropy / log n, 1 uniform, 0 one-hot), the range over heads, and the problems found.

    python attention.py CHECKPOINT VAL_PREFIX [PAIRS]      (PAIRS: the first N val pairs, default 64)

Exit status 1 when the trained checkpoint's maps are degenerate. Run by hand (docs/ablations.md).
"""

from __future__ import annotations

import sys

import sentencepiece as spm
import torch

from xformer_cli.model.attention_maps import degeneracies, force_decode
from xformer_cli.data.batching import collate_source
from xformer_cli.model.checkpoint import load_checkpoint, model_from_checkpoint
from xformer_cli.model.transformer import Transformer, config_from_dict
from xformer_cli.text.vocab import EOS_ID


def entropies(maps, src, targets) -> dict[str, str]:
    """Per kind: 'mean m (heads a-b)', from degeneracies' own entropy rule (a threshold of 0 makes
    it report every kind's mean)."""
    out = {}
    for line in degeneracies(maps, src, targets, max_entropy=0.0):
        kind, _, rest = line.partition(": near-uniform, mean entropy ")
        if rest:
            out[kind] = rest.replace(" x log n", "")
    return out


def main(path: str, val_prefix: str, pairs: str = "64") -> int:
    torch.manual_seed(1)
    ckpt = load_checkpoint(path)
    sp = spm.SentencePieceProcessor(model_proto=ckpt["spm_model"])
    n = int(pairs)
    en = open(f"{val_prefix}.en", encoding="utf-8").read().splitlines()[:n]
    de = open(f"{val_prefix}.de", encoding="utf-8").read().splitlines()[:n]
    src = collate_source([sp.encode(line) for line in en])  # it appends </s>
    targets = [sp.encode(line) + [EOS_ID] for line in de]
    bad = 0
    for label, model in (("trained", model_from_checkpoint(ckpt, path)),
                         ("initial", Transformer(config_from_dict(ckpt["model_config"])))):
        model.eval()
        with torch.no_grad():
            maps = force_decode(model, src, targets)
        problems = degeneracies(maps, src, targets)
        spread = entropies(maps, src, targets)
        print(f"{label}: " + "; ".join(f"{k} {v}" for k, v in spread.items())
              + f" | {len(problems)} problem(s)" + ("".join(f"\n    {p}" for p in problems[:6])))
        bad += label == "trained" and bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit("usage: attention.py CHECKPOINT VAL_PREFIX [PAIRS]")
    sys.exit(main(*sys.argv[1:]))
