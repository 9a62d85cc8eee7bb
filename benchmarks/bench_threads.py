"""CPU oversubscription and the default threads, measured (not asserted): the same
queue three ways.

    python benchmarks/bench_threads.py [--repeat 2] [--workers 0 2] [--runs 4]

`--runs 1` measures what the default costs a run alone (one thread, where every
core was the default before issue 44).

The queue: 4 seeds of one `shapes` cell (a small CNN with BatchNorm and seeded
augmentation, where the thread count matters), through the real engine loop and
its warm fork server, on this machine's CPU slots:

  oversubscribed  2 slots, each run on every usable core, every free slot
                  filled: the engine before issue 23
  cores, 1 at once 2 slots, each run on every usable core: the threads cap CPU
                  runs at usable cores / threads (the default before issue 44)
  auto x 2        2 slots, threads "auto": one thread a run, two side by side
                  (the default now)

each with `num_workers` 0 and 2 (DataLoader worker processes, which multiply
the processes competing for the cores). Figures: runs a minute (4 runs over
the queue's wall time, from the first launch to the last end) and training
samples a second (the queue's optimizer-step samples over that wall time), and
the ratio of each against "oversubscribed" measured in the same repetition
(configurations interleaved, repetition by repetition). The first is today's
behaviour, so a ratio above 1 is the new rule winning.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gridrun.engine.backends.base import Slot
from gridrun.engine.backends.local import LocalBackend
from gridrun.engine.scheduler import Engine
from gridrun.runs import layout, runlog, states
from gridrun.runs.store import Store
from gridrun.spec import TRAINER_KEYS, RunSpec, run_id
from gridrun.train.environment import cpu_model
from gridrun.train.threads import usable_cores

TASK_ARGS = {"train_size": 1024, "val_size": 256}
CONFIGS = {  # name: (threads, thread_budget)
    "oversubscribed": (usable_cores(), False),
    "cores, 1 at once": (usable_cores(), True),
    "auto x 2": ("auto", True),
}


def queue(experiment: str, threads: object, workers: int, runs: int = 4) -> list[RunSpec]:
    trainer = {k: key.default for k, key in TRAINER_KEYS.items()}
    trainer.update(epochs=2, batch_size=64, log_every=8, threads=threads, num_workers=workers)
    return [RunSpec(run_id(experiment, "shapes", trainer, TASK_ARGS, seed), experiment, f"s{seed}",
                    seed, "shapes", dict(trainer), dict(TASK_ARGS), {}) for seed in range(runs)]


def measure(root: Path, runs: list[RunSpec], budget: bool, slots: int = 2) -> dict[str, float]:
    """Wall time of the queue through an in-process engine on `slots` CPU slots."""
    backend = LocalBackend(log_path=root / "forkserver.log")
    with Store(root) as store:
        store.enqueue(runs)
        engine = Engine(root, backend, [Slot(f"cpu{i}") for i in range(slots)],
                        thread_budget=budget, tick=0.05)
        engine.start()  # the fork server imports torch here, before the clock starts
        started = time.perf_counter()
        most = 0
        while not engine.idle():
            engine.step()
            most = max(most, len(engine.active))
        wall = time.perf_counter() - started
        backend.close()
        ended = store.list_runs()
    assert all(r.status == states.COMPLETED for r in ended), [(r.id, r.error) for r in ended]
    samples, speeds = 0, []
    for run in runs:
        summary = runlog.read_summary(layout.run_dir(root, run.experiment, run.id) / layout.SUMMARY)
        samples += summary.step * run.trainer["batch_size"]
        speeds.append(summary.samples_per_s or 0.0)
    return {"wall": wall, "runs_per_min": len(runs) / wall * 60, "samples_per_s": samples / wall,
            "run_samples_per_s": statistics.mean(speeds), "at_once": most}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--runs", type=int, default=4, help="runs in the queue")
    args = parser.parse_args()
    cpu = cpu_model() or platform.processor()
    print(f"machine: {platform.node()}, {cpu}, {usable_cores()} usable cores, Python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f} at start")
    results: dict[tuple[int, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-threads-") as tmp:
        for rep in range(args.repeat):
            for workers in args.workers:
                for name, (threads, budget) in CONFIGS.items():
                    root = Path(tmp) / f"r{rep}-w{workers}-{name.replace(' ', '').replace(',', '')}"
                    got = measure(root, queue("bench", threads, workers, args.runs), budget)
                    results.setdefault((workers, name), []).append(got)
                    print(f"  rep {rep} num_workers={workers} {name:<16} {got['wall']:6.1f} s  "
                          f"{got['runs_per_min']:5.2f} runs/min  {got['samples_per_s']:7.0f} "
                          f"samples/s (in-run {got['run_samples_per_s']:.0f}), "
                          f"{got['at_once']} at once", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end\n")
    print("| num_workers | configuration | at once | runs/min | samples/s | vs oversubscribed |")
    print("|---|---|---|---|---|---|")
    for workers in args.workers:
        base = results[(workers, "oversubscribed")]
        for name in CONFIGS:
            got = results[(workers, name)]
            ratios = [g["wall"] and b["wall"] / g["wall"] for g, b in zip(got, base, strict=True)]
            print(f"| {workers} | {name} | {max(g['at_once'] for g in got)} | "
                  f"{statistics.median(g['runs_per_min'] for g in got):.2f} | "
                  f"{statistics.median(g['samples_per_s'] for g in got):,.0f} | "
                  f"{statistics.median(ratios):.2f}x (each repetition: "
                  f"{', '.join(f'{r:.2f}' for r in ratios)}) |")


if __name__ == "__main__":
    sys.exit(main())
