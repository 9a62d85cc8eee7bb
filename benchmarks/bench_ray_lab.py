"""Tiny runs per minute through the whole Engine, Ray against local, and what placing costs.

    python benchmarks/bench_ray_lab.py [--runs 40] [--slots 4] [--nodes 2] [--repeat 1]

The same queue of `--runs` tiny spirals runs (bench_ray.tiny_runs: one epoch, one
optimizer step) goes through a whole Engine in each mode per repetition, on the same machine,
each time into a fresh runs root (a Store): enqueue, `Engine.start()`, step until idle
(as tests/test_engine_kit.drain), every run checked completed.

- local: the local backend with its warm fork server, `--slots` stand-in GPUs seen
  in-process through tests/standin_nvml (GRIDRUN_FAKE_GPUS=1: the runs train on the
  CPU), the machine's ledger in a folder of its own; the engine's own telemetry.
- fresh: the same without the fork server (each run a fresh interpreter, as each run
  on a Ray node is): what Ray adds beyond that (`--no-fresh` leaves it out).
- ray: a Ray cluster of `--nodes` nodes started here (ray.cluster_utils, as
  tests/ray_lab.py), the same `--slots` stand-in GPUs spread over them, each node with
  its own NVML and ledger folder; the engine adopts the backend's telemetry and ledger
  (an agent actor per node), and each run is a Ray task pinned to its slot's node.

Per mode it prints runs per minute (over the drain, after `start`), `start` itself, and
the engine's time in `launch_ready` per run started, split into: `backend.launch`,
the processes sample (`sample_processes`: the GPUs' processes, every 5 s), the ledger
(`sharing.placing`: lock + others + rooms, entered and left; `reserve`: write), and the
rest (the store's transitions, the run's folder and config, the plan); and the same
over the steps that started runs only. Outside it: `sharing.publish` after each poll
(on Ray one round trip per node even when nothing changed: `intact`) and the telemetry
sample (every second). Per run (medians): launch to started (Ray: the task's "started"
event, `_Task.started_after`; local: `backend.launch`, which returns with the process
there), launch to the trainer's start and its end to the engine seeing it (the
summary's started_at, ended_at), and launch to the end seen less the run's own
wall_time_s. A warm-up queue goes through each mode first. The cluster is started
once, before the first repetition, and stopped (with every engine) even on error,
Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
STANDIN = HERE.parent / "tests" / "standin_nvml"
sys.path.insert(0, str(STANDIN))  # `import pynvml` here is the stand-in (local mode)

GIB = 1 << 30


def nvml_state(path: Path, name: str, gpus: int) -> None:
    """A stand-in NVML's file (tests/standin_nvml): `gpus` idle 80 GiB GPUs."""
    path.write_text(json.dumps({"gpus": [{"uuid": f"GPU-{name}-{i}", "total": 80 * GIB}
                                         for i in range(gpus)], "procs": {}}))


# ---- the timers ---------------------------------------------------------------------


