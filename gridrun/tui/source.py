"""What the interface reads and asks: a small Protocol, frozen rows, and a fake.

The app never sees SQL or files. It gets a `Source` (the real one wraps the
store, see store_source.py; tests pass `FakeSource`, which replays scripted
snapshots and records every action).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

ACTIVE = ("queued", "running")
RETRYABLE = ("failed", "diverged", "oom", "cancelled")


@dataclass(frozen=True)
class RunRow:
    id: str
    experiment: str
    variant: str
    seed: int
    status: str
    priority: int = 0
    step: int = 0
    total_steps: int | None = None
    epoch: int = 0
    epochs: int | None = None
    train_loss: float | None = None
    best: float | None = None  # best validation value of the early-stop metric
    best_name: str = ""
    best_direction: str = ""  # "higher" or "lower", as the task declares it ("" when not known)
    samples_per_s: float | None = None
    slot: str | None = None  # as the store keeps it: "gpu0", or "gpu0+gpu1" for a run on two
    devices: int = 1  # how many it trains on at once (trainer.devices; analysis/devices.py)
    ends_at: float | None = None  # when a running run should end, at its recent pace
    queued_at: float = 0.0
    started_at: float | None = None
    ended_at: float | None = None
    note: str | None = None
    flags: tuple[str, ...] = ()  # progress.INPUT_BOUND, progress.MEMORY_CREEP
    rungs: tuple[int, ...] = ()  # a search's trial under a scheduler: its rungs' epochs, the last max
    trial: int | None = None  # a search's trial: its index


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory as the engine's memory book last said it (bytes; engine/packing.py)."""

    ours: float | None = None  # committed by this engine's runs
    runs: int = 0  # how many of them
    engines: float | None = None  # committed by other gridrun engines (the machine-wide ledger)
    others: float | None = None  # used by other people's processes
    free: float | None = None  # None: the GPU's size is not known


@dataclass(frozen=True)
class MemoryWait:
    """Why the first queued run waits for GPU memory (bytes)."""

    run_id: str = ""
    need: float | None = None  # None: a shape never measured, which wants a GPU of its own
    free: float | None = None  # the most any GPU has free
    engines: float | None = None  # what other gridrun engines commit
    busy: str = ""  # the ledger was held too long: the engine's one line, instead of the above


@dataclass(frozen=True)
class GpuRow:
    index: int
    name: str
    util: float | None = None  # percent
    mem_used: float | None = None  # bytes
    mem_total: float | None = None
    power: float | None = None  # watts
    temp: float | None = None  # celsius
    runs: tuple[str, ...] = ()
    history: tuple[float, ...] = ()  # utilisation over the last minute
    others: tuple[str, ...] = ()  # other users' processes taking it: "alice 20.0 GiB"
    shared: bool = False  # [engine] foreign = "share": new runs start there anyway
    memory: GpuMemory | None = None  # runs packed by memory: who holds what (None: not said)
    node: str | None = None  # the Ray node it is on (None on one machine): every node has a gpu0

    @property
    def label(self) -> str:
        """How the panel names it: "gpu0", or "node2:gpu0" on a Ray node (tui/gpus.py)."""
        return f"{self.node}:gpu{self.index}" if self.node else f"gpu{self.index}"


@dataclass(frozen=True)
class Machine:
    """GPUs when there are any; CPU and RAM otherwise (and always, for the header)."""

    gpus: tuple[GpuRow, ...] = ()
    cpu_percent: float | None = None
    ram_used: float | None = None
    ram_total: float | None = None
    cpu_history: tuple[float, ...] = ()
    memory_wait: MemoryWait | None = None  # the queue waits for GPU memory
    ledger: str = ""  # why this engine does not coordinate its GPUs with other engines


@dataclass(frozen=True)
class EngineState:
    running: bool = False
    paused: bool = False
    counts: Mapping[str, int] = field(default_factory=dict)
    not_responding: int | None = None  # seconds since the running engine's last heartbeat, if stale
    waiting_for_space: bool = False  # the disk is full: it launches nothing until there is space


@dataclass(frozen=True)
class Update:
    """What changed since the previous poll. None means "unchanged"."""

    runs: tuple[RunRow, ...] = ()
    engine: EngineState | None = None
    machine: Machine | None = None
    notice: str | None = None  # something the user must know, e.g. an empty store beside run folders
    removed: tuple[str, ...] = ()  # ids taken out of the store (`gridrun rm`, x)


@dataclass(frozen=True)
class Verdict:
    """The last `gridrun verify` of a run: 'bitwise identical over 186 steps' or 'differs at step 40 loss'."""

    ok: bool
    text: str
    when: float | None = None


@dataclass(frozen=True)
class RunMemory:
    """A run's memory (bytes): the budget the engine gave it and what it measured."""

    budget: float | None = None  # enforced (Run.placement), else its summary's
    peak: float | None = None  # CUDA's reserved peak, else the allocated (RSS on the CPU) one
    needed: float | None = None  # what it needed when it outgrew its budget
    retried: float | None = None  # the budget it was retried with after that


