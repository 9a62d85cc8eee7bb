"""What per-batch random streams cost a training step.

gridrun fetches every batch under its own random state (python, NumPy and
torch's CPU generator seeded from (seed, epoch, batch), restored after in the
main process), so a task's augmentation gives the same numbers whatever
`num_workers` is. This times a training step (fetch, forward, backward, AdamW
step) with gridrun's loader against a plain DataLoader over the same data and
order, interleaved repetition by repetition, and reports the median step time
and the ratio. `num_workers = 0`: the stream switch runs in the training
process itself, the worst case.

    python benchmarks/bench_data_streams.py [--reps 7] [--steps 200]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
from torch.utils.data import DataLoader

from gridrun.tasks import resolve
from gridrun.train.data import start_epoch, train_loader

CASES = {
    # name: (task, task args, batch size)
    "spirals": ("spirals", {"hidden": 256, "train_size": 8192, "val_size": 64}, 128),
    "shapes": ("shapes", {"train_size": 2048, "val_size": 64}, 64),
    # a stress case: spirals' cheap __getitem__ (a tensor lookup) with a tiny model
    # and batch, so the fixed per-batch cost is the largest share of a step
    "tiny": ("spirals", {"hidden": 16, "depth": 1, "train_size": 8192, "val_size": 64}, 32),
}
CFG = {"num_workers": 0, "pin_memory": False, "prefetch_factor": 2, "persistent_workers": False}


def step_time(task, loader, steps: int) -> float:
    torch.manual_seed(0)
    model = task.model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    done = 0
    start = time.perf_counter()
    while done < steps:
        for batch in loader:
            loss = task.loss(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            done += 1
            if done == steps:
                break
    return (time.perf_counter() - start) / steps


def fetch_time(loader, batches: int) -> float:
    done = 0
    start = time.perf_counter()
    while done < batches:
        for _ in loader:
            done += 1
            if done == batches:
                break
    return (time.perf_counter() - start) / batches


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)  # steadier timings on a shared machine
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"1 torch thread, torch {torch.__version__}, CPU, load {os.getloadavg()[0]:.1f}")
    print(f"{'task':<8} {'loader':<16} {'median step':>12} {'vs plain':>9}")
    for name, (task_name, task_args, bs) in CASES.items():
        task = resolve(task_name)(**task_args)
        seeded = train_loader(task.train_data, {**CFG, "batch_size": bs}, seed=0,
                              collate_fn=task.collate_fn, cuda=False)
        start_epoch(seeded, 0, 0, 0)
        plain = DataLoader(task.train_data, batch_size=bs, shuffle=True, drop_last=True,
                           collate_fn=task.collate_fn, generator=torch.Generator().manual_seed(0))
        loaders = {"plain": plain, "gridrun streams": seeded}
        step_time(task, plain, 20)  # warm-up
        times: dict[str, list[float]] = {k: [] for k in loaders}
        for rep in range(args.reps):
            order = list(loaders) if rep % 2 == 0 else list(reversed(loaders))
            for key in order:
                times[key].append(step_time(task, loaders[key], args.steps))
        fetch = {k: statistics.median(fetch_time(v, args.steps) for _ in range(args.reps))
                 for k, v in loaders.items()}
        base = statistics.median(times["plain"])
        for key, values in times.items():
            med = statistics.median(values)
            print(f"{name:<8} {key:<16} {med * 1e3:>9.3f} ms {med / base:>9.3f}")
        extra = fetch["gridrun streams"] - fetch["plain"]
        print(f"{'':<8} fetching alone: plain {fetch['plain'] * 1e6:.1f} µs a batch, with streams "
              f"{extra * 1e6:+.1f} µs = {extra / base:.2%} of a plain step")


if __name__ == "__main__":
    main()
