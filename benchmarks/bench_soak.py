"""Soak: many tiny runs through the real background engine, killed with SIGKILL
over and over. Nothing may be lost and nothing may run twice.

    python benchmarks/bench_soak.py [--runs 2000] [--kill-every 20] [--slots 2]

Queues N tiny `spirals` runs on a fresh root, starts the engine (`gridrun
engine start`'s code path, a detached process), and every K seconds kills the
engine process with SIGKILL and starts it again, until every run has ended.
Samples the engine's RSS and CPU once a second. Then checks each run:

- lost: a run that is not `completed` at the end;
- run twice: a run whose output.log shows more than one start from step 0
  (a resume after a kill prints "resumed from step", which is fine);
- metrics: each completed run's metrics.jsonl has one start line and ends
  with its final evaluation.

With `--kill-every 0` it runs undisturbed: the baseline for runs per minute.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from gridrun.engine import daemon
from gridrun.runs import layout, runlog, states
from gridrun.runs.store import Store
from gridrun.spec import TRAINER_KEYS, RunSpec, run_id

TINY = {"train_size": 64, "val_size": 32, "hidden": 8, "depth": 1}


def tiny_run(seed: int) -> RunSpec:
    cfg = {k: key.default for k, key in TRAINER_KEYS.items()}
    cfg.update(epochs=1, batch_size=32, max_steps=2, log_every=1)
    return RunSpec(run_id("soak", "spirals", cfg, TINY, seed), "soak", f"s{seed}", seed,
                   "spirals", cfg, TINY, {})


def engine_processes(pid: int) -> list[psutil.Process]:
    """The engine and its fork server (not the runs, which are the server's children)."""
    try:
        proc = psutil.Process(pid)
        return [proc] + [c for c in proc.children() if "forkserver" in " ".join(c.cmdline())]
    except psutil.Error:
        return []


def check(root: Path, runs: list[RunSpec]) -> dict:
    with Store(root) as store:
        status = {r.id: r.status for r in store.list_runs()}
    lost = [r.id for r in runs if status.get(r.id) != states.COMPLETED]
    twice, resumed, bad_metrics = [], 0, []
    for r in runs:
        run_dir = layout.run_dir(root, r.experiment, r.id)
        try:
            out = (run_dir / layout.OUTPUT).read_text(errors="replace")
        except OSError:
            out = ""
        starts = out.count(f"run {r.id} ")
        resumes = out.count("resumed from step")
        resumed += resumes > 0
        if starts - resumes > 1:
            twice.append(r.id)
        lines = list(runlog.read_all(run_dir / layout.METRICS))
        splits = [line.get("split") for line in lines]
        if splits.count("start") != 1 or not splits or splits[-1] != "val":
            bad_metrics.append(r.id)
    return {"lost": lost, "run_twice": twice, "resumed": resumed, "bad_metrics": bad_metrics}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--kill-every", type=float, default=20.0, help="seconds; 0: never")
    p.add_argument("--slots", type=int, default=2)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="soak-"))
    runs = [tiny_run(s) for s in range(args.runs)]
    from gridrun.spec import EngineConfig

    with Store(root) as store:
        store.enqueue(runs)
    config = EngineConfig(gpus=(), cpu_slots=args.slots)
    t0 = time.time()
    st = daemon.start(root, config)
    kills, samples, last_kill = 0, [], time.time()
    done = 0
    while True:
        time.sleep(1.0)
        now = time.time()
        with Store(root) as store:
            counts = store.counts()
        done = sum(n for s, n in counts.items() if s in states.FINISHED)
        procs = engine_processes(st.pid) if st.pid else []
        try:  # the engine alone; the fork server (torch imported) is reported beside it
            rss = procs[0].memory_info().rss if procs else 0
            cpu = sum(procs[0].cpu_times()[:2]) if procs else 0.0
            server = sum(pr.memory_info().rss for pr in procs[1:])
        except psutil.Error:
            rss, cpu, server = 0, 0.0, 0
        samples.append((now - t0, done, rss, cpu, st.pid, server))
        if done >= args.runs:
            break
        if args.kill_every and now - last_kill >= args.kill_every:
            os.kill(st.pid, signal.SIGKILL)
            kills += 1
            time.sleep(0.2)
            st = daemon.start(root)
            last_kill = time.time()
    wall = time.time() - t0
    daemon.stop(root, timeout=60)
    result = check(root, runs)
    print(f"{args.runs} runs, {args.slots} slots, engine SIGKILLed {kills} times "
          f"(every {args.kill_every:g} s): {wall:.1f} s, {60 * args.runs / wall:.0f} runs a minute")
    print(f"lost {len(result['lost'])}, run twice {len(result['run_twice'])}, resumed after a "
          f"kill {result['resumed']}, bad metrics logs {len(result['bad_metrics'])}")
    print(f"{'t (s)':>6} {'done':>6} {'runs/min':>9} {'engine RSS':>11} {'engine CPU':>11} "
          f"{'fork server RSS':>16}")
    window = 20
    for i in range(0, len(samples), window):
        chunk = samples[i:i + window]
        t, d = chunk[-1][:2]
        t_a, d_a = samples[max(i - 1, 0)][:2]
        span = max(t - t_a, 1e-9)
        # CPU over the window's samples taken by one engine process (a kill resets its clock)
        pairs = [(a, b) for a, b in itertools.pairwise(chunk) if a[4] == b[4] and b[3] >= a[3]]
        busy = sum(b[3] - a[3] for a, b in pairs)
        secs = sum(b[0] - a[0] for a, b in pairs)
        cpu_share = f"{100 * busy / secs:>9.1f} %" if secs else f"{'-':>11}"
        rss_mb = statistics.median(s[2] for s in chunk) / 2**20
        server_mb = statistics.median(s[5] for s in chunk) / 2**20
        print(f"{t:>6.0f} {d:>6} {60 * (d - d_a) / span:>9.0f} {rss_mb:>8.1f} MB {cpu_share} "
              f"{server_mb:>13.0f} MB")
    print(json.dumps({"root": str(root), "wall_s": wall, "kills": kills, **{
        k: (v if isinstance(v, int) else len(v)) for k, v in result.items()}}))
    sys.exit(1 if result["lost"] or result["run_twice"] or result["bad_metrics"] else 0)


if __name__ == "__main__":
    main()