@dataclass(frozen=True)
class RunDetail:
    config: Mapping[str, Any]
    summary: Mapping[str, Any] | None
    error: str | None
    notes: tuple[str, ...] = ()  # what the reader left out, e.g. unreadable metrics lines
    verdict: Verdict | None = None
    where: str = ""  # a SLURM job's id, state, node and GPUs (Run.where); "" on this machine
    memory: RunMemory | None = None  # its GPU memory budget and what it measured


@dataclass(frozen=True)
class Plan:
    """An experiment file checked by `gridrun plan --json`: its runs, or its errors."""

    path: str
    runs: tuple[Mapping[str, Any], ...] = ()
    errors: str = ""

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class TaskCheck:
    """An experiment file's tasks checked by `gridrun plan --check --json`: one line per
    problem (a task that would fail or not train), notes that never block, or why the
    check itself could not run."""

    path: str
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    error: str = ""
    seconds: float | None = None

    @property
    def ok(self) -> bool:
        return not self.problems and not self.error


@dataclass(frozen=True)
class Table:
    """A ready-to-show ablation table (or a search's leaderboard): text cells, and the
    cells to highlight."""

    experiment: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    best: frozenset[tuple[int, int]] = frozenset()
    note: str = ""
    kind: str = "ablation"  # or "leaderboard": a search's trials, best first
    names: int = 0  # the first columns name the rows (an ablation's keys and seeds)
    lead: tuple[int, ...] = ()  # the early-stop metric's columns (value, Δ, p): first after them


@dataclass(frozen=True)
class Leaders:
    """A search's best trials as `gridrun compare` ranks them: their runs (a trial's seeds
    side by side), best first."""

    experiment: str
    metric: str = ""
    mode: str = ""  # "min" or "max"
    trials: int = 0  # in the whole search
    shown: int = 0  # trials whose runs are in `ids`
    ids: tuple[str, ...] = ()


class Source(Protocol):
    root: Path

    def poll(self) -> Update: ...
    def metrics(self, run_id: str, offset: int) -> tuple[list[dict[str, Any]], int]: ...
    def output_tail(self, run_id: str, max_bytes: int = 8192) -> str: ...
    def detail(self, run_id: str) -> RunDetail: ...
    def cancel(self, ids: Sequence[str]) -> str: ...
    def retry(self, ids: Sequence[str], fresh: bool = False) -> str: ...
    def bump_priority(self, ids: Sequence[str], delta: int) -> str: ...
    def remove(self, ids: Sequence[str], delete_folders: bool = False) -> str: ...
    def set_paused(self, paused: bool) -> str: ...
    def start_engine(self) -> str: ...
    def plan(self, path: str) -> Plan: ...
    def check_tasks(self, path: str) -> TaskCheck: ...
    def queue_file(self, path: str) -> str: ...
    def clone(self, run_id: str, override: str) -> str: ...
    def compare(self, experiment: str) -> Table: ...
    def compare_sources(self, experiment: str) -> Table: ...
    def best_trials(self, experiment: str, k: int) -> Leaders: ...
    def export_csv(self, experiment: str, path: str, *, force: bool = False) -> str: ...
    def export_model(self, run_id: str) -> str: ...


