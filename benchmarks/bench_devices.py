"""What one run on several devices costs, on the CPU with gloo (issue 38).

For `spirals` (an MLP) and `shapes` (a CNN with BatchNorm), one cell trained as:
  one device      the plain loop (reduce = "ddp" at devices = 1): the baseline
  invariant x1    reduce = "invariant" on one device: the invariant path's own cost
  ddp x2          DistributedDataParallel on 2 processes
  invariant x2    the invariant sum on 2 processes (an all-gather of every
                  micro-batch's gradient instead of an all-reduce of one)
each with threads = 1 per process and accumulate = 4, through the real worker
(`python -m gridrun.train.worker`), interleaved repetition by repetition. Prints
the median step time (ms, from the train lines; the first interval left out), the
ratio against the one-device loop, throughput and rank 0's peak RSS, and whether
the weights hashes agree (invariant x1 = invariant x2).

    python benchmarks/bench_devices.py [--repeat 3] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gridrun.runs import layout, runlog
from gridrun.spec import TRAINER_KEYS, RunSpec, run_id, write_run_config

MODES = [("one device", 1, "ddp"), ("invariant x1", 1, "invariant"), ("ddp x2", 2, "ddp"),
         ("invariant x2", 2, "invariant")]
TASKS = {"spirals": {"train_size": 4096, "val_size": 256, "hidden": 64, "depth": 2},
         "shapes": {"train_size": 2048, "val_size": 256}}


def cell(task: str, devices: int, reduce: str, steps: int) -> RunSpec:
    trainer = {k: key.default for k, key in TRAINER_KEYS.items()}
    trainer.update(epochs=100, max_steps=steps, batch_size=32, accumulate=4, threads=1,
                   log_every=10, devices=devices, reduce=reduce)
    rid = run_id("bench", task, trainer, TASKS[task], 0)
    return RunSpec(rid, "bench", f"{task} {reduce} x{devices}", 0, task, trainer, TASKS[task], {})


def once(root: Path, run: RunSpec, tag: str) -> dict:
    run_dir = root / tag
    shutil.rmtree(run_dir, ignore_errors=True)
    layout.make_private_dir(run_dir)
    write_run_config(run_dir / layout.CONFIG, run)
    done = subprocess.run([sys.executable, "-m", "gridrun.train.worker", str(run_dir)],
                          capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise SystemExit(f"{tag} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    summary = json.loads((run_dir / layout.SUMMARY).read_text())
    times = [r["step_time"] for r in runlog.read_all(run_dir / layout.METRICS)
             if r.get("split") == "train" and "step_time" in r][1:]
    return {"ms": 1000 * statistics.median(times), "samples_per_s": summary["samples_per_s"],
            "rss": summary["peak_memory_bytes"], "hash": summary["weights_sha256"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--tasks", default="spirals,shapes")
    args = parser.parse_args()
    print(f"{platform.node()} {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.1f}; {args.steps} steps, accumulate 4, batch 32, "
          f"threads 1 per process, median of {args.repeat}")
    modes = MODES
    import torch

    if torch.cuda.is_available():  # runs take the GPU(s): as many devices as there are
        modes = [m for m in MODES if m[1] <= torch.cuda.device_count()]
        print(f"on {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}: "
              f"{', '.join(m[0] for m in modes)}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for task in args.tasks.split(","):
            found: dict[str, list[dict]] = {name: [] for name, *_ in modes}
            for rep in range(args.repeat):  # interleaved: load drifts alike for every mode
                for name, devices, reduce in modes:
                    found[name].append(once(root, cell(task, devices, reduce, args.steps),
                                            f"{task}-{devices}-{reduce}-{rep}"))
            base = statistics.median(r["ms"] for r in found["one device"])
            print(f"\n{task}:")
            print(f"  {'mode':<14} {'ms/step':>8} {'ratio':>6} {'samples/s':>10} {'rank 0 RSS':>11}")
            for name, *_ in modes:
                ms = statistics.median(r["ms"] for r in found[name])
                sps = statistics.median(r["samples_per_s"] for r in found[name])
                rss = statistics.median(r["rss"] for r in found[name]) / 2**20
                print(f"  {name:<14} {ms:8.2f} {ms / base:5.2f}x {sps:10,.0f} {rss:9.0f} MiB")
            same = {r["hash"] for r in found["invariant x1"] + found.get("invariant x2", [])}
            ddp = {r["hash"] for r in found.get("ddp x2", [])}
            print(f"  invariant x1 and x2: {'one weights hash' if len(same) == 1 else 'DIFFERENT hashes'}"
                  f"; ddp x2 repeats: {'one hash' if len(ddp) == 1 else 'DIFFERENT hashes'}")


if __name__ == "__main__":
    main()
