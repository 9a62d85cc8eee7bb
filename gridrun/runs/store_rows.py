"""What the store's rows are in Python: a run (`Run`), an intent, a telemetry
sample, and the conversions between them and their SQLite columns (JSON for
the structured ones); whether a foreground run's process is gone. The SQL itself
stays in store.py."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridrun.runs import layout, states
from gridrun.runs.store_db import StoreError
from gridrun.spec import RunSpec

# The run's lock file, held by whatever process executes the run (engine/backends/child.py)
RUN_LOCK = ".gridrun-lock"
# a foreground run whose `gridrun train` is gone: the engine's words (scheduler.py) too
FOREGROUND_GONE = ("interrupted: its foreground process (pid {pid}) was gone; returned to the "
                   "queue, resumes from its checkpoint")


class RunNotFound(KeyError):
    """No run, or more than one, matches an id prefix. str() is the message."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Run:
    """One row of `runs`. `config` is `RunSpec.to_dict()` (the resolved config)."""

    id: str
    experiment: str
    variant: str
    ablation: str
    seed: int
    config: Mapping[str, Any]
    status: str
    priority: int
    attempt: int  # 1, then +1 for each retry or forced re-run
    retries: int  # automatic retries (max_retries) spent in this attempt
    restarts: int  # times its process died under it and it was requeued
    fresh: bool  # the next launch ignores checkpoints
    not_before: float  # backoff: not launched before this unix time
    slot: str | None  # "cpu0", "gpu1", ... while running; FOREGROUND under `gridrun train`
    pid: int | None
    pid_start_time: float | None
    queued_at: float
    started_at: float | None
    ended_at: float | None
    error: str | None  # the exception and the output tail of a failed run
    note: str | None  # the latest thing that happened to it, for people
    summary: Mapping[str, Any] | None  # summary.json at the end
    provenance: Mapping[str, Any] | None  # git commit, dirty flag, diff hash
    adjustments: tuple[Mapping[str, Any], ...]  # e.g. the OOM retry's batch change
    seq: int
    placement: Mapping[str, Any] | None = None  # {"backend": "slurm", "job_id", "node", "state", "gpus"}

    @property
    def spec(self) -> RunSpec:
        return RunSpec.from_dict(self.config)

    def run_dir(self, root: str | os.PathLike) -> Path:
        return layout.run_dir(root, self.experiment, self.id)

    @property
    def where(self) -> str:
        """Where a backend placed it, for people: "slurm job 12 RUNNING on node7 (GPUs 0)",
        "ray on node2:gpu1";
        "" when it ran on this machine. The one wording `ls` and the interface show; the
        job's state only while the run runs (after, it is the last one seen, not news)."""
        p = self.placement or {}
        if p.get("backend") == "ray" and p.get("node"):  # its slot names node and GPU
            return f"ray on {p.get('slot') or p['node']}"
        if not p.get("job_id"):
            return ""
        text = f"{p.get('backend', '')} job {p['job_id']}".strip()
        if p.get("state") and self.status == states.RUNNING:
            text += f" {p['state']}"
        if p.get("node"):
            text += f" on {p['node']}"
        if p.get("gpus"):
            text += f" (GPUs {p['gpus']})"
        return text

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["config"], d["adjustments"] = dict(self.config), list(self.adjustments)
        return d


@dataclass(frozen=True)
class Intent:
    id: int
    kind: str  # cancel | retry | priority | pause | resume | remove
    run_id: str | None
    value: Any
    created_at: float
    applied_at: float | None
    outcome: str | None


@dataclass(frozen=True)
class TelemetrySample:
    t: float
    data: Mapping[str, Any]  # whatever Telemetry().sample() returned


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


def to_columns(fields: dict[str, Any]) -> dict[str, Any]:
    """Fields as their columns hold them: JSON ones (summary, config, adjustments,
    provenance) may be given as Python values, `fresh` as a bool; keys sorted, but a
    config's in its own order (a search's keys as the file lists them)."""
    if isinstance(fields.get("config"), dict):  # as enqueue writes it: the file's key order
        fields["config"] = json.dumps(fields["config"])
    for key in ("summary", "adjustments", "provenance", "placement"):
        if key in fields and not isinstance(fields[key], str | None):
            fields[key] = dumps(list(fields[key]) if key == "adjustments" else fields[key])
    if "fresh" in fields:
        fields["fresh"] = int(fields["fresh"])
    return fields


def run_of(row: sqlite3.Row) -> Run:
    d = dict(row)
    d["config"] = json.loads(d["config"])
    d["summary"], d["provenance"] = loads(d["summary"]), loads(d["provenance"])
    d["placement"] = loads(d.get("placement"))
    d["adjustments"] = tuple(loads(d["adjustments"]) or ())
    d["fresh"] = bool(d["fresh"])
    return Run(**d)


def foreground_gone(run: Run, root: str | os.PathLike) -> bool:
    """Whether the `gridrun train` process of a running foreground run is gone for sure:
    its pid is no longer that process (its start time differs, or a zombie) and nobody
    holds the run's lock (a process on another machine of a shared root would). What
    cannot be told (a lock file this user cannot open) reads as alive."""
    import psutil

    if not run.pid:
        return False
    try:
        proc = psutil.Process(run.pid)
        same = not run.pid_start_time or abs(proc.create_time() - run.pid_start_time) <= 0.5
        if same and proc.status() != psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        pass
    except (psutil.Error, ValueError):  # there, but not ours to look at
        return False
    try:
        fd = os.open(run.run_dir(root) / RUN_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # taken for an instant: nobody holds it
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def end_gone(store: Any, running: list[Run]) -> None:
    """Of `store`'s running foreground runs, those whose process is gone go back to the
    queue, as the engine returns them (its words, in engine.log when it is the reader),
    instead of showing `running` until someone trains them again."""
    for run in running:
        if foreground_gone(run, store.root):
            note = FOREGROUND_GONE.format(pid=run.pid)
            with contextlib.suppress(StoreError, sqlite3.Error):  # a reader reads on
                if store.end_foreground(run.id, run.pid, states.QUEUED, note=note):
                    logging.getLogger("gridrun.engine").info("%s %s", run.id, note)