class FakeSource:
    """Replays `snapshots` (one Update per poll, then nothing new) and records
    each action in `actions`. Actions change the fake's own rows, so the
    interface shows their effect just as with a real store."""

    def __init__(self, snapshots: Sequence[Update] = (), *, root: str | Path = "/tmp/runs",
                 metrics: Mapping[str, list[dict[str, Any]]] | None = None,
                 details: Mapping[str, RunDetail] | None = None,
                 plans: Mapping[str, Plan] | None = None, tables: Mapping[str, Table] | None = None,
                 output: Mapping[str, str] | None = None,
                 checks: Mapping[str, TaskCheck] | None = None):
        self.root = Path(root)
        self._snapshots = list(snapshots)
        self._metrics = dict(metrics or {})
        self._details = dict(details or {})
        self._plans = dict(plans or {})
        self._checks = dict(checks or {})  # a path not named here passes
        self._tables = dict(tables or {})
        self._output = dict(output or {})
        self.actions: list[tuple[Any, ...]] = []
        self.rows: dict[str, RunRow] = {}
        self.engine = EngineState()
        self._pending: list[RunRow] = []
        self._removed: list[str] = []
        self._engine_changed = False

    def poll(self) -> Update:
        if self._snapshots:
            update = self._snapshots.pop(0)
            self.rows.update({r.id: r for r in update.runs})
            self.engine = update.engine or self.engine
            return Update(runs=(*update.runs, *self._take()), engine=update.engine,
                          machine=update.machine, removed=self._take_removed())
        engine, self._engine_changed = (self.engine if self._engine_changed else None), False
        return Update(runs=self._take(), engine=engine, removed=self._take_removed())

    def _take_removed(self) -> tuple[str, ...]:
        removed, self._removed = tuple(self._removed), []
        return removed

    def _take(self) -> tuple[RunRow, ...]:
        pending, self._pending = tuple(self._pending), []
        return pending

    def _change(self, run_id: str, **fields: Any) -> None:
        row = replace(self.rows[run_id], **fields)
        self.rows[run_id] = row
        self._pending.append(row)

    def metrics(self, run_id: str, offset: int) -> tuple[list[dict[str, Any]], int]:
        records = self._metrics.get(run_id, [])
        return records[offset:], len(records)

    def output_tail(self, run_id: str, max_bytes: int = 8192) -> str:
        return self._output.get(run_id, "")[-max_bytes:]

    def detail(self, run_id: str) -> RunDetail:
        return self._details.get(run_id, RunDetail(config={}, summary=None, error=None))

    def cancel(self, ids: Sequence[str]) -> str:
        self.actions.append(("cancel", tuple(ids)))
        for i in ids:
            self._change(i, status="cancelled")
        return f"cancelled {len(ids)}"

    def retry(self, ids: Sequence[str], fresh: bool = False) -> str:
        self.actions.append(("retry", tuple(ids), fresh) if fresh else ("retry", tuple(ids)))
        for i in ids:
            self._change(i, status="queued")
        return f"queued {len(ids)} again"

    def bump_priority(self, ids: Sequence[str], delta: int) -> str:
        self.actions.append(("priority", tuple(ids), delta))
        for i in ids:
            self._change(i, priority=self.rows[i].priority + delta)
        return f"priority {delta:+d}"

    def remove(self, ids: Sequence[str], delete_folders: bool = False) -> str:
        self.actions.append(("remove", tuple(ids), delete_folders) if delete_folders
                            else ("remove", tuple(ids)))
        gone = [i for i in ids if self.rows.get(i) and self.rows[i].status != "running"]
        for i in gone:
            del self.rows[i]
        self._removed += gone
        return f"removed {len(gone)} of {len(ids)}"

    def set_paused(self, paused: bool) -> str:
        self.actions.append(("pause" if paused else "resume",))
        self.engine, self._engine_changed = replace(self.engine, paused=paused), True
        return "paused" if paused else "resumed"

    def start_engine(self) -> str:
        self.actions.append(("start_engine",))
        self.engine, self._engine_changed = replace(self.engine, running=True), True
        return "engine started"

    def plan(self, path: str) -> Plan:
        self.actions.append(("plan", path))
        return self._plans.get(path, Plan(path, errors=f"{path}: no such file"))

    def check_tasks(self, path: str) -> TaskCheck:
        self.actions.append(("check", path))
        return self._checks.get(path, TaskCheck(path, seconds=0.1))

    def queue_file(self, path: str) -> str:
        self.actions.append(("queue", path))
        return f"queued {len(self._plans[path].runs)} runs from {path}"

    def clone(self, run_id: str, override: str) -> str:
        self.actions.append(("clone", run_id, override))
        return f"queued a clone of {run_id} with {override}"

    def compare(self, experiment: str) -> Table:
        self.actions.append(("compare", experiment))
        return self._tables.get(experiment, Table(experiment, ("variant",), ()))

    def compare_sources(self, experiment: str) -> Table:
        """The table keyed `"EXPERIMENT by source"` in `tables`."""
        self.actions.append(("compare_sources", experiment))
        return self._tables.get(f"{experiment} by source",
                                Table(experiment, ("",), (), note="no sources vary"))

    def best_trials(self, experiment: str, k: int) -> Leaders:
        """Trials ranked as compare does: the furthest trained first, then the best value."""
        by_trial: dict[int, list[RunRow]] = {}
        for r in self.rows.values():
            if r.experiment == experiment and r.trial is not None:
                by_trial.setdefault(r.trial, []).append(r)
        lower = all(r.best_direction != "higher" for rs in by_trial.values() for r in rs)

        def rank(trial: int) -> tuple:
            rows = by_trial[trial]
            best = [r.best for r in rows if r.best is not None]
            value = sum(best) / len(best) if best else None
            return (-max(r.epoch for r in rows), value is None,
                    0.0 if value is None else value if lower else -value, trial)
        top = sorted(by_trial, key=rank)[:k]
        metric = next((r.best_name for rs in by_trial.values() for r in rs if r.best_name), "")
        return Leaders(experiment, metric, "min" if lower else "max", len(by_trial), len(top),
                       tuple(r.id for t in top for r in by_trial[t]))

    def export_model(self, run_id: str) -> str:
        self.actions.append(("export_model", run_id))
        return f"exported {run_id} to {self.root}/{run_id}/export/best/model.onnx: parity ok"

    def export_csv(self, experiment: str, path: str, *, force: bool = False) -> str:
        if Path(path).is_symlink():
            raise ValueError(f"refusing to write {path}: it is a symbolic link")
        if Path(path).exists() and not force:
            raise FileExistsError(f"{path} exists")
        self.actions.append(("export", experiment, path))
        table = self.compare(experiment)
        lines = [",".join(table.columns), *(",".join(r) for r in table.rows)]
        Path(path).write_text("\n".join(lines) + "\n")
        return path
