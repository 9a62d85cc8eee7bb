"""Reading many small image files against reading them packed (LMDB, HDF5).

The guide's claim: on a large image dataset, reading thousands of small files
is the bottleneck and packing them into LMDB or HDF5 is the trick that
measured most effective. This measures it on this machine, for the `images`
task's data (a folder written by scripts/make_images.py, packed with
`gridrun pack`):

- `read`: the records alone (the bytes and the label), through gridrun's
  training loader (shuffled order, per-batch streams), batch 64;
- `loader`: the `images` task's whole training loader: read, decode (Pillow),
  augment, collate.

at 0, 1 and 2 workers, warm (everything in the page cache) and, with
`--cold` where the page cache can be dropped (root: `echo 3 >
/proc/sys/vm/drop_caches`), cold: the cache dropped before every trial.
Each trial reads for `--seconds` past its first round of batches (the trial
of `num_workers = "auto"`, gridrun/train/loader_probe.py), sources interleaved
trial by trial; the median of `--reps` trials, the packed/per-file ratio, and
the workers' memory (USS and PSS, all workers together) are printed.

    python benchmarks/bench_loader.py [--n 20000] [--data DIR] [--cold] [--reps 3] [--seconds 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from gridrun.data import open_records, pack
from gridrun.data.readers import close_readers
from gridrun.tasks.images import images
from gridrun.train.loader_probe import run_trial

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("files", "lmdb", "hdf5")
CFG = {"batch_size": 64, "pin_memory": False, "prefetch_factor": 2, "persistent_workers": False,
       "accumulate": 1}


def drop_caches() -> bool:
    """Write back and drop the page cache (and dentries and inodes); False where not allowed."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def warm_up(paths: dict[str, Path]) -> None:
    for path in paths.values():
        records = open_records(path)
        for i in range(len(records)):
            records.raw(i)


def dataset(stage: str, path: Path):
    if stage == "read":
        return open_records(path), list, len
    task = images(str(path))
    return task.train_data, None, lambda batch: len(batch[1])


def measure(stage: str, paths: dict[str, Path], workers: int, args, cold: bool) -> dict:
    rates: dict[str, list[float]] = {s: [] for s in SOURCES}
    memory: dict[str, list[int]] = {s: [] for s in SOURCES}
    for _ in range(args.reps):
        for source in SOURCES:
            data, collate, count = dataset(stage, paths[source])
            if cold:
                # pages an open LMDB map still holds are not dropped: close every handle first
                # (the readers reopen on first use, in each process)
                close_readers()
                drop_caches()
            trial = run_trial(data, CFG, {"num_workers": workers, "prefetch_factor": 2,
                                          "pin_memory": False}, seed=0, collate_fn=collate,
                              device=torch.device("cpu"), count=count, seconds=args.seconds)
            if trial.error:
                raise SystemExit(f"{source} {stage} {workers} workers: {trial.error}")
            rates[source].append(trial.samples_per_s or 0.0)
            if trial.workers_uss_bytes:
                memory[source].append(trial.workers_uss_bytes)
    return {s: (statistics.median(rates[s]), statistics.median(memory[s]) if memory[s] else None)
            for s in SOURCES}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, help="a folder of images (default: make one)")
    parser.add_argument("--n", type=int, default=20_000, help="images to make without --data")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--cold", action="store_true", help="also with the page cache dropped")
    parser.add_argument("--stages", nargs="+", default=["read", "loader"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    scratch = Path(tempfile.mkdtemp(prefix="bench-loader-"))
    try:
        folder = args.data
        if folder is None:
            folder = scratch / "images"
            subprocess.run([sys.executable, str(ROOT / "scripts" / "make_images.py"), str(folder),
                            "--n", str(args.n)], check=True)
        paths = {"files": folder}
        for fmt, suffix in (("lmdb", ".lmdb"), ("hdf5", ".h5")):
            done = pack(folder, scratch / f"images{suffix}", format=fmt)
            paths[fmt] = Path(done["out"])
            print(f"packed {done['describe']} into {fmt}: {done['bytes'] / 1e6:.1f} MB of "
                  f"records, file {done['file_bytes'] / 1e6:.1f} MB, {done['seconds']:.1f} s")
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
              f"1 torch thread in the main process, torch {torch.__version__}, load "
              f"{os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d')}")
        modes = ["warm"]
        if args.cold:
            if drop_caches():
                modes.append("cold")
            else:
                print("cold: not measured (the page cache cannot be dropped here: needs root)")
        print(f"{'cache':<5} {'stage':<6} {'workers':>7}  " + "  ".join(
            f"{s + ' /s':>10}" for s in SOURCES) + f"  {'lmdb/files':>10}  {'hdf5/files':>10}  "
            "workers USS (files, lmdb, hdf5)")
        for mode in modes:
            for stage in args.stages:
                for workers in args.workers:
                    if mode == "warm":
                        warm_up(paths)
                    got = measure(stage, paths, workers, args, cold=mode == "cold")
                    files = got["files"][0] or float("nan")
                    uss = ", ".join(f"{m / 2**20:.0f}" if m else "-" for _, m in got.values())
                    print(f"{mode:<5} {stage:<6} {workers:>7}  " + "  ".join(
                        f"{got[s][0]:>10,.0f}" for s in SOURCES)
                        + f"  {got['lmdb'][0] / files:>9.2f}x  {got['hdf5'][0] / files:>9.2f}x"
                        + f"  {uss} MiB", flush=True)
        print(f"load at the end {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
