"""Per-run overhead on SLURM against the local fork server, over N tiny runs.

A run's overhead is the time it waits for its first training step after it
could have started: from its launch (the engine's submit) for the first run of
a job, from the end of the previous run of the same job for the others of a
pack. The local baseline: from the launch on a free slot to the first step.
Three ways, the same runs each time (epochs=1 of the tiny spirals):

  local, warm fork server, 2 slots
  slurm, one run per job, max_jobs = 2
  slurm, runs_per_job = 10, max_jobs = 20 (two packs at once)

Needs a cluster: scripts/slurm-cluster.sh start. Usage:
  python benchmarks/bench_slurm.py [--runs 40]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_engine_kit import TINY, make_run

from gridrun.engine.backends import slurm_job
from gridrun.engine.backends.base import Slot
from gridrun.engine.backends.local import LocalBackend
from gridrun.engine.backends.registry import make_backend, slots_for_backend
from gridrun.engine.scheduler import Engine
from gridrun.runs import layout, runlog
from gridrun.runs.store import Store
from gridrun.spec import EngineConfig


def first_step(run_dir: Path) -> float:
    for r in runlog.read_all(run_dir / layout.METRICS):
        if r.get("split") == "train":
            return r["t"]
    raise RuntimeError(f"{run_dir}: no training step")


def measure(root: Path, backend, slots, runs) -> dict:
    with Store(root) as store:
        store.enqueue(runs)
        engine = Engine(root, backend, slots, tick=0.05)
        engine.start()
        t0 = time.time()
        while not engine.idle():
            engine.step()
        wall = time.time() - t0
        done = store.list_runs()
    backend.close()
    assert {r.status for r in done} == {"completed"}, {r.status for r in done}
    waits, in_pack = [], []
    ends: dict[str, list] = {}
    for r in done:
        d = r.run_dir(root)
        status = slurm_job.read(d, slurm_job.STATUS)
        ends.setdefault(status.get("job_id") or r.id, []).append(
            (status.get("started_at") or r.started_at, first_step(d), status.get("ended_at"), r))
    for job in ends.values():
        job.sort(key=lambda x: x[0])
        for i, (_, step, _, r) in enumerate(job):
            if i == 0:
                waits.append(step - r.started_at)  # launch (submit) -> first step
            else:
                in_pack.append(step - job[i - 1][2])  # previous run's end -> first step
    every = waits + in_pack
    return {"wall_s": round(wall, 1), "runs": len(done), "jobs": len(ends),
            "mean_overhead_s": round(statistics.mean(every), 3),
            "median_first_in_job_s": round(statistics.median(waits), 3),
            "median_in_pack_s": round(statistics.median(in_pack), 3) if in_pack else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    n = ap.parse_args().runs
    runs = [make_run(seed=s, epochs=1, task_args=dict(TINY)) for s in range(n)]
    base = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    os.chmod(base, 0o700)
    out = {"machine": f"{platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                      f"load {os.getloadavg()[0]:.1f}"}
    local = LocalBackend(forkserver=True)
    local.start()
    (base / "local").mkdir(mode=0o700)
    out["local fork server, 2 slots"] = measure(base / "local", local, [Slot("cpu0"), Slot("cpu1")], runs)
    for name, cfg in (("slurm, 1 run per job, max_jobs 2", EngineConfig(backend="slurm", max_jobs=2,
                                                                          gpus_per_run=0)),
                      ("slurm, runs_per_job 10, max_jobs 20", EngineConfig(
                          backend="slurm", max_jobs=20, runs_per_job=10, gpus_per_run=0))):
        root = base / name.split(", ", 1)[1].replace(" ", "-").replace(",", "")
        root.mkdir(mode=0o700)
        backend = make_backend(cfg, root, None)
        backend.start()
        out[name] = measure(root, backend, slots_for_backend(backend, cfg), runs)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
