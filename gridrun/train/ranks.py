"""One run on several devices: its ranks, how they meet, and how one's death ends them all.

The engine launches a multi-device run once, like any run. That process is rank 0:
it makes the launch's rendezvous file (world.make_rendezvous), starts ranks 1..n-1 as
child processes (`python -m gridrun.train.worker --rank`), they meet through that
file in the run folder (no port to pick or collide on), and train in lock step; only
rank 0 writes the run's records. A rank inherits rank 0's stdout and stderr, so the
run keeps one output log.

Rank 0's watcher ends the run, with one line naming the rank, when a rank
- dies: at once;
- cannot start (its launch fails): at once;
- never joins: after JOIN_DEADLINE_S, or at once when the rendezvous file holds bytes
  no rank wrote (they would keep every rank reading forever);
- stops answering: its process stopped (SIGSTOP, SIGTSTP) for STOPPED_LIMIT_S. This is
  the process's state, never its speed, so a run that is merely slow on a busy
  machine is never ended.
It kills the others and exits with states.EXIT_RANK_DIED (world.rank_died), which the
engine treats like any process that died (back to the queue, resumed from the last
checkpoint). Both bounds count only the time rank 0's watcher runs: a rank 0 stopped
with the others (ctrl-z in a terminal) or starved by a busy machine does not count
that time against them. Children die with rank 0 (PR_SET_PDEATHSIG), and every
collective has a timeout, so no rank is left waiting.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from gridrun.train import world

# A rank's start is a Python process importing torch, a few seconds; 120 s leaves room
# for a machine many times over-subscribed and is 5x under the collective timeout.
JOIN_DEADLINE_S = 120.0
# No healthy rank is ever stopped: this only spares a short pause (a debugger's
# snapshot, a job-control race) and is 20x under the collective timeout.
STOPPED_LIMIT_S = 30.0
JOIN_DEADLINE_ENV = "GRIDRUN_JOIN_DEADLINE_S"  # either bound, shorter or longer: tests, admins
STOPPED_LIMIT_ENV = "GRIDRUN_STOPPED_LIMIT_S"
WATCH_EVERY_S = 0.2
# The most one round of the watcher counts toward a bound: a longer gap is rank 0's
# own stop or starvation, not the ranks' fault.
COUNTED_ROUND_S = 1.0


def seconds_from_env(name: str, default: float) -> float:
    """A bound in seconds from the environment; anything but a positive number is said
    once and the default used."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value > 0:
        return value
    print(f"gridrun: {name}={raw!r} is not a positive number of seconds; using {default:g}",
          file=sys.stderr, flush=True)
    return default


def is_stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (state T); a traced stop (a debugger
    at a breakpoint) is someone looking, not a rank gone silent."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:  # gone, or not ours to read: the dead-rank check decides
        return False


