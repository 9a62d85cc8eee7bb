"""Engine overheads, measured (not asserted).

    python benchmarks/bench_engine.py [--gap-runs 10] [--runs 500] [--cpu-seconds 10]

1. gap: on one slot, from one run's end (its summary's ended_at) to the next
   run's first optimizer step (its first train line, log_every = 1): warm fork
   server vs a fresh interpreter. Target <= 50 ms median with the fork server.
2. bookkeeping: N tiny runs through 2 slots; the share of slot time in which
   no worker process existed (launch, reaping, store writes, idle gaps).
   Target <= 5%.
3. cpu: the engine daemon's own CPU (engine + fork server, not the runs) while
   idle and while 2 runs train, as a percentage of one core. Target <= 2%.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

TESTS = str(Path(__file__).resolve().parents[1] / "tests")  # helper_tasks, for the workers too
sys.path.insert(0, TESTS)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)

from gridrun.engine import daemon  # noqa: E402
from gridrun.engine.backends.base import Slot  # noqa: E402
from gridrun.engine.backends.local import LocalBackend  # noqa: E402
from gridrun.engine.scheduler import Engine  # noqa: E402
from gridrun.runs import layout, runlog  # noqa: E402
from gridrun.runs.store import Store  # noqa: E402
from gridrun.spec import TRAINER_KEYS, RunSpec, run_id  # noqa: E402

TINY = {"train_size": 64, "val_size": 32, "hidden": 8, "depth": 1}


def tiny_run(seed: int, experiment: str = "bench", task: str = "spirals", **trainer) -> RunSpec:
    resolved = {k: key.default for k, key in TRAINER_KEYS.items()}
    resolved.update({"epochs": 1, "batch_size": 32, "max_steps": 2, "log_every": 1, **trainer})
    args = dict(TINY)
    if task != "spirals":
        args["step_sleep"] = 0.05
    return RunSpec(run_id(experiment, task, resolved, args, seed), experiment, f"s{seed}", seed,
                   task, resolved, args, {})


class TimedBackend(LocalBackend):
    """Records when each run's process was launched and seen to end."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.spans: dict[str, list[float]] = {}

    def launch(self, run_id, run_dir, slot, *, fresh=False):
        handle = super().launch(run_id, run_dir, slot, fresh=fresh)
        self.spans[run_id] = [time.time()]
        return handle

    def poll(self, timeout):
        events = super().poll(timeout)
        for e in events:
            self.spans[e.handle.run_id].append(time.time())
        return events


def drain(engine: Engine) -> None:
    while not engine.idle():
        engine.step()


def gaps(n: int, forkserver: bool) -> list[float]:
    root = Path(tempfile.mkdtemp(prefix="bench-gap-"))
    runs = [tiny_run(s) for s in range(n)]
    with Store(root) as store:
        store.enqueue(runs)
    backend = LocalBackend(forkserver=forkserver)
    engine = Engine(root, backend, [Slot("cpu0")], tick=0.25)
    engine.start()
    drain(engine)
    backend.close()
    out = []
    for a, b in itertools.pairwise(runs):
        ended = json.loads((layout.run_dir(root, "bench", a.id) / layout.SUMMARY).read_text())["ended_at"]
        first = next(r["t"] for r in runlog.read_all(layout.run_dir(root, "bench", b.id) / layout.METRICS)
                     if r.get("split") == "train")
        out.append(first - ended)
    return out


def bookkeeping(n: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-500-"))
    runs = [tiny_run(s, experiment="many") for s in range(n)]
    with Store(root) as store:
        store.enqueue(runs)
    backend = TimedBackend()
    engine = Engine(root, backend, [Slot("cpu0"), Slot("cpu1")], tick=0.25)
    engine.start()  # the fork server's start is set-up, not per-run bookkeeping
    t0, c0 = time.time(), time.process_time()
    drain(engine)
    wall, cpu = time.time() - t0, time.process_time() - c0
    backend.close()
    busy = sum(s[1] - s[0] for s in backend.spans.values())
    return {"runs": n, "wall_s": wall, "slot_busy_share": busy / (2 * wall),
            "bookkeeping_share": 1 - busy / (2 * wall), "engine_cpu_s": cpu,
            "engine_cpu_per_run_ms": 1000 * cpu / n}


def engine_cpu(seconds: float) -> dict:
    import psutil

    root = Path(tempfile.mkdtemp(prefix="bench-cpu-"))
    st = daemon.start(root)
    proc = psutil.Process(st.pid)
    time.sleep(3)  # let the fork server finish importing torch

    def cpu() -> float:
        procs = [proc] + [c for c in proc.children() if "forkserver" in " ".join(c.cmdline())]
        return sum(p.cpu_times().user + p.cpu_times().system for p in procs)

    a = cpu()
    time.sleep(seconds)
    idle = (cpu() - a) / seconds * 100
    long = [tiny_run(s, experiment="cpu", task="helper_tasks:slow_spirals", max_steps=0,
                     epochs=1000) for s in range(2)]
    with Store(root) as store:
        store.enqueue(long)
        while len(store.list_runs(status="running")) < 2:
            time.sleep(0.1)
    time.sleep(1)
    a = cpu()
    time.sleep(seconds)
    training = (cpu() - a) / seconds * 100
    daemon.stop(root, timeout=60)
    return {"idle_percent_of_a_core": idle, "two_runs_percent_of_a_core": training}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gap-runs", type=int, default=10)
    p.add_argument("--runs", type=int, default=500)
    p.add_argument("--cpu-seconds", type=float, default=10.0)
    args = p.parse_args()
    for forkserver in (True, False):
        g = gaps(args.gap_runs, forkserver)
        print(f"gap ({'fork server' if forkserver else 'fresh interpreter'}): median "
              f"{1000 * statistics.median(g):.0f} ms, min {1000 * min(g):.0f}, max {1000 * max(g):.0f} "
              f"over {len(g)} gaps", flush=True)
    b = bookkeeping(args.runs)
    print(f"{b['runs']} tiny runs on 2 slots: {b['wall_s']:.1f} s; slots busy {100 * b['slot_busy_share']:.1f}%, "
          f"bookkeeping {100 * b['bookkeeping_share']:.1f}% of slot time; engine CPU "
          f"{b['engine_cpu_per_run_ms']:.1f} ms/run", flush=True)
    c = engine_cpu(args.cpu_seconds)
    print(f"engine CPU: idle {c['idle_percent_of_a_core']:.2f}% of a core, "
          f"2 runs training {c['two_runs_percent_of_a_core']:.2f}%", flush=True)


if __name__ == "__main__":
    main()
