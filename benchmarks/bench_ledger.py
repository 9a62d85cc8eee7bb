"""The GPU ledger with 30,000 live entries: what reading it costs, what an idle engine
pays for it, and whether a launch waits on it (issue 45, finding 4).

    python benchmarks/bench_ledger.py [--entries 30000] [--seconds 20] [--launches 20]
                                      [--before REV]

A folder of `--entries` valid entries (each naming a live `sleep` of this user as its
engine, 1 MiB on the stand-in GPU), read by a Ledger:

- a read: the first (cold) pass, a pass where nothing changed with the engine's
  REFRESH, one that looks afresh at which engines live, and one after another engine
  rewrote its entry (the folder changed); with `--before REV`, the cold read of the
  ledger module at that git revision, timed on the same folder (today's main took
  9.8 s there);
- an idle engine: an in-process engine (one stand-in 80 GiB GPU, 4 slots, an empty
  queue, its usual 0.25 s tick) stepping for `--seconds`, its CPU time over the wall
  time, beside the same engine over an empty ledger (the baseline) and the 5% target;
- launches: `--launches` runs of 50 GiB queued (one fits at a time), each ending at
  the next poll: the wall time of each engine step that recorded the end of one and
  launched the next (placing under the lock, the entry written, the launch), with
  30,000 entries and with none (today's main launched each 24 s after the last ended).

Measured here, never asserted in tests/ (tests/test_ledger_trust.py asserts the bound
on entries read a pass).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from gridrun.engine.backends.base import Backend, Exited, Handle, Slot
from gridrun.engine.entries import REFRESH
from gridrun.engine.ledger import Ledger
from gridrun.engine.scheduler import Engine
from gridrun.engine.telemetry import GpuSample, Sample
from gridrun.runs.store import Store
from gridrun.spec import TRAINER_KEYS, RunSpec, run_id

GIB = 1 << 30


class Gpu:
    """One stand-in 80 GiB GPU with nothing on it."""

    available = True
    error = None

    def sample(self) -> Sample:
        return Sample(time.time(), [GpuSample(0, "stand-in", mem_total_bytes=80 * GIB,
                                              mem_used_bytes=0, uuid="GPU-0000")])

    def processes(self) -> dict:
        return {}

    def gpu_processes(self) -> list:
        return []

    def close(self) -> None:
        pass


class Instant(Backend):
    """Runs with no process: each ends at the next poll."""

    name = "local"

    def __init__(self) -> None:
        self.live: list[Handle] = []
        self.launched = 0

    def launch(self, run_id, run_dir, slot, *, fresh=False):
        self.launched += 1
        handle = Handle(run_id, Path(run_dir), os.getpid(), psutil.Process().create_time(), slot)
        self.live.append(handle)
        return handle

    def poll(self, timeout):
        if not self.live:  # as a real backend: nothing ended, so it waits out the tick
            time.sleep(timeout)
        ended, self.live = [Exited(h, 0) for h in self.live], []
        return ended

    def cancel(self, handle, grace=30.0):
        pass

    def reattach(self, run_id, run_dir, pid, start_time, slot=None):
        return None


def spec(seed: int) -> RunSpec:
    """A run of 50 GiB: one at a time on the 80 GiB GPU, each launched when the last ends."""
    trainer = {k: key.default for k, key in TRAINER_KEYS.items()}
    trainer.update(epochs=1, threads=1, gpu_memory=50.0)
    rid = run_id("bench", "spirals", trainer, {}, seed)
    return RunSpec(rid, "bench", f"s{seed}", seed, "spirals", trainer, {}, {})


def fill(folder: Path, n: int, pid: int, start: float) -> None:
    folder.mkdir(mode=0o1777)
    os.chmod(folder, 0o1777)
    body = json.dumps({"pid": pid, "start_time": start, "gpus": {"GPU-0000": 1 << 20},
                       "threads": 0, "pids": []})
    for i in range(n):
        (folder / f"{os.geteuid()}.{pid}.{i:08x}.json").write_text(body)


def timed(call, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def old_ledger(rev: str):
    """The ledger module at `rev`, loaded on its own (it imports only backends.child)."""
    source = subprocess.run(["git", "show", f"{rev}:gridrun/engine/ledger.py"], check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_ledger.py"
    path.write_text(source)
    module_spec = importlib.util.spec_from_file_location("old_ledger", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules["old_ledger"] = module  # its dataclass looks itself up there
    module_spec.loader.exec_module(module)
    return module


def reads(folder: Path, before: str | None) -> None:
    ledger = Ledger(folder)
    t = time.perf_counter()
    seen = ledger.others()
    cold = time.perf_counter() - t
    print(f"read, cold: {cold * 1e3:.1f} ms ({len(seen)} live entries read, "
          f"{sum(ledger.passed_over.values())} passed over by the per-owner cap)")
    time.sleep(1)  # past the folder's racy window: unchanged since it was listed
    print(f"read, nothing changed (max_age={REFRESH:g} s, the engine's): "
          f"{timed(lambda: ledger.others(max_age=REFRESH)) * 1e6:.0f} µs")
    print(f"read, engines' liveness looked at afresh: {timed(lambda: ledger.others()) * 1e3:.2f} ms")
    other = Ledger(folder)

    def changed() -> None:
        other.write({"GPU-0000": 1}, 0, [])
        ledger.others()
    print(f"read after another engine rewrote its entry (the folder listed again): "
          f"{timed(changed) * 1e3:.1f} ms")
    other.close()
    if before:
        old = old_ledger(before).Ledger(folder)
        t = time.perf_counter()
        old.others()
        then = time.perf_counter() - t
        print(f"read, the ledger at {before} (every read the same): {then:.2f} s "
              f"(= {then / cold:.0f}x today's cold read)")


def engine(root: Path, folder: Path) -> Engine:
    return Engine(root, Instant(), [Slot(f"gpu0.{k}", 0) for k in range(4)], telemetry=Gpu(),
                  cores=16, runs_per_gpu="auto", ledger=Ledger(folder))


def idle_share(root: Path, folder: Path, seconds: float) -> float:
    e = engine(root, folder)
    e.start()
    e.step()  # the first pass is the cold read above
    cpu, wall = time.process_time(), time.perf_counter()
    while time.perf_counter() - wall < seconds:
        e.step()
    share = (time.process_time() - cpu) / (time.perf_counter() - wall)
    e.sharing.close()
    e.store.close()
    return share


def launch_times(root: Path, folder: Path, n: int) -> list[float]:
    """The wall time of each engine step that launched runs, until `n` runs have run
    (each ends at the next poll, so every step launches what the last one ended)."""
    with Store(root) as store:
        store.enqueue([spec(s) for s in range(n)])
    e = engine(root, folder)
    e.start()
    times, launched = [], 0
    while launched < n:
        t = time.perf_counter()
        e.step(0.0)
        if e.backend.launched > launched:
            times.append(time.perf_counter() - t)
            launched = e.backend.launched
    e.sharing.close()
    e.store.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=30_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--launches", type=int, default=20)
    parser.add_argument("--before", metavar="REV", help="also time the ledger at this revision")
    args = parser.parse_args()
    print(f"{platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} "
          f"cores, Python {platform.python_version()}, load {os.getloadavg()[0]:.1f}")
    base = Path(tempfile.mkdtemp(prefix="bench-ledger-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                                 else None))
    roots = Path(tempfile.mkdtemp(prefix="bench-ledger-roots-"))  # not a system folder
    engine_of_theirs = subprocess.Popen(["sleep", "3600"])  # every entry's live engine
    try:
        crowded, empty = base / "crowded", base / "empty"
        fill(crowded, args.entries, engine_of_theirs.pid,
             psutil.Process(engine_of_theirs.pid).create_time())
        fill(empty, 0, 0, 0)
        print(f"{args.entries} entries in {crowded}")
        reads(crowded, args.before)
        baseline = idle_share(roots / "idle-empty", empty, args.seconds)
        share = idle_share(roots / "idle-crowded", crowded, args.seconds)
        print(f"idle engine, {args.seconds:g} s at its 0.25 s tick: {share:.2%} of a core with "
              f"{args.entries} entries; {baseline:.2%} with none (= {share / baseline:.2f}x); "
              "target under 5%")
        alone = launch_times(roots / "launch-empty", empty, args.launches)
        crowd = launch_times(roots / "launch-crowded", crowded, args.launches)
        print(f"a step that launched, median of {len(crowd)}: {statistics.median(crowd) * 1e3:.1f} ms "
              f"with {args.entries} entries (max {max(crowd) * 1e3:.1f}); "
              f"{statistics.median(alone) * 1e3:.1f} ms with none (= "
              f"{statistics.median(crowd) / statistics.median(alone):.2f}x)")
    finally:
        engine_of_theirs.kill()
        engine_of_theirs.wait()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(roots, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
