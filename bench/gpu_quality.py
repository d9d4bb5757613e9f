"""bench/gpu.sh's last stage: the first xf BLEU from a GPU, in a fixed few minutes.

Trains ``base`` on Multi30k EN-DE (bench/gpu-data, filled by bench/gpu_data.py) at the paper's
batch size (--max-tokens 25000) for XF_QUALITY_SECONDS (120) of training, with xf train's own
set-up, Prefetch and train_step, in bf16. It is not ``xf train`` itself because of its saving:
xf train writes a numbered checkpoint and checkpoint_last.pt at every epoch end, and an epoch of
Multi30k at 25k tokens is some 15 updates, a second or two on an H200 (about 1.5 GB written per
epoch). Here validation loss is measured every XF_QUALITY_VALIDATE (100) updates and at the end,
the best weights are kept in device memory, and one model-only checkpoint (no optimizer) is
written at the end, to /dev/shm where it has room (else the temporary directory). Before any
training, the imports the translating and scoring need are checked. Then the real CLIs: ``xf translate`` of
test2016 with beam 4 (length penalty 0.6, the paper's) and ``xf score`` (sacreBLEU).

The schedule is not the paper's: noam with 4,000 warmup updates would never leave its warmup in
the ~1,000-3,000 updates that fit; inverse_sqrt with lr 1e-3 and 200 warmup updates instead,
dropout 0.3 (29k pairs for a 60M-parameter model), untuned (no GPU was at hand to tune on).

Environment: XF_GPU_DATA (bench/gpu-data), XF_QUALITY_SECONDS, XF_QUALITY_VALIDATE,
XF_BENCH_DEADLINE (stop training early enough to translate and score by then),
XF_BENCH_DRY_RUN=1 (tiny, CPU, --max-tokens 2000, 10 s, outputs of at most 8 subwords:
an untrained model's run to the length limit). ``python bench/gpu_quality.py OUT.json``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402

from bench_train import sync, write_json  # noqa: E402

ENV = os.environ.get
DRY = ENV("XF_BENCH_DRY_RUN") == "1"
DATA = Path(ENV("XF_GPU_DATA", REPO / "bench" / "gpu-data"))
SECONDS = float(ENV("XF_QUALITY_SECONDS", "10" if DRY else "120"))
VALIDATE = int(ENV("XF_QUALITY_VALIDATE", "20" if DRY else "100"))
DEADLINE = float(ENV("XF_BENCH_DEADLINE", "inf"))
AFTER_TRAINING = 15.0 if DRY else 40.0  # seconds kept for the checkpoint, translating and scoring
ARCH, DEVICE, MAX_TOKENS = ("tiny", "cpu", 2000) if DRY else ("base", "cuda", 25000)


# What translating and scoring import, checked before the 120 s of training they would follow.
AFTER_TRAINING_IMPORTS = ("xformer_cli.cli", "xformer_cli.commands.translate", "xformer_cli.commands.score",
                          "sacrebleu", "sentencepiece", "typer", "yaml", "rich")


def preflight_imports() -> None:
    """Fail in one line, before training, when a module that ``xf translate`` or ``xf score``
    needs cannot be imported by the interpreter they run under."""
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)"
    done = subprocess.run([sys.executable, "-c", code, *AFTER_TRAINING_IMPORTS], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["exit code %d" % done.returncode])[-1]
        raise SystemExit(f"gpu_quality: the translate and score steps could not run ({last}); nothing trained")


def checkpoint_dir(needed_bytes: int, candidates: tuple[str, ...] = ("/dev/shm", tempfile.gettempdir())) -> Path:
    """The first of ``candidates`` (memory first) with room for ``needed_bytes`` and a margin of
    a quarter: /dev/shm is small on some machines (64 MiB in a default container) and a write
    that fills it dies mid-file after the training it saves."""
    import shutil

    for where in candidates:
        path = Path(where)
        if path.is_dir() and os.access(path, os.W_OK) and shutil.disk_usage(path).free >= needed_bytes * 1.25:
            return Path(tempfile.mkdtemp(prefix="xf-quality-", dir=path))
    raise SystemExit(f"gpu_quality: no room for the {needed_bytes / 2**20:.0f} MiB checkpoint in "
                     f"{' or '.join(candidates)}")


def train(save_dir: Path, emit) -> Path:
    from xformer_cli.base import distributed
    from xformer_cli.model.checkpoint import make_checkpoint, save_checkpoint
    from xformer_cli.data.batching import Prefetch
    from xformer_cli.train.setup import set_up
    from xformer_cli.settings.options import TrainOptions
    from xformer_cli.base.safety import SaveDirLock
    from xformer_cli.train.update import train_step
    from xformer_cli.train.validate import validation_loss

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    o = TrainOptions(data=str(DATA / "m30k-ende"), save_dir=str(save_dir), arch=ARCH, max_tokens=MAX_TOKENS,
                     device=DEVICE, precision="bf16" if DEVICE == "cuda" else "fp32", dropout=0.3,
                     lr_scheduler="inverse_sqrt", lr=1e-3, warmup_updates=200, seed=1)
    env = distributed.setup(o.device)
    with SaveDirLock(save_dir) as lock:
        run = set_up(o, env, lock)
    where = checkpoint_dir(checkpoint_bytes(run.model))  # before training: its room is known now
    prefetch = Prefetch(run.batches, background=env.device.type == "cuda")
    seconds = min(SECONDS, DEADLINE - time.time() - AFTER_TRAINING)
    best, best_at, best_state, valid = float("inf"), 0, None, {}
    epoch, offset, updates, tgt, validating = 1, 0, 0, 0, 0.0
    sync(env.device)
    start = time.perf_counter()
    while True:
        out_of_time = time.perf_counter() - start >= seconds or bool(stop)
        if updates and (updates % VALIDATE == 0 or out_of_time):
            t = time.perf_counter()
            valid = validation_loss(run.model, run.valid_set, run.valid_batches, env, run.autocast, o.label_smoothing)
            if valid["loss"] < best:  # the best weights, kept on the device
                best, best_at = valid["loss"], updates
                best_state = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
            validating += time.perf_counter() - t
        if out_of_time:
            break
        micro = prefetch.take(epoch, offset)
        ntokens = sum(b["ntokens"] for b in micro)
        train_step(run.model, run.forward, run.state.optimizer, run.state.scaler, micro, grad_scale=1.0 / ntokens,
                   lr=run.learning_rate(updates + 1), autocast=run.autocast, label_smoothing=o.label_smoothing,
                   clip_norm=o.clip_norm)
        updates, tgt = updates + 1, tgt + ntokens
        epoch, offset = run.batches.next_update(epoch, offset)
    sync(env.device)
    elapsed = time.perf_counter() - start
    prefetch.close()
    training = elapsed - validating
    case = f"{ARCH} m30k en-de max_tokens {MAX_TOKENS:,} {DEVICE} {o.precision}, {elapsed:.0f} s"
    how = (f"{updates:,} updates, {epoch - 1 + offset / run.batches.num_batches(epoch):.1f} epochs, "
           f"{'stopped by SIGTERM' if stop else 'stopped by time'}; validation took {validating:.1f} s, not in the speeds")
    emit(dict(bench="quality", case=case, metric="updates/s", value=updates / training, unit="upd/s", note=how))
    emit(dict(bench="quality", case=case, metric="target tokens/s", value=tgt / training, unit="tok/s", note=how))
    emit(dict(bench="quality", case=case, metric="best validation loss", value=best, unit="nats",
              note=f"at update {best_at:,} (every {VALIDATE} updates and at the end); its weights are translated"))
    run.model.load_state_dict(best_state)
    path = where / "checkpoint_best.pt"
    save_checkpoint(path, make_checkpoint(run.model, run.data.spm_model_bytes, None,
                                          {"num_updates": best_at, "source_lang": "en", "target_lang": "de"}))
    return path


def checkpoint_bytes(model) -> int:
    """What the model-only checkpoint takes (its tensors; the vocabulary and metadata are small)."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    preflight_imports()
    rows: list[dict] = []

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        write_json(out, {"torch": torch.__version__, "rows": rows})

    with tempfile.TemporaryDirectory(prefix="xf-quality-") as tmp:
        ckpt = train(Path(tmp) / "save", emit)
        try:
            hyp = Path(tmp) / "test2016.hyp.de"
            cli = [sys.executable, "-m", "xformer_cli"]
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            start = time.perf_counter()
            subprocess.run([*cli, "translate", "--path", str(ckpt), "--input", str(DATA / "test2016.en"), "--output", str(hyp),
                            "--beam-size", "4", "--batch-size", "128", "--device", DEVICE,
                            *(["--max-len-a", "0", "--max-len-b", "8"] if DRY else [])],  # an untrained model's
                           check=True, env=env,
                           stdout=subprocess.DEVNULL)
            lines = len(hyp.read_text(encoding="utf-8").splitlines())
            seconds = time.perf_counter() - start
            scored = subprocess.run([*cli, "score", "--ref", str(DATA / "test2016.de"), "--hyp", str(hyp), "--json",
                                     "--metrics", "bleu,chrf"], check=True, env=env, capture_output=True, text=True)
            scores = json.loads(scored.stdout)
            case = f"{ARCH} m30k en-de test2016 ({lines:,} lines), beam 4, lenpen 0.6"
            emit(dict(bench="quality", case=case, metric="sacreBLEU", value=scores["bleu"]["score"], unit="BLEU",
                      note=scores["bleu"]["signature"]))
            emit(dict(bench="quality", case=case, metric="chrF", value=scores["chrf"]["score"], unit="chrF",
                      note=scores["chrf"]["signature"]))
            emit(dict(bench="quality", case=case, metric="xf translate", value=lines / seconds, unit="sent/s",
                      note=f"the whole CLI ({seconds:.1f} s: start-up, loading, beam 4 search, writing)"))
        finally:
            ckpt.unlink(missing_ok=True)
            ckpt.parent.rmdir()


if __name__ == "__main__":
    main(sys.argv[1:])
