"""The engine's side of sharing its GPUs with other gridrun engines and other people:
its memory book (packing.Book), the machine-wide ledger it reads and writes
(ledger.Ledger), what each of its runs commits, and the store state that shows it
(packing.STATE: `engine status`, the interface's machine panel).

Placing is read, decide, write under the ledger's lock (`placing`, then `reserve`: what
is about to start is in the ledger before the lock goes and before it launches), so two
engines never commit more than a GPU's memory between them; a commitment that ends is
written without it (`publish`: less is always safe), and every tick our entry is looked
at and written again if someone removed or changed it. Fail closed: when our entry
cannot be written or the folder read (ledger.blocked), `reserve` says no and nothing
starts on a GPU (`hold`); the state says why. What an entry claims is capped (bytes at
the GPU's size, threads at the cores) and, when it holds the queue back, named (owner,
pid, file). Only an engine of this machine (the local backend) with GPU slots takes
part; a GPU whose size NVML does not give is placed by slots alone.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from gridrun.engine import packing
from gridrun.engine.backends.base import Slot
from gridrun.engine.entries import REFRESH, Entry, engine_runs, holders, thread_holders
from gridrun.engine.foreign import gpu_keys, owner
from gridrun.engine.ledger import Ledger
from gridrun.engine.placement import Plan, gpu_of
from gridrun.runs import states

log = logging.getLogger("gridrun.engine")


class Sharing:
    def __init__(self, runs_per_gpu: int | str, slots: Sequence[Slot], ledger: Ledger | None = None):
        self.book = packing.Book(runs_per_gpu)
        self.slots = slots  # the engine's very list: a Ray cluster's changes as nodes come and go
        self.ledger = ledger if ledger is not None else Ledger()
        self.others: list[Entry] = []
        self.verified: dict[int, Entry] = {}  # pid -> the entry it is verifiably a run of
        self._published: Any = None
        self.sized = False  # every GPU's size known (else under "auto" a run takes a GPU alone)
        if self.ledger.problem:
            log.warning("%s", self.ledger.problem)

    @property
    def gpus(self) -> list[Any]:
        return list(dict.fromkeys(g for s in self.slots if (g := gpu_of(s)) is not None))

    @classmethod
    def for_engine(cls, runs_per_gpu: Any, slots: Sequence[Slot], local: bool,
                   ledger: Ledger | None = None) -> Sharing | None:
        """The engine's Sharing, or None: GPUs it does not place itself (SLURM), CPU slots.
        `local`: this machine's GPUs, or a Ray cluster's with its ledger (`ledger`)."""
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
            return min(budget, commit) if commit else budget  # a whole GPU: what it was given
        return commit if budget is None and commit and self.sized else None

    def commits(self, active: Mapping[str, Any]) -> dict[Any, int]:
        """GPU -> the bytes this engine's runs commit there."""
        return held(active)[0]

    def verify(self, pids: list[int]) -> set[int]:
        """Of the processes NVML lists (`pids`), those verifiably other engines' runs
        (entries.engine_runs): committed in the ledger, not foreign. Read without the
        lock (reading is safe); a run another engine just started rewrote its entry, so
        it is known."""
        self.others = self.ledger.others(max_age=REFRESH)
        self.verified = engine_runs(pids, self.others)
        return set(self.verified)

    def in_use(self, active: Mapping[str, Any], listed: Iterable[Any]) -> dict[str, tuple[int, int]]:
        """Ledger key -> (the runs' use within what their committer commits there, their
        use beyond it), each committer (this engine, each other engine's entry) apart: a
        run's memory is counted once, and a commitment never hides another's use. Of
        ours, only the processes of runs active now (a sample may predate a run's end)."""
        pids = {a.handle.pid for a in active.values()}
        use: dict[tuple[str, str], int] = {}  # (ledger key, committer) -> bytes listed
        for p in listed:
            key = next((self.book.keys[k] for k in gpu_keys(p.gpu, p.uuid, getattr(p, "node", None))
                        if k in self.book.keys), None)
            if getattr(p, "ours", None) is not None:  # told on its Ray node, where its pid is known
                mine, theirs = p.ours, p.engine
            else:
                entry = self.verified.get(p.pid)
                theirs = entry.file if entry is not None else None
                mine = theirs is None and owner(p.pid, pids)
            if key is None or not p.mem_bytes or (theirs is None and not mine):
                continue
            who = theirs if theirs is not None else ""  # "": this engine
            use[key, who] = use.get((key, who), 0) + p.mem_bytes
        commits = {(self.book.keys.get(g), ""): n for g, n in self.commits(active).items()}
        for entry in self.others:
            for key, n in entry.gpus.items():
                commits[key, entry.file] = min(n, self.sizes().get(key, n))
        out: dict[str, tuple[int, int]] = {}
        for (key, who), n in use.items():
            within = min(n, commits.get((key, who), 0))
            covered, excess = out.get(key, (0, 0))
            out[key] = (covered + within, excess + n - within)
        return out

    def sizes(self) -> dict[str, int]:
        """Ledger key -> the GPU's size."""
        return {key: self.book.totals[g] for g, key in self.book.keys.items() if g in self.book.totals}

    def others_threads(self, cores: int) -> list[int]:
        """The CPU threads other engines' runs hold, each entry at most `cores`."""
        return [min(e.threads, cores) for e in self.others if e.threads]

    def thread_holders(self, cores: int) -> list[dict[str, Any]]:
        """Who holds those threads, for the line that says why the queue waits."""
        return thread_holders(self.others, cores)[:3]

    # ---- placing -----------------------------------------------------------------------

    @contextlib.contextmanager
    def placing(self, active: Mapping[str, Any], foreign: Mapping[Any, int], lock: bool = True,
                listed: Iterable[Any] = ()) -> Iterator[dict[Any, packing.Room] | None]:
        """Under the ledger's lock: each GPU's room (None: a GPU's size is unknown); the
        body `reserve`s what it is about to start. A lock held too long by someone else
        is gone around (ledger.busy) rather than stall the queue. `lock` False (nothing
        to start): the rooms only, for the views. `listed`: the runs' processes NVML
        lists (foreign.Watch.runs), ours and other engines' verified ones."""
        with self.ledger.held() if lock else contextlib.nullcontext():
            self.others = self.ledger.others(max_age=REFRESH)
            theirs = self.committed()
            ours = self.commits(active)
            rooms = self.book.rooms(ours, theirs, foreign, self.gpus, self.in_use(active, listed))
            self.sized = rooms is not None
            if rooms is None and self.book.auto:  # sizes unknown: one run a GPU, as 1 would
                rooms = {g: packing.Room(1, 0 if ours.get(g) else 1, not ours.get(g))
                         for g in self.gpus}
            yield rooms

    def committed(self) -> dict[str, int]:
        """Ledger key -> what other engines commit there, each entry at most the GPU's
        size (a claim beyond it says nothing more than "all of it")."""
        sizes = self.sizes()
        theirs: dict[str, int] = {}
        for entry in self.others:
            for key, n in entry.gpus.items():
                theirs[key] = theirs.get(key, 0) + min(n, sizes.get(key, n))
        return theirs

    def reserve(self, active: Mapping[str, Any], plan: Any, threads: Mapping[str, int]) -> bool:
        """Write what runs and what `plan` is about to start (`threads`: each start's) into
        the ledger: a launch that then fails is dropped by the next `publish`. False
        (fail closed): the ledger cannot be read or our entry written, so nothing may
        start on a GPU (`hold`)."""
        if self.ledger.problem or self.ledger.unread:
            return False
        ours = self.commits(active)
        for run_id, slot in plan.starts:
            for part in slot.parts if plan.commits.get(run_id) else ():
                ours[gpu_of(part)] = ours.get(gpu_of(part), 0) + plan.commits[run_id]
        return self._write(ours, sum(a.threads for a in active.values()) + sum(threads.values()),
                           [a.handle.pid for a in active.values()])

    @staticmethod
    def hold(plan: Plan) -> Plan:
        """Fail closed: of `plan` only what can never start is carried out."""
        return Plan(refused=plan.refused)

    def publish(self, active: Mapping[str, Any]) -> None:
        """This engine's entry in the ledger: what its runs commit now (written again when
        someone removed or changed it)."""
        self._write(self.commits(active), sum(a.threads for a in active.values()),
                    [a.handle.pid for a in active.values()])

    def _write(self, ours: Mapping[Any, int], threads: int, pids: list[int]) -> bool:
        entry = ({self.book.keys.get(g, f"index:{g}"): n for g, n in ours.items()}, threads,
                 sorted(pids))
        if entry == self._published and self.ledger.intact():
            return True
        written = self.ledger.write(*entry)  # a failed write: tried again at the next step
        self._published = entry if written else None
        return written

    def close(self) -> None:
        self.ledger.close()

    # ---- the store state --------------------------------------------------------------

    def state(self, active: Mapping[str, Any], rooms: Mapping[Any, packing.Room] | None,
              foreign: Mapping[Any, int], waits: Mapping[str, Any] | None) -> dict[str, Any]:
        """packing.STATE's value: per GPU its size, what our runs, other engines and
        others' processes take, what is free (and NVML's used memory where that is what
        bounds it); why the first queued run waits, and which entries hold it; why this
        engine cannot use the ledger (nothing starts on a GPU then), and notes."""
        ours, runs = held(active)
        theirs, gpus, named = self.committed(), [], []
        names = {gpu_of(s): s.name.partition(".")[0] for s in self.slots}  # gpu1, node2:gpu1
        for gpu in self.gpus:
            room, key, total = (rooms or {}).get(gpu), self.book.keys.get(gpu), self.book.totals.get(gpu)
            others, used = min(theirs.get(key, 0), total or 0), self.book.used.get(gpu)
            mine, theirs_foreign = ours.get(gpu, 0), foreign.get(gpu, 0)
            bound = room is not None and total is not None and used is not None and \
                room.free < total - mine - others - theirs_foreign
            gpus.append({"gpu": gpu, "name": names.get(gpu), "total": total, "ours": mine, "runs": runs.get(gpu, 0),
                         "others": others, "foreign": theirs_foreign,
                         "free": room.free if room and total else None,
                         "used": used if bound else None})
            named += [{**h, "gpu": gpu} for h in holders(self.others, key, total)]
        wait = dict(waits) if waits else None
        if wait is not None:
            wait["others"] = sum(g["others"] for g in gpus)
            wait["holders"] = sorted(named, key=lambda h: -h["bytes"])[:3]
        notes = [n for n in (self.ledger.removed, *self.ledger.notes()) if n]
        return {"mode": "auto" if self.book.auto else "slots", "gpus": coarse(gpus),
                "waits": wait, "ledger": self.ledger.blocked or self.ledger.busy,
                "notes": notes, "folder": str(self.ledger.folder)}


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
