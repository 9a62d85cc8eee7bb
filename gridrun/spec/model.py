"""What a file becomes: the frozen shapes (RunSpec, ExperimentSpec, EngineConfig),
a run's id and its `config.toml`."""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w

from gridrun.spec.keys import in_run_id

if TYPE_CHECKING:
    from gridrun.spec.search import SearchSpec


@dataclass(frozen=True)
class RunSpec:
    """One run: a cell of the matrix at one seed, fully resolved.

    `variant` names only the axes that vary within the experiment
    ("lr=0.001 hidden=64"; for ablations the variant's name, "baseline" for
    the baseline); `axes` holds those values. `ablation` is the ablation
    variant's name ("baseline" for the baseline) or "" in an experiment
    without ablations.

    A trial of a search (spec/search.py) also has its index `trial`, its search's
    settings `search` (SearchSpec.run_config) and, under a scheduler, `pause_at`:
    the epoch it waits at for the rung's decision. `pause_at` changes as the trial
    is promoted and is not part of the id; none of the three is written when unset,
    so the ids and configs of runs outside a search are what they were.
    """

    id: str
    experiment: str
    variant: str
    seed: int
    task: str
    trainer: Mapping[str, Any]
    task_args: Mapping[str, Any]
    axes: Mapping[str, Any]
    ablation: str = ""
    trial: int | None = None
    search: Mapping[str, Any] | None = None
    pause_at: int | None = None

    @property
    def config(self) -> dict[str, Any]:
        """The flat resolved config: task, every trainer key, every task key."""
        return {"task": self.task, **self.trainer, **self.task_args}

    def to_dict(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.trial is not None:
            extra.update(trial=self.trial, search=dict(self.search or {}))
        if self.pause_at is not None:
            extra["pause_at"] = self.pause_at
        return {
            "id": self.id,
            "experiment": self.experiment,
            "variant": self.variant,
            "ablation": self.ablation,
            "seed": self.seed,
            "task": self.task,
            "trainer": dict(self.trainer),
            "task_args": dict(self.task_args),
            "axes": dict(self.axes),
            **extra,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunSpec:
        return cls(
            id=d["id"], experiment=d["experiment"], variant=d["variant"], seed=int(d["seed"]),
            task=d["task"], trainer=dict(d["trainer"]), task_args=dict(d.get("task_args", {})),
            axes=dict(d.get("axes", {})), ablation=d.get("ablation", ""),
            trial=d.get("trial"), search=d.get("search") or None, pause_at=d.get("pause_at"),
        )

    def with_trainer(self, **changes: Any) -> RunSpec:
        """The same run (same id) with some trainer keys changed, e.g. an OOM retry."""
        return RunSpec(**{**self.__dict__, "trainer": {**self.trainer, **changes}})

    def paused_at(self, epoch: int | None) -> RunSpec:
        """The same run (same id) told to wait at `epoch` (None: train to the end)."""
        return RunSpec(**{**self.__dict__, "pause_at": epoch})


def run_id(experiment: str, task: str, trainer: Mapping[str, Any], task_args: Mapping[str, Any],
           seed: int, *, search: str | None = None, trial: int | None = None) -> str:
    """A short content hash, independent of key order, float spelling and file location.
    A search's trial adds its search's id and its index (two trials that drew the same
    values are still two trials)."""
    content: dict[str, Any] = {
        "experiment": experiment,
        "task": task,
        "trainer": in_run_id(trainer),
        "task_args": dict(task_args),
        "seed": seed,
    }
    if search is not None:
        content.update(search=search, trial=trial)
    blob = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def write_run_config(path: str | Path, run: RunSpec) -> None:
    """`config.toml` of a run folder, written atomically, 0600, never through a
    symlink (a symlink at the temporary name is refused; one at `path` is replaced)."""
    path = Path(path)
    tmp = path.with_suffix(".toml.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(fd, 0o600)
            f.write(tomli_w.dumps(run.to_dict()))
        os.replace(tmp, path)
    except BaseException:  # a full disk, say: no half-written file is left behind
        tmp.unlink(missing_ok=True)
        raise


def read_run_config(path: str | Path) -> RunSpec:
    with open(path, "rb") as f:
        return RunSpec.from_dict(tomllib.load(f))


def parse_run_config(data: bytes) -> RunSpec:
    """A config.toml's bytes (read by a caller that never follows a link) as a RunSpec."""
    return RunSpec.from_dict(tomllib.loads(data.decode()))


@dataclass(frozen=True)
class EngineConfig:
    """The optional `[engine]` table: how runs execute (never part of a run id)."""

    gpus: str | tuple[int, ...] = "auto"
    runs_per_gpu: int | str = 1  # or "auto": packed by measured memory (engine/packing.py)
    cpu_slots: int = 2
    foreign: str = "avoid"  # a GPU another user computes on: "avoid" it or "share" it
    backend: str = "local"
    ray_address: str = "auto"
    # backend = "slurm" (backends/slurm.py); None leaves it to the cluster's defaults
    partition: str | None = None
    gpus_per_run: int = 1
    cpus_per_run: int = 1
    mem: str | None = None  # sbatch --mem, e.g. "16G"
    time: str | None = None  # sbatch --time, e.g. "4:00:00"; minutes when a number
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    max_jobs: int = 8  # runs pending or running on the cluster at once
    runs_per_job: int = 1  # runs one job runs one after another
    slurm_args: Mapping[str, Any] = field(default_factory=dict)  # any other sbatch option

    @classmethod
    def default(cls) -> EngineConfig:
        return cls()


@dataclass(frozen=True)
class ExperimentSpec:
    """One `[experiments.NAME]` table, validated, before expansion."""

    name: str
    task: str
    keys: Mapping[str, Any]  # defaults merged with the experiment's own keys
    grid: Mapping[str, tuple[Any, ...]]
    zip: Mapping[str, tuple[Any, ...]]
    ablations: Mapping[str, Mapping[str, Any]]
    seeds: tuple[int, ...]
    task_defaults: Mapping[str, Any] = field(default_factory=dict)  # from the factory's signature
    search: SearchSpec | None = None  # [experiments.NAME.search]


def format_value(v: Any) -> str:
    if isinstance(v, float):
        short = f"{v:g}"
        return short if float(short) == v else repr(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ",".join(format_value(x) for x in v) + "]"
    return str(v)