class Timed:
    """Seconds spent in each wrapped call, split by whether `launch_ready` was running."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.placing = False
        self.launched: dict[str, tuple[float, float]] = {}  # run id -> (epoch at, seconds)
        self.ended: dict[str, tuple[float, float | None, Path]] = {}  # -> (at, started_after, dir)

    def add(self, name: str, seconds: float) -> None:
        key = f"{name}{'' if self.placing or name.startswith('launch_ready') else ' (outside)'}"
        self.spent[key] += seconds
        self.calls[key] += 1

    def wrap(self, obj, attr: str, name: str | None = None) -> None:
        inner = getattr(obj, attr)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                self.add(name or attr, time.perf_counter() - t)
        setattr(obj, attr, timed)

    def wrap_cm(self, obj, attr: str, name: str) -> None:
        """A context manager's enter and exit, not its body."""
        inner = getattr(obj, attr)

        @contextlib.contextmanager
        def timed(*a, **k):
            t = time.perf_counter()
            with contextlib.ExitStack() as stack:
                value = stack.enter_context(inner(*a, **k))
                self.add(name, time.perf_counter() - t)
                try:
                    yield value
                finally:
                    t = time.perf_counter()
                    stack.close()
                    self.add(name, time.perf_counter() - t)
        setattr(obj, attr, timed)

    def attach(self, engine) -> None:
        """After `start`: the engine's sharing and telemetry are the ones it places with."""
        inner_ready, backend = engine.launch_ready, engine.backend

        def launch_ready():
            self.placing, before = True, len(self.launched)
            t = time.perf_counter()
            try:
                return inner_ready()
            finally:
                self.placing = False
                self.add("launch_ready", time.perf_counter() - t)
                if len(self.launched) > before:  # a step that started runs
                    self.add("launch_ready, starting", time.perf_counter() - t)
        engine.launch_ready = launch_ready
        inner_launch, inner_poll = backend.launch, backend.poll

        def launch(run_id, run_dir, slot, *, fresh=False):
            at, t = time.time(), time.perf_counter()
            handle = inner_launch(run_id, run_dir, slot, fresh=fresh)
            self.launched[run_id] = (at, time.perf_counter() - t)
            self.add("backend.launch", self.launched[run_id][1])
            return handle

        def poll(timeout):
            ended = inner_poll(timeout)
            now = time.time()  # the summary's clock
            for e in ended:
                self.ended[e.handle.run_id] = (
                    now, getattr(e.handle.extra, "started_after", None), e.handle.run_dir)
            return ended
        backend.launch, backend.poll = launch, poll
        self.wrap(engine, "sample_processes", "processes sample")
        self.wrap(engine, "sample_telemetry", "telemetry sample")
        if engine.sharing is not None:
            self.wrap_cm(engine.sharing, "placing", "ledger: lock, read")
            self.wrap(engine.sharing, "reserve", "ledger: write")
            self.wrap(engine.sharing, "publish", "ledger: publish")


# ---- one mode -------------------------------------------------------------------------


def drain(engine, timeout: float) -> int:
    """Step until nothing is queued or running; the number of steps."""
    deadline, steps = time.monotonic() + timeout, 0
    while not engine.idle():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the queue did not drain in {timeout:.0f} s")
        engine.step()
        steps += 1
    return steps


def one(mode: str, root: Path, runs, slots: int) -> dict:
    from gridrun.engine.backends.base import Slot
    from gridrun.engine.scheduler import Engine
    from gridrun.engine.telemetry import Telemetry
    from gridrun.runs import layout, states
    from gridrun.runs.store import Store

    root.mkdir(parents=True)
    store = Store(root)
    store.enqueue(runs)
    if mode in ("local", "fresh"):
        from gridrun.engine.backends.local import LocalBackend

        backend = LocalBackend(forkserver=mode == "local", log_path=root / "engine.log")
        engine = Engine(root, backend, [Slot(f"gpu{i}", i) for i in range(slots)],
                        store=store, telemetry=Telemetry())
    else:
        from gridrun.engine.backends.ray import RayBackend

        backend = RayBackend(root, log_path=root / "engine.log")
        engine = Engine(root, backend, backend.slots(), store=store)
    timed = Timed()
    try:
        t = time.perf_counter()
        engine.start()
        start_s = time.perf_counter() - t
        assert len(engine.slots) == slots, [s.name for s in engine.slots]
        assert engine.sharing is not None, "no GPU placement: the stand-in GPUs were not seen"
        timed.attach(engine)
        t = time.perf_counter()
        steps = drain(engine, timeout=1800)
        drain_s = time.perf_counter() - t
        rows = store.list_runs()
    finally:
        with contextlib.suppress(Exception):
            engine.sharing.close() if engine.sharing else None
        backend.close()
        store.close()
    bad = [(r.id, r.status) for r in rows if r.status != states.COMPLETED]
    assert not bad and len(rows) == len(runs), bad
    started = len(timed.launched)
    overheads, to_started, to_trainer, to_seen = [], [], [], []
    for run_id, (at, launch_s) in timed.launched.items():
        end, after, run_dir = timed.ended[run_id]
        summary = json.loads((run_dir / layout.SUMMARY).read_text())
        overheads.append(end - at - summary["wall_time_s"])
        to_started.append(after if after is not None else launch_s)
        to_trainer.append(summary["started_at"] - at)
        to_seen.append(end - summary["ended_at"])
    return {"mode": mode, "runs": len(rows), "started": started, "steps": steps,
            "start_s": start_s, "drain_s": drain_s, "runs_per_min": 60 * len(rows) / drain_s,
            "spent": dict(timed.spent), "calls": dict(timed.calls),
            "to_started_ms": 1000 * statistics.median(to_started),
            "to_trainer_s": statistics.median(to_trainer),
            "to_seen_s": statistics.median(to_seen),
            "overhead_s": statistics.median(overheads)}


