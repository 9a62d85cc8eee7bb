"""The one bridge between the source and the widgets.

A thread calls `Bridge.tick()` a few times a second; each tick asks the source
what changed and returns frozen, past-tense messages, which the app posts.
The bridge never touches a widget; widgets never touch the source's files.
"""

from __future__ import annotations

import threading
from typing import Any

from textual.message import Message

from gridrun.tui.source import EngineState, Machine, RunRow, Source

CHUNK = 1000


class RunsChanged(Message):
    """Rows that changed (a delta: never replaced by a later one)."""

    def __init__(self, runs: tuple[RunRow, ...]) -> None:
        super().__init__()
        self.runs = runs


class RunsRemoved(Message):
    """Runs taken out of the store (never replaced by a later one)."""

    def __init__(self, ids: tuple[str, ...]) -> None:
        super().__init__()
        self.ids = ids


class MetricsArrived(Message):
    """New metric records of a run being watched (only the lines not seen before)."""

    def __init__(self, run_id: str, records: tuple[dict[str, Any], ...], reset: bool = False) -> None:
        super().__init__()
        self.run_id, self.records, self.reset = run_id, records, reset


class GpuSampled(Message):
    """The machine's latest state; a newer sample replaces one still queued."""

    def __init__(self, machine: Machine) -> None:
        super().__init__()
        self.machine = machine

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, GpuSampled)


class EngineStateChanged(Message):
    def __init__(self, engine: EngineState) -> None:
        super().__init__()
        self.engine = engine

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, EngineStateChanged)


class SourceNoticed(Message):
    """A warning from the source, shown once (e.g. the store lost its queue)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class Bridge:
    """Polls `source`; `watch(run_id)` adds a run whose metrics to follow."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self._lock = threading.Lock()
        self._offsets: dict[str, int] = {}

    def watch(self, run_id: str) -> None:
        with self._lock:
            self._offsets.setdefault(run_id, 0)

    def unwatch(self, run_id: str) -> None:
        with self._lock:
            self._offsets.pop(run_id, None)

    def tick(self) -> list[Message]:
        update = self.source.poll()
        out: list[Message] = []
        runs = tuple(update.runs)
        for i in range(0, len(runs), CHUNK):  # keys are handled between chunks at start
            out.append(RunsChanged(runs[i:i + CHUNK]))
        if update.removed:
            out.append(RunsRemoved(tuple(update.removed)))
        if update.engine is not None:
            out.append(EngineStateChanged(update.engine))
        if update.machine is not None:
            out.append(GpuSampled(update.machine))
        if update.notice:
            out.append(SourceNoticed(update.notice))
        with self._lock:
            watched = dict(self._offsets)
        for run_id, offset in watched.items():
            records, new = self.source.metrics(run_id, offset)
            with self._lock:
                if run_id in self._offsets:
                    self._offsets[run_id] = new
            if records or new < offset:
                out.append(MetricsArrived(run_id, tuple(records), reset=new < offset))
        return out
