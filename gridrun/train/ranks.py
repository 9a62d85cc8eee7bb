"""One run on several devices: its ranks, how they meet, and how one's death ends them all.

The engine launches a multi-device run once, like any run. That process is rank 0:
it starts ranks 1..n-1 as child processes (`python -m gridrun.train.worker --rank`), they
meet through a file store in the run folder (no port to pick or collide on), and
train in lock step; only rank 0 writes the run's records. A rank inherits rank 0's
stdout and stderr, so the run keeps one output log.

A rank that dies takes the run down at once: rank 0 watches its children, kills the
others and exits with states.EXIT_RANK_DIED (world.rank_died), which the engine treats like any process that
died (back to the queue, resumed from the last checkpoint). Children die with rank 0
(PR_SET_PDEATHSIG), and every collective has a timeout, so no rank is left waiting.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from gridrun.train import world

RENDEZVOUS = ".gridrun-rendezvous-"  # + a name of the launch: a new store each time


class Gang:
    """Rank 0's children, ranks 1..n-1, and the thread that watches them."""

    def __init__(self, run_dir: Path, size: int, *, fresh: bool):
        self.run_dir, self.size = run_dir, size
        for stale in run_dir.glob(RENDEZVOUS + "*"):  # a killed launch's store
            with contextlib.suppress(OSError):
                stale.unlink()
        self.rendezvous = run_dir / f"{RENDEZVOUS}{os.getpid()}-{time.time_ns()}"
        self.children: dict[int, subprocess.Popen] = {}
        for rank in range(1, size):
            self.children[rank] = subprocess.Popen(
                [sys.executable, "-m", "gridrun.train.worker", str(run_dir), "--rank", str(rank),
                 "--of", str(size), "--rendezvous", str(self.rendezvous)]
                + (["--fresh"] if fresh else []),
                stdin=subprocess.DEVNULL)
        world.which_died = self.which_died
        self.done = threading.Event()
        self.watcher = threading.Thread(target=self._watch, name="gridrun-ranks", daemon=True)
        self.watcher.start()

    def dead(self) -> str | None:
        """"rank r of n died (how)" for the first rank that ended abnormally, else None."""
        for rank, proc in self.children.items():
            code = proc.poll()
            if code is not None and code != 0:  # a rank that finished the loop is not dead
                how = f"signal {-code}" if code < 0 else f"exit code {code}"
                return f"rank {rank} of {self.size} died ({how})"
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
        while not self.done.wait(0.2):
            if (found := self.dead()) is not None:
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
            self.rendezvous.unlink()