# ---- the cluster ----------------------------------------------------------------------


def start_cluster(folder: Path, nodes: int, gpus: int):
    """`nodes` Ray nodes here, `gpus` stand-in GPUs spread over them; this process the
    driver. Returns the cluster (stop_cluster stops it, also half started)."""
    import ray
    from ray.cluster_utils import Cluster
    from ray_lab import Node

    per = [gpus // nodes + (i < gpus % nodes) for i in range(nodes)]
    cluster = None
    try:
        for i, n in enumerate(per):
            node = Node(f"node{i + 1}", folder / f"node{i + 1}.nvml.json",
                        folder / f"node{i + 1}.ledger")
            node.ledger.mkdir(mode=0o1777)
            nvml_state(node.nvml, node.name, n)
            args = {"num_cpus": max(n, 1), "num_gpus": n, "object_store_memory": 80 * 1024**2,
                    "env_vars": node.env()}
            if cluster is None:
                cluster = Cluster(initialize_head=True, connect=False,
                                  head_node_args={**args, "include_dashboard": False})
            else:
                cluster.add_node(**args)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def stop_cluster(cluster) -> None:
    import ray

    with contextlib.suppress(Exception):
        ray.shutdown()
    if cluster is not None:
        cluster.shutdown()


# ---- the report -----------------------------------------------------------------------

PARTS = ("backend.launch", "processes sample", "ledger: lock, read", "ledger: write",
         "ledger: publish")
OUTSIDE = ("ledger: publish (outside)", "telemetry sample (outside)")


def per_run(r: dict, key: str) -> float:
    return 1000 * r["spent"].get(key, 0.0) / max(1, r["started"])


def per_call(r: dict, key: str) -> float:
    return 1000 * r["spent"].get(key, 0.0) / max(1, r["calls"].get(key, 0))


def rest(r: dict) -> float:
    return per_run(r, "launch_ready") - sum(per_run(r, p) for p in PARTS)


ROWS = [  # (name, the figure of one mode's result, format)
    ("runs per minute (drain)", lambda r: r["runs_per_min"], "{:,.1f}"),
    ("drain s", lambda r: r["drain_s"], "{:.1f}"),
    ("Engine.start s", lambda r: r["start_s"], "{:.2f}"),
    ("launch_ready ms/step", lambda r: per_call(r, "launch_ready"), "{:.2f}"),
    ("launch_ready ms/run", lambda r: per_run(r, "launch_ready"), "{:.1f}"),
    *((f"  {p} ms/run", lambda r, p=p: per_run(r, p), "{:.1f}") for p in PARTS),
    ("  rest (store, folder, plan) ms/run", rest, "{:.1f}"),
    ("launch_ready, steps that start, ms/run", lambda r: per_run(r, "launch_ready, starting"),
     "{:.1f}"),
    *((f"{k.replace(' (outside)', '')} ms/step, outside", lambda r, k=k: per_call(r, k), "{:.2f}")
      for k in OUTSIDE),
    *((f"{k.replace(' (outside)', '')} ms/run, outside", lambda r, k=k: per_run(r, k), "{:.1f}")
      for k in OUTSIDE),
    ("launch -> started ms (median)", lambda r: r["to_started_ms"], "{:.1f}"),
    ("launch -> the trainer starts s (median)", lambda r: r["to_trainer_s"], "{:.3f}"),
    ("the trainer ends -> end seen s (median)", lambda r: r["to_seen_s"], "{:.3f}"),
    ("launch -> end seen - run's wall s (median)", lambda r: r["overhead_s"], "{:.3f}"),
    ("steps", lambda r: r["steps"], "{:,}"),
]


def table(res: dict[str, dict], nodes: int) -> list[str]:
    """One column a mode, then ray / each local one."""
    names = {"local": "local fork", "fresh": "local fresh", "ray": f"ray {nodes} nodes"}
    bases = [m for m in res if m != "ray"]
    head = (f"{'':42}" + "".join(f"{names[m]:>13}" for m in res)
            + "".join(f"{'ray/' + m:>11}" for m in bases))
    out = [head, "-" * len(head)]
    for name, fig, fmt in ROWS:
        got = {m: fig(r) for m, r in res.items()}
        ratios = [f"{got['ray'] / got[m]:.2f}x" if got[m] > 0 else "-" for m in bases]
        out.append(f"{name:42}" + "".join(f"{fmt.format(v):>13}" for v in got.values())
                   + "".join(f"{x:>11}" for x in ratios))
    return out


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError):
        cpu = next((ln.split(":", 1)[1].strip() for ln in
                    Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), "?")
    return (f"{platform.node()}, {cpu}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}")


