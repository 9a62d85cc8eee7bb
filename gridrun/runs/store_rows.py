"""What the store's rows are in Python: a run (`Run`), an intent, a telemetry
sample, and the conversions between them and their SQLite columns (JSON for
the structured ones). The SQL itself stays in store.py."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridrun.runs import layout, states
from gridrun.spec import RunSpec


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
        """Where a backend placed it, for people: "slurm job 12 RUNNING on node7 (GPUs 0)";
        "" when it ran on this machine. The one wording `ls` and the interface show; the
        job's state only while the run runs (after, it is the last one seen, not news)."""
        p = self.placement or {}
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
