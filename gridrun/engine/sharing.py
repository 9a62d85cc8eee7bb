"""The engine's side of sharing its GPUs with other gridrun engines and other people:
its memory book (packing.Book), the machine-wide ledger it reads and writes
(ledger.Ledger), what each of its runs commits, and the store state that shows it
(packing.STATE: `engine status`, the interface's machine panel).

Placing is read, decide, write under the ledger's lock (`placing`, then `reserve`: what
is about to start is in the ledger before the lock goes and before it launches), so two
engines never commit more than a GPU's memory between them; a commitment that ends is
written without it (`publish`: less is always safe). Only an engine of this machine (the local backend)
with GPU slots takes part; a GPU whose size NVML does not give is placed by slots alone.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gridrun.engine import packing
from gridrun.engine.backends.base import Slot
from gridrun.engine.ledger import Entry, Ledger, owned_by
from gridrun.engine.placement import gpu_of
from gridrun.runs import states

log = logging.getLogger("gridrun.engine")


class Sharing:
    def __init__(self, runs_per_gpu: int | str, slots: Sequence[Slot], ledger: Ledger | None = None):
        self.book = packing.Book(runs_per_gpu)
        self.gpus = list(dict.fromkeys(g for s in slots if (g := gpu_of(s)) is not None))
        self.ledger = ledger if ledger is not None else Ledger()
        self.others: list[Entry] = []
        self._published: Any = None
        self.sized = False  # every GPU's size known (else under "auto" a run takes a GPU alone)
        if self.ledger.problem:
            log.warning("%s", self.ledger.problem)

    @classmethod
    def for_engine(cls, runs_per_gpu: Any, slots: Sequence[Slot], local: bool,
                   ledger: Ledger | None = None) -> Sharing | None:
        """The engine's Sharing, or None: not this machine's GPUs (SLURM, Ray, CPU slots)."""
        if not local or not any(s.gpu is not None for s in slots):
            return None
        return cls(runs_per_gpu if runs_per_gpu == "auto" else max(1, int(runs_per_gpu or 1)),
                   slots, ledger)

    # ---- what runs measure and commit ------------------------------------------------

    def learn_from(self, runs: Any) -> None:
        """Every ended run's measurement (the store's copies of their summaries)."""
        for run in runs:
            if run.status in states.FINISHED:
                self.book.learn(run.config, run.summary)

    def budget(self, run: Any) -> int | float | None:
        """What `run` commits on each GPU it takes (packing.Book.budget): under "auto",
        with the GPUs' sizes unknown, nothing to measure against: a GPU alone."""
        if self.book.auto and not self.sized:
            return None
        return self.book.budget(run.config, run.adjustments)

    def enforced(self, budget: int | float | None, commit: int) -> int | None:
        """The budget a run is held to inside (bytes), or None: its own in bytes; for an
        unmeasured shape, the room it was given (all of a GPU, or what others' processes
        leave beside them); a share of a GPU (an integer runs_per_gpu) is not enforced."""
        if isinstance(budget, int) and budget:
            return budget
        return commit if budget is None and commit and self.sized else None

    def commits(self, active: Mapping[str, Any]) -> dict[Any, int]:
        """GPU -> the bytes this engine's runs commit there."""
        return held(active)[0]

    def friends(self) -> set[int]:
        """The pids of other engines' runs, each its entry's owner's (an entry cannot pass
        a stranger's process off as a run): committed in the ledger, not foreign. Read
        afresh (no lock: reading is safe), so a run another engine just started is known."""
        self.others = self.ledger.others()
        return {pid for e in self.others for pid in e.pids if owned_by(pid, e.uid)}

    def others_threads(self) -> list[int]:
        return [e.threads for e in self.others if e.threads]

    # ---- placing -----------------------------------------------------------------------

    @contextlib.contextmanager
    def placing(self, active: Mapping[str, Any], foreign: Mapping[Any, int], lock: bool = True
                ) -> Iterator[dict[Any, packing.Room] | None]:
        """Under the ledger's lock: each GPU's room (None: a GPU's size is unknown); the
        body `reserve`s what it is about to start. A lock held too long by someone else
        is gone around (ledger.busy) rather than stall the queue. `lock` False (nothing
        to start): the rooms only, for the views."""
        with self.ledger.held() if lock else contextlib.nullcontext():
            self.others = self.ledger.others()
            theirs: dict[str, int] = {}
            for entry in self.others:
                for key, n in entry.gpus.items():
                    theirs[key] = theirs.get(key, 0) + n
            ours = self.commits(active)
            rooms = self.book.rooms(ours, theirs, foreign, self.gpus)
            self.sized = rooms is not None
            if rooms is None and self.book.auto:  # sizes unknown: one run a GPU, as 1 would
                rooms = {g: packing.Room(1, 0 if ours.get(g) else 1, not ours.get(g))
                         for g in self.gpus}
            yield rooms

    def reserve(self, active: Mapping[str, Any], plan: Any, threads: Mapping[str, int]) -> None:
        """Write what runs and what `plan` is about to start (`threads`: each start's) into
        the ledger: a launch that then fails is dropped by the next `publish`."""
        ours = self.commits(active)
        for run_id, slot in plan.starts:
            for part in slot.parts if plan.commits.get(run_id) else ():
                ours[gpu_of(part)] = ours.get(gpu_of(part), 0) + plan.commits[run_id]
        self._write(ours, sum(a.threads for a in active.values()) + sum(threads.values()),
                    [a.handle.pid for a in active.values()])

    def publish(self, active: Mapping[str, Any]) -> None:
        """This engine's entry in the ledger: what its runs commit now."""
        self._write(self.commits(active), sum(a.threads for a in active.values()),
                    [a.handle.pid for a in active.values()])

    def _write(self, ours: Mapping[Any, int], threads: int, pids: list[int]) -> None:
        entry = ({self.book.keys.get(g, f"index:{g}"): n for g, n in ours.items()}, threads,
                 sorted(pids))
        if entry != self._published and self.ledger.write(*entry):  # a failed write: again
            self._published = entry

    def close(self) -> None:
        self.ledger.close()

    # ---- the store state --------------------------------------------------------------

    def state(self, active: Mapping[str, Any], rooms: Mapping[Any, packing.Room] | None,
              foreign: Mapping[Any, int], waits: Mapping[str, Any] | None) -> dict[str, Any]:
        """packing.STATE's value: per GPU its size, what our runs, other engines and
        others' processes take, and what is free; why the first queued run waits."""
        ours, runs = held(active)
        gpus = []
        for gpu in self.gpus:
            room, key = (rooms or {}).get(gpu), self.book.keys.get(gpu)
            others = sum(e.gpus.get(key, 0) for e in self.others) if key else 0
            gpus.append({"gpu": gpu, "total": self.book.totals.get(gpu), "ours": ours.get(gpu, 0),
                         "runs": runs.get(gpu, 0), "others": others,
                         "foreign": foreign.get(gpu, 0), "free": room.free if room else None})
        wait = dict(waits) if waits else None
        if wait is not None:
            wait["others"] = sum(g["others"] for g in gpus)
        return {"mode": "auto" if self.book.auto else "slots", "gpus": coarse(gpus),
                "waits": wait, "ledger": self.ledger.problem or self.ledger.busy}


def held(active: Mapping[str, Any]) -> tuple[dict[Any, int], dict[Any, int]]:
    """GPU -> (the bytes the active runs commit there, how many of them there are)."""
    bytes_: dict[Any, int] = {}
    runs: dict[Any, int] = {}
    for act in active.values():
        for part in act.slot.parts if act.slot and act.commit else ():
            gpu = gpu_of(part)
            bytes_[gpu], runs[gpu] = bytes_.get(gpu, 0) + act.commit, runs.get(gpu, 0) + 1
    return bytes_, runs


def coarse(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Byte counts to packing.ROUND: the state changes, and is written, when memory moves
    by more than that, not with every sample of others' processes."""
    return [{k: (v // packing.ROUND * packing.ROUND if isinstance(v, int) and k not in ("gpu", "runs")
                 else v) for k, v in g.items()} for g in gpus]