def loadavg() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--slots", type=int, default=4, help="stand-in GPUs, one run on each")
    p.add_argument("--nodes", type=int, default=2, help="Ray nodes the GPUs are spread over")
    p.add_argument("--repeat", type=int, default=1, help="every mode, this many times")
    p.add_argument("--no-fresh", action="store_true",
                   help="leave out the local backend without its fork server")
    p.add_argument("--warmup", type=int, default=None,
                   help="runs through each mode first, not reported (default: --slots)")
    args = p.parse_args()
    if not 1 <= args.nodes <= args.slots:
        p.error("--nodes must be between 1 and --slots")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks clean up
    from bench_ray import tiny_runs

    print(f"{machine()}; load average {loadavg()} at the start", flush=True)
    runs = tiny_runs(args.runs)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-ray-lab-") as tmp:
        tmp = Path(tmp)
        os.environ["GRIDRUN_FAKE_GPUS"] = "1"
        os.environ["GRIDRUN_STANDIN_NVML"] = str(tmp / "local.nvml.json")
        nvml_state(tmp / "local.nvml.json", "local", args.slots)
        (tmp / "local.ledger").mkdir(mode=0o1777)
        os.environ["GRIDRUN_LEDGER"] = str(tmp / "local.ledger")
        t = time.perf_counter()
        cluster = start_cluster(tmp, args.nodes, args.slots)
        print(f"Ray cluster of {args.nodes} nodes up in {time.perf_counter() - t:.1f} s", flush=True)
        try:
            warm = tiny_runs(args.slots if args.warmup is None else args.warmup)
            modes = ("local", "ray") if args.no_fresh else ("local", "fresh", "ray")
            for mode in ("local", "ray") if warm else ():
                w = one(mode, tmp / f"{mode}-warmup", warm, args.slots)
                print(f"  warm-up {mode}: {w['runs']} runs in {w['drain_s']:.1f} s", flush=True)
            for rep in range(args.repeat):
                pair = {}
                for mode in modes:
                    pair[mode] = one(mode, tmp / f"{mode}-{rep}", runs, args.slots)
                    print(f"  {mode}: {pair[mode]['runs']} runs in {pair[mode]['drain_s']:.1f} s",
                          flush=True)
                results.append(pair)
                print(f"\n{args.runs} tiny runs, {args.slots} slots (stand-in GPUs), "
                      f"repetition {rep + 1} of {args.repeat}, load {loadavg()}")
                print("\n".join(table(pair, args.nodes)) + "\n", flush=True)
        finally:
            stop_cluster(cluster)
    print(f"load average {loadavg()} at the end")
    print(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
