"""The engine's "waiting for disk space" state.

A full disk is a state, not a crash: when a write of the engine (the store) or
of a run fails for want of space, the engine stops launching, keeps the endings
it could not record, and every `retry_every` seconds looks whether the disk has
`margin` bytes free again and the store takes a write; then it records what it
kept and launches again, by itself. Meanwhile it says so where readers look
without a write that needs space: `announce` (the daemon's pid file, rewritten
in place) gets {"waiting_for_space": since, "free_bytes": n, "t": now}.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gridrun.runs import space

log = logging.getLogger("gridrun.engine")

WAITING = "waiting for disk space"


class DiskSpace:
    def __init__(self, root: Path, *, announce: Callable[[dict[str, Any]], None] | None = None,
                 retry_every: float = 2.0, margin: int = space.RESUME_MARGIN,
                 beat_every: float = 1.0) -> None:
        self.root = root
        self.announce = announce or (lambda fields: None)
        self.retry_every, self.margin, self.beat_every = retry_every, margin, beat_every
        self.since: float | None = None  # unix time the wait began; None: not waiting
        self.why = ""
        self._next_probe = 0.0
        self._next_beat = 0.0

    @property
    def waiting(self) -> bool:
        return self.since is not None

    def enter(self, why: Any) -> None:
        """Stop launching until there is space again (a no-op while already waiting)."""
        if self.since is not None:
            return
        self.since, self.why = time.time(), str(why).splitlines()[0] if str(why) else ""
        self._next_probe = time.monotonic() + self.retry_every
        free = space.free_bytes(self.root)
        log.warning("%s on %s (%s free): %s; launching nothing until there is space, "
                    "then resuming by itself", WAITING, self.root, space.human(free), self.why)
        self.beat(force=True)

    def enter_if_short(self, why: Any) -> None:
        """`enter`, unless the disk has `margin` bytes free again (a run's ending told late)."""
        free = space.free_bytes(self.root)
        if free is None or free < self.margin:
            self.enter(why)

    def short_of_space(self) -> bool:
        """Too little free to launch a run (checked before each launch)."""
        return space.nearly_full(self.root)

    def ready(self, probe: Callable[[], None]) -> bool:
        """Whether the wait is over: at most every `retry_every` s, `margin` bytes free
        and `probe` (a store write) succeeds. Then the state is left and said so."""
        if self.since is None:
            return True
        now = time.monotonic()
        if now < self._next_probe:
            return False
        self._next_probe = now + self.retry_every
        free = space.free_bytes(self.root)
        if free is not None and free < self.margin:
            return False
        try:
            probe()
        except Exception as e:
            if not space.is_no_space(e):
                raise
            return False
        waited = time.time() - self.since
        self.since, self.why = None, ""
        log.info("disk space is back on %s (%s free) after %.0f s: resuming", self.root,
                 space.human(free), waited)
        try:
            self.announce({"waiting_for_space": None, "paused": [], "free_bytes": None,
                           "t": time.time()})
        except OSError as e:  # never a reason to stop
            log.debug("could not announce the end of the wait: %s", e)
        return True

    def beat(self, *, force: bool = False, paused: list[str] | None = None) -> None:
        """Say "alive, waiting" where readers look (the store may take no write now), and
        which runs stopped for want of space before the store could say so (`paused`)."""
        now = time.monotonic()
        if self.since is None or (now < self._next_beat and not force):
            return
        self._next_beat = now + self.beat_every
        try:
            self.announce({"waiting_for_space": self.since, "paused": (paused or [])[:50],
                           "free_bytes": space.free_bytes(self.root), "t": time.time()})
        except OSError as e:  # never a reason to stop
            log.debug("could not announce the wait: %s", e)
