"""The loader probe's budget (num_workers = "auto"): how far past it the probe ends.

    python benchmarks/bench_loader_probe.py [--repeat 5] [--budgets 0.5 0.8 1.6]

The probe (gridrun/train/loader_probe.py) times loader settings for a budget of wall
seconds and starts no trial once less than MIN_TRIAL_S of it is left; a trial ends at
its first batch past its share, then shuts its workers down. So it ends past its
budget by about one batch and one shut-down. This measures that overshoot on data of
16 x 4 ms a batch (tests/test_loader_probe.py's), against a baseline taken in the same
run: one batch read with 0 workers. tests/ asserted "under the budget + 0.4 s" until a
busy machine went past it (issue 44): a time is measured here, with the load average
beside it, and never asserted in tests/.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helper_tasks import SlowData, augmented, mix_collate

from gridrun.train import loader_probe
from gridrun.train.data import train_loader

CFG = {"batch_size": 16, "num_workers": "auto", "pin_memory": "auto", "prefetch_factor": 2,
       "persistent_workers": False, "accumulate": 1}
CPU = torch.device("cpu")


def one_batch_s(data: SlowData, repeat: int) -> float:
    """The baseline: one batch of the same data read in this process (0 workers)."""
    loader = train_loader(data, {**CFG, "num_workers": 0, "pin_memory": False}, seed=0,
                          collate_fn=mix_collate, cuda=False)
    times = []
    for _ in range(repeat):
        it = iter(loader)
        start = time.perf_counter()
        next(it)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.5, 0.8, 1.6])
    args = parser.parse_args()
    data = SlowData(augmented(train_size=512).train_data, 0.004)
    print(f"# {platform.node()} {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
          f"torch {torch.__version__}, load average {os.getloadavg()[0]:.1f}")
    batch = one_batch_s(data, args.repeat)
    print(f"baseline: one batch with 0 workers {batch * 1e3:.1f} ms (median of {args.repeat})")
    for budget in args.budgets:
        over, trials = [], []
        for _ in range(args.repeat):
            record = loader_probe.probe(data, CFG, seed=0, collate_fn=mix_collate, device=CPU,
                                        total_samples=10**6, budget_s=budget)
            over.append(record["spent_s"] - budget)
            trials.append(len(record["trials"]))
        worst = max(over)
        print(f"budget {budget:4.1f} s: past it by {statistics.median(over) * 1e3:6.0f} ms median "
              f"= {statistics.median(over) / batch:4.1f} batches, worst {worst * 1e3:6.0f} ms "
              f"= {worst / batch:4.1f} batches; {statistics.median(trials):g} trials")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
