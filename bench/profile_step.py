"""Profile one update of xf train with torch.profiler and print the top operators.

    python bench/profile_step.py DATA_DIR [--arch small] [--max-tokens 4096] [--device cpu]
                                 [--precision fp32] [--rows 15]

The update is xf's own ``train.update.train_step`` on xf train's set-up (``train.setup.set_up``), after two
warm-up updates; operators are sorted by self time on the device (CPU time on a CPU). Writes
nothing but a throw-away save directory.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from xformer_cli.base import distributed  # noqa: E402
from xformer_cli.data.batching import collate  # noqa: E402
from xformer_cli.settings.options import TrainOptions  # noqa: E402
from xformer_cli.base.safety import SaveDirLock  # noqa: E402
from xformer_cli.train.setup import set_up  # noqa: E402
from xformer_cli.train.update import train_step  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--arch", default="small")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--rows", type=int, default=15)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as save:
        o = TrainOptions(data=a.data, save_dir=save, arch=a.arch, max_tokens=a.max_tokens, device=a.device,
                         precision=a.precision)
        with SaveDirLock(save) as lock:
            run = set_up(o, distributed.setup(o.device), lock)
        # the batch closest to the median size, so the profile is of a typical update
        batches = run.batches.epoch(1)[0]
        sizes = np.array([len(b) for b in batches])
        typical = batches[int(np.argsort(sizes)[len(sizes) // 2])]

        def step():
            micro = [collate([run.train_set[i] for i in typical])]
            ntokens = sum(b["ntokens"] for b in micro)
            train_step(run.model, run.forward, run.state.optimizer, run.state.scaler, micro, grad_scale=1.0 / ntokens,
                       lr=1e-4, autocast=run.autocast, label_smoothing=o.label_smoothing, clip_norm=o.clip_norm)
            return ntokens

        run.model.train()
        for _ in range(2):
            step()
        cuda = run.env.device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            ntokens = step()
            if cuda:
                torch.cuda.synchronize()
        key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        print(f"one update: {a.arch}, {ntokens} target tokens, {a.device} {a.precision}, "
              f"{torch.get_num_threads()} threads")
        print(prof.key_averages().table(sort_by=key, row_limit=a.rows, max_name_column_width=48))


if __name__ == "__main__":
    main()