class Gang:
    """Rank 0's children, ranks 1..n-1, and the thread that watches them."""

    def __init__(self, run_dir: Path, size: int, *, fresh: bool):
        self.run_dir, self.size = run_dir, size
        self.rendezvous = world.make_rendezvous(run_dir)
        # rank 0's store is open before any other process is told the file's name
        self.store = world.open_store(self.rendezvous.path, size, 0)
        self.join_deadline = seconds_from_env(JOIN_DEADLINE_ENV, JOIN_DEADLINE_S)
        self.stopped_limit = seconds_from_env(STOPPED_LIMIT_ENV, STOPPED_LIMIT_S)
        self.joined = False  # rank 0 is in the process group: every rank has met
        self.waited = 0.0  # counted seconds of the join so far
        self.stopped_for: dict[int, float] = {}  # counted seconds each rank has been stopped
        self.children: dict[int, subprocess.Popen] = {}
        for rank in range(1, size):
            try:
                self.children[rank] = subprocess.Popen(
                    [sys.executable, "-m", "gridrun.train.worker", str(run_dir), "--rank",
                     str(rank), "--of", str(size), "--rendezvous", str(self.rendezvous.path)]
                    + (["--fresh"] if fresh else []),
                    stdin=subprocess.DEVNULL)
            except OSError as e:  # no process to be had (EAGAIN, ENOMEM): the machine's doing
                self.kill()
                world.rank_died(f"rank {rank} of {size} could not start ({e.strerror or e})")
        world.which_died = self.which_died
        self.done = threading.Event()
        self.watcher = threading.Thread(target=self._watch, name="gridrun-ranks", daemon=True)
        self.watcher.start()

    def met(self) -> None:
        """Rank 0 has joined the process group: the join deadline no longer runs."""
        self.joined = True

    def dead(self) -> str | None:
        """"rank r of n died (how)" for the first rank that ended abnormally, else None."""
        for rank, proc in self.children.items():
            code = proc.poll()
            if code is not None and code != 0:  # a rank that finished the loop is not dead
                how = f"signal {-code}" if code < 0 else f"exit code {code}"
                return f"rank {rank} of {self.size} died ({how})"
        return None

    def ranks(self, which: list[int]) -> str:
        """"rank 1 of 4", "ranks 1, 3 of 4"."""
        return f"rank{'s' if len(which) > 1 else ''} {', '.join(map(str, which))} of {self.size}"

    def not_meeting(self, counted: float) -> str | None:
        """Why the ranks cannot meet: bytes no rank wrote in the rendezvous file (at any
        time: the store reads it to the end of the run), or the join deadline passed."""
        reading = world.read_rendezvous(self.rendezvous)
        missing = [r for r in self.children if r not in reading.arrived]
        if reading.problem is not None:
            said = f"the rendezvous file {self.rendezvous.path.name} {reading.problem}"
            return f"{self.ranks(missing)} never joined: {said}" if missing and not self.joined \
                else said
        if self.joined:
            return None
        self.waited += counted
        if self.waited < self.join_deadline:
            return None
        if missing:
            return f"{self.ranks(missing)} never joined within {self.join_deadline:g} s"
        return (f"{self.ranks(list(self.children))} met but never connected within "
                f"{self.join_deadline:g} s")

    def not_answering(self, counted: float) -> str | None:
        """The first rank whose process has been stopped for the limit, else None."""
        for rank, proc in self.children.items():
            stopped = proc.returncode is None and is_stopped(proc.pid)  # reaped: not ours
            self.stopped_for[rank] = self.stopped_for.get(rank, 0.0) + counted if stopped else 0.0
            if self.stopped_for[rank] >= self.stopped_limit:
                return (f"rank {rank} of {self.size} stopped answering (its process was stopped, "
                        f"SIGSTOP or SIGTSTP, for {self.stopped_limit:g} s)")
        return None

    def which_died(self, wait: float = 2.0) -> str | None:
        """The dead rank, waiting a moment for it: a peer's closed socket can be seen
        before its exit is."""
        deadline = time.monotonic() + wait
        while (found := self.dead()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        self.kill()
        return found

    def _watch(self) -> None:
        last = time.monotonic()
        while not self.done.wait(WATCH_EVERY_S):
            now = time.monotonic()
            counted, last = min(now - last, COUNTED_ROUND_S), now
            found = self.dead() or self.not_meeting(counted) or self.not_answering(counted)
            if found is not None and not self.done.is_set():  # finish() ends the watch
                self.kill()
                world.rank_died(found)

    def kill(self) -> None:
        for proc in self.children.values():
            with contextlib.suppress(OSError):
                proc.kill()

    def finish(self, timeout: float = 60.0) -> None:
        """After rank 0's loop: the others end theirs at the same step; wait for them
        (bounded), and forget the store."""
        self.done.set()
        deadline = time.monotonic() + timeout
        for proc in self.children.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with contextlib.suppress(OSError):
            self.rendezvous.path.unlink()
