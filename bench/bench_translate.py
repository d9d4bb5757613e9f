"""xf translate speed on CPU: Multi30k test2016 with a `small` model, batch 64.

Sentences and target subwords per second for beam 4 and beam 1 (sentencepiece, sorting and
search, as ``xf translate`` runs them, model loading excluded), peak memory of each run (a fresh
process each), and the speed-up of the key/value cache over the same search decoding the whole
prefix at every step. Reference (issue 5): on a 2-core CPU, beam 4, batch 64, fairseq-generate
translates about 70 sentences/s and CTranslate2 about 135.

XF_BENCH_CHECKPOINT=PATH uses a trained checkpoint (its BLEU against XF_BENCH_REFERENCE, default
test2016.de, is reported too). Without it, a randomly initialised `small` model with an
8000-subword sentencepiece model learned on Multi30k stands in; it never chooses eos, so its
outputs are capped at the source length (max_len_a 1, max_len_b 0), about the length of real
translations. XF_BENCH_SOURCE changes the input (default test2016.en); XF_BENCH_SENTENCES=N uses
the first N lines only (a quick check that the bench runs); XF_BENCH_THREADS=N sets torch's
threads (on a machine shared with other jobs, 1 thread can beat 2: see the README).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MULTI30K = Path(os.environ.get("MULTI30K_DIR", REPO.parent / "shared" / "data" / "multi30k"))
SOURCE = Path(os.environ.get("XF_BENCH_SOURCE", MULTI30K / "test2016.en"))
REFERENCE = Path(os.environ.get("XF_BENCH_REFERENCE", MULTI30K / "test2016.de"))
CHECKPOINT = os.environ.get("XF_BENCH_CHECKPOINT")
SENTENCES = int(os.environ.get("XF_BENCH_SENTENCES", "1000"))
NO_CACHE_SENTENCES = 200  # the prefix-recomputing loop is slow: compared on the first 200 lines
BATCH = 64
THREADS = int(os.environ.get("XF_BENCH_THREADS", "0"))  # 0: torch's default (one per core)


def random_checkpoint(directory: Path) -> str:
    """A random `small` model and an 8000-subword joint sentencepiece model learned on Multi30k."""
    import sentencepiece as spm
    import torch

    from xformer_cli.checkpoint import make_checkpoint, save_checkpoint
    from xformer_cli.model import build_model

    lines = []
    for lang in ("en", "de"):
        lines += (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines()
    model_bytes = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model_bytes, vocab_size=8000, model_type="bpe",
        character_coverage=1.0, pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2,
    )
    torch.manual_seed(0)
    path = directory / "small-random.pt"
    save_checkpoint(path, make_checkpoint(build_model("small", vocab_size=8000), model_bytes.getvalue()))
    return str(path)


def run_case(checkpoint: str, lines: list[str], beam: int, mode: str, trained: bool) -> dict:
    """Translate ``lines`` and time it. mode "translate": as xf translate does (sentencepiece,
    sorting, search); "cached" / "full-prefix": the beam search alone, with the key/value cache or
    decoding the whole prefix at every step."""
    import torch

    from xformer_cli.options import TranslateOptions
    from xformer_cli.search import beam_search
    from xformer_cli.train import peak_memory_mib
    from xformer_cli.data import batch_by_size, collate_source
    from xformer_cli.translate import Stats, load_ensemble, translate_buffer

    if THREADS:
        torch.set_num_threads(THREADS)
    cpu = torch.device("cpu")
    models, sp = load_ensemble([checkpoint], cpu)
    limits = {} if trained else dict(max_len_a=1.0, max_len_b=0)
    options = TranslateOptions(path=(checkpoint,), beam=beam, batch_size=BATCH, **limits)
    if mode == "translate":
        translate_buffer(models, sp, lines[:BATCH], 0, options, Stats(), cpu)  # warm-up
        stats = Stats()
        start = time.perf_counter()
        outputs = [o.rstrip("\n") for o in translate_buffer(models, sp, lines, 0, options, stats, cpu)]
        seconds, tokens = time.perf_counter() - start, stats.tgt_tokens
    else:
        pieces = sp.encode(lines, out_type=int)
        batches = [b.tolist() for b in batch_by_size([len(p) for p in pieces], max_sentences=BATCH, longest_first=True)]
        outputs, tokens = [""] * len(lines), 0
        start = time.perf_counter()
        for batch in batches:
            hyps = beam_search(models, collate_source([pieces[i] for i in batch]), beam_size=beam,
                               max_len_a=options.max_len_a, max_len_b=options.max_len_b,
                               use_cache=mode == "cached")
            for i, h in zip(batch, hyps):
                outputs[i], tokens = sp.decode(h[0].tokens[:-1]), tokens + len(h[0].tokens)
        seconds = time.perf_counter() - start
    peak = peak_memory_mib(cpu)  # VmHWM: ru_maxrss would include the parent's peak (exec keeps it)
    return dict(seconds=seconds, tokens=tokens, peak=peak, outputs=outputs, threads=torch.get_num_threads())


def measure(checkpoint: str, lines: list[str], beam: int, mode: str, trained: bool) -> dict:
    """run_case in a fresh process, so that its peak memory is its own."""
    args = json.dumps(dict(checkpoint=checkpoint, lines=lines, beam=beam, mode=mode, trained=trained))
    proc = subprocess.run([sys.executable, __file__, "--case"], input=args, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"bench_translate case failed:\n{proc.stderr}")
    return json.loads(proc.stdout.splitlines()[-1])


def rows() -> list[dict]:
    lines = SOURCE.read_text(encoding="utf-8").splitlines()[:SENTENCES]
    with tempfile.TemporaryDirectory() as tmp:
        trained = CHECKPOINT is not None
        checkpoint = CHECKPOINT or random_checkpoint(Path(tmp))
        which = f"trained {Path(checkpoint).name}" if trained else "random small model, outputs = source length"
        case = f"{SOURCE.name} {len(lines)} lines, batch {BATCH}"
        out = []
        for beam in (4, 1):
            r = measure(checkpoint, lines, beam, "translate", trained)
            seconds, tokens, peak, hyps, threads = r["seconds"], r["tokens"], r["peak"], r["outputs"], r["threads"]
            note = f"{which}; {threads} thread{'s' if threads > 1 else ''}"
            if trained and REFERENCE.exists() and beam == 4:
                import sacrebleu

                refs = REFERENCE.read_text(encoding="utf-8").splitlines()[: len(lines)]
                note += f"; BLEU {sacrebleu.corpus_bleu(hyps, [refs]).score:.2f}"
            if beam == 4:
                note += "; fairseq ~70, CTranslate2 ~135 sent/s"
            mode = f"beam {beam}" if beam > 1 else "greedy"
            out += [
                dict(bench="translate", case=f"{mode}, {case}", metric="sentences/s", value=len(lines) / seconds,
                     unit="sent/s", ratio=(len(lines) / seconds) / 135 if beam == 4 else None,
                     note=note + ("; ratio vs CTranslate2's 135" if beam == 4 else "")),
                dict(bench="translate", case=f"{mode}, {case}", metric="target subwords/s", value=tokens / seconds,
                     unit="tok/s", note="eos included"),
                dict(bench="translate", case=f"{mode}, {case}", metric="peak memory", value=peak, unit="MiB",
                     note="peak RSS of the process (torch included)"),
            ]
        subset = lines[:NO_CACHE_SENTENCES]
        cached = measure(checkpoint, subset, 4, "cached", trained)
        full = measure(checkpoint, subset, 4, "full-prefix", trained)
        same = sum(a == b for a, b in zip(cached["outputs"], full["outputs"]))
        cached, full = cached["seconds"], full["seconds"]
        out.append(dict(bench="translate", case=f"beam 4, first {len(subset)} lines, batch {BATCH}",
                        metric="speed-up of the cache", value=full / cached, unit="x", ratio=full / cached,
                        note=f"{len(subset) / full:.1f} sent/s recomputing the prefix vs {len(subset) / cached:.1f} "
                             f"with the cache; {same}/{len(subset)} outputs identical"))
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["--case"]:
        print(json.dumps(run_case(**json.loads(sys.stdin.read()))))
    else:
        for row in rows():
            print(row)
