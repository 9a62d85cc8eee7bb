"""Per-run dispatch overhead of the Ray backend beside the local one, over tiny runs.

    python benchmarks/bench_ray.py [--runs 100] [--slots 2]

Each backend gets the same `--runs` tiny spirals runs (one optimizer step,
one small evaluation), `--slots` in flight at a time, driven directly through
the Backend interface (launch, then poll until it ends). Per run:

- latency: launch -> the engine sees it end (poll returns it);
- overhead: latency minus the worker's own wall time (summary.json), i.e.
  what dispatch, process start and reporting the end cost;
- Ray only, to started: launch -> the task's "started" event (Ray scheduling
  plus starting the subprocess, before its interpreter imports anything).

Ray runs on a local cluster (`ray.init(num_cpus=slots, num_gpus=0)`), so
network hops are loopback; a real cluster adds its round trips.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def tiny_runs(n: int):
    from test_engine_kit import make_run

    return [make_run(seed=s, epochs=1, batch_size=64, log_every=1,
                     task_args={"train_size": 72, "val_size": 32, "hidden": 8, "depth": 1})
            for s in range(n)]


def drive(backend, root: Path, runs, slots: int) -> dict:
    from gridrun.engine.backends.base import Slot
    from gridrun.runs import layout
    from gridrun.spec import write_run_config

    pending, launched, results = list(runs), {}, []
    free = [Slot(f"s{i}") for i in range(slots)]
    t0 = time.perf_counter()
    while pending or launched:
        while pending and free:
            run = pending.pop(0)
            run_dir = layout.make_private_dir(layout.run_dir(root, run.experiment, run.id))
            write_run_config(run_dir / layout.CONFIG, run)
            slot = free.pop()
            handle = backend.launch(run.id, run_dir, slot)
            launched[run.id] = (time.perf_counter(), slot, handle)
        for event in backend.poll(0.5):
            start, slot, handle = launched.pop(event.handle.run_id)
            latency = time.perf_counter() - start
            free.append(slot)
            summary = json.loads((event.handle.run_dir / layout.SUMMARY).read_text())
            started = getattr(handle.extra, "started_after", None)
            results.append({"code": event.code, "latency": latency,
                            "overhead": latency - summary["wall_time_s"], "to_started": started})
    total = time.perf_counter() - t0
    assert all(r["code"] == 0 for r in results), [r["code"] for r in results]
    out = {"runs": len(results), "total_s": round(total, 2),
           "median_latency_s": round(statistics.median(r["latency"] for r in results), 4),
           "median_overhead_s": round(statistics.median(r["overhead"] for r in results), 4),
           "total_overhead_s": round(sum(r["overhead"] for r in results), 2)}
    if any(r["to_started"] is not None for r in results):
        out["median_to_started_s"] = round(statistics.median(
            r["to_started"] for r in results if r["to_started"] is not None), 4)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--slots", type=int, default=2)
    args = p.parse_args()
    runs = tiny_runs(args.runs)
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        from gridrun.engine.backends.local import LocalBackend

        for name, forkserver in (("local-forkserver", True), ("local-fresh", False)):
            backend = LocalBackend(forkserver=forkserver, log_path=Path(tmp) / f"{name}.log")
            backend.start()
            try:
                report[name] = drive(backend, Path(tmp) / name, runs, args.slots)
            finally:
                backend.close()
            print(name, report[name], flush=True)

        import ray

        from gridrun.engine.backends.ray import RayBackend

        t = time.perf_counter()
        ray.init(num_cpus=args.slots, num_gpus=0, include_dashboard=False,
                 object_store_memory=80 * 1024**2, log_to_driver=False)
        try:
            backend = RayBackend(Path(tmp) / "ray")
            backend.start()
            report["ray_start_s"] = round(time.perf_counter() - t, 2)
            report["ray"] = drive(backend, Path(tmp) / "ray", runs, args.slots)
            print("ray", report["ray"], flush=True)
            backend.close()
        finally:
            ray.shutdown()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
