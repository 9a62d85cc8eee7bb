"""The experiment file: TOML -> validated ExperimentSpec -> one RunSpec per cell and seed.

This module never imports torch, so `gridrun plan` and the TUI stay fast; checking
task keys imports the task factory's module (and whatever that imports).
Validation lives in spec_validate.py, error formatting in spec_errors.py.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import json
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from gridrun.engine.spec_errors import Problem, SpecError

__all__ = [
    "TRAINER_KEYS", "EngineConfig", "ExperimentSpec", "Key", "Problem", "RunSpec", "SpecError",
    "count_runs", "expand", "load_engine_config", "load_experiments", "load_runs",
    "read_run_config", "run_id", "write_run_config",
]


@dataclass(frozen=True)
class Key:
    """One trainer key: its TOML type, default, allowed values and meaning."""

    name: str
    type: str  # "integer" | "float" | "string" | "boolean" | "array of 2 floats" | "float or integer" | "boolean or \"auto\""
    default: Any
    doc: str
    choices: tuple[Any, ...] = ()
    min: float | None = None  # inclusive
    max: float | None = None  # inclusive
    above: float | None = None  # exclusive lower bound
    below: float | None = None  # exclusive upper bound
    affects_results: bool = True  # False: left out of the run id


TRAINER_KEYS: dict[str, Key] = {k.name: k for k in [
    Key("epochs", "integer", 10, "passes over the training data", min=1),
    Key("max_steps", "integer", 0, "stop after this many optimizer steps (0: no cap)", min=0),
    Key("batch_size", "integer", 64, "samples per micro-batch", min=1),
    Key("lr", "float", 1e-3, "peak learning rate", above=0),
    Key("optimizer", "string", "adamw", "the optimizer", choices=("adamw", "adam", "sgd")),
    Key("momentum", "float", 0.9, "SGD momentum", min=0, below=1),
    Key("nesterov", "boolean", False, "Nesterov momentum (sgd)"),
    Key("betas", "array of 2 floats", [0.9, 0.999], "Adam(W) betas, each in [0, 1)"),
    Key("weight_decay", "float", 0.0, "weight decay (decoupled for adamw)", min=0),
    Key("schedule", "string", "cosine", "learning-rate schedule after warmup",
        choices=("cosine", "linear", "step", "constant", "onecycle")),
    Key("warmup", "float or integer", 0.0,
        "linear warmup: a float in [0, 1) is a fraction of all steps, an integer a step count", min=0),
    Key("min_lr", "float", 0.0, "the floor of cosine and linear decay", min=0),
    Key("step_size", "integer", 1000, "steps between decays of the step schedule", min=1),
    Key("gamma", "float", 0.1, "decay factor of the step schedule", above=0, max=1),
    Key("precision", "string", "auto", "auto: bf16 on CUDA devices that support it, else fp32; "
        "fp16 uses a GradScaler", choices=("auto", "fp32", "bf16", "fp16")),
    Key("accumulate", "integer", 1, "micro-batches per optimizer step (the loss is divided by it)", min=1),
    Key("clip_grad", "float", 0.0, "clip the global gradient norm to this (0: off)", min=0),
    Key("eval_every", "integer", 0, "evaluate every this many steps (0: at each epoch end)", min=0),
    Key("log_every", "integer", 10, "write a train line every this many steps", min=1),
    Key("checkpoint_every", "integer", 0, "checkpoint every this many steps (0: epoch ends only)",
        min=0, affects_results=False),
    Key("early_stop_patience", "integer", 0, "stop after this many evaluations without improvement (0: off)", min=0),
    Key("early_stop_metric", "string", "", "validation metric for early stopping and best.pt "
        "(empty: the task's first metric)"),
    Key("deterministic", "boolean", True, "deterministic algorithms (bitwise-reproducible on CUDA)"),
    Key("detect_anomaly", "boolean", False, "autograd anomaly detection (slow; for debugging)",
        affects_results=False),
    Key("compile", "boolean", False, "wrap the model in torch.compile"),
    Key("num_workers", "integer", 0, "DataLoader worker processes", min=0, affects_results=False),
    Key("pin_memory", "boolean or \"auto\"", "auto", "pinned host memory (auto: on with CUDA)",
        affects_results=False),
    Key("prefetch_factor", "integer", 2, "batches prefetched per worker (with num_workers > 0)",
        min=1, affects_results=False),
    Key("persistent_workers", "boolean", False, "keep DataLoader workers between epochs",
        affects_results=False),
    Key("max_retries", "integer", 0, "times the engine retries a failed run", min=0,
        affects_results=False),
]}


@dataclass(frozen=True)
class RunSpec:
    """One run: a cell of the matrix at one seed, fully resolved.

    `variant` names only the axes that vary within the experiment
    ("lr=0.001 hidden=64"; for ablations the variant's name, "baseline" for
    the baseline); `axes` holds those values. `ablation` is the ablation
    variant's name ("baseline" for the baseline) or "" in an experiment
    without ablations.
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

    @property
    def config(self) -> dict[str, Any]:
        """The flat resolved config: task, every trainer key, every task key."""
        return {"task": self.task, **self.trainer, **self.task_args}

    def to_dict(self) -> dict[str, Any]:
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
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunSpec:
        return cls(
            id=d["id"], experiment=d["experiment"], variant=d["variant"], seed=int(d["seed"]),
            task=d["task"], trainer=dict(d["trainer"]), task_args=dict(d.get("task_args", {})),
            axes=dict(d.get("axes", {})), ablation=d.get("ablation", ""),
        )

    def with_trainer(self, **changes: Any) -> RunSpec:
        """The same run (same id) with some trainer keys changed, e.g. an OOM retry."""
        return RunSpec(**{**self.__dict__, "trainer": {**self.trainer, **changes}})


def run_id(experiment: str, task: str, trainer: Mapping[str, Any], task_args: Mapping[str, Any],
           seed: int) -> str:
    """A short content hash, independent of key order, float spelling and file location."""
    content = {
        "experiment": experiment,
        "task": task,
        "trainer": {k: v for k, v in trainer.items()
                    if k not in TRAINER_KEYS or TRAINER_KEYS[k].affects_results},
        "task_args": dict(task_args),
        "seed": seed,
    }
    blob = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def write_run_config(path: str | Path, run: RunSpec) -> None:
    """`config.toml` of a run folder, written atomically, 0600, never through a
    symlink (a symlink at the temporary name is refused; one at `path` is replaced)."""
    path = Path(path)
    tmp = path.with_suffix(".toml.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(fd, 0o600)
        f.write(tomli_w.dumps(run.to_dict()))
    os.replace(tmp, path)


def read_run_config(path: str | Path) -> RunSpec:
    with open(path, "rb") as f:
        return RunSpec.from_dict(tomllib.load(f))


# --------------------------------------------------------------------------- files -> runs

DEFAULT_CAP = 10_000  # runs one file may queue without --force
MAX_RUNS = 100_000  # ... and with it: a bigger matrix is a mistake, refused before it is built


@dataclass(frozen=True)
class EngineConfig:
    """The optional `[engine]` table: how runs execute (never part of a run id)."""

    gpus: str | tuple[int, ...] = "auto"
    runs_per_gpu: int = 1
    cpu_slots: int = 2
    backend: str = "local"
    ray_address: str = "auto"

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


def format_value(v: Any) -> str:
    if isinstance(v, float):
        short = f"{v:g}"
        return short if float(short) == v else repr(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ",".join(format_value(x) for x in v) + "]"
    return str(v)


def _label(axes: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={format_value(v)}" for k, v in axes.items())


def _task_defaults(task: str) -> dict[str, Any]:
    from gridrun.engine import tasks

    out = {}
    for p in inspect.signature(tasks.resolve(task)).parameters.values():
        if p.default is not p.empty and isinstance(p.default, bool | int | float | str):
            out[p.name] = p.default
    return out


def count_runs(exp: ExperimentSpec) -> int:
    """How many runs `expand(exp)` gives, from the axis lengths alone (nothing is built)."""
    cells = math.prod(len(v) for v in exp.grid.values())
    if exp.zip:
        cells *= len(next(iter(exp.zip.values())))
    variants = 1 + len(exp.ablations) if exp.ablations else 1  # the baseline runs too
    return cells * variants * len(exp.seeds)


def expand(exp: ExperimentSpec) -> list[RunSpec]:
    """One RunSpec per cell and seed: defaults < experiment < ablation < grid/zip cell."""
    grid_keys = list(exp.grid)
    cells = [dict(zip(grid_keys, values, strict=True))
             for values in itertools.product(*(exp.grid[k] for k in grid_keys))]
    n_zip = len(next(iter(exp.zip.values()))) if exp.zip else 0
    if exp.zip:
        rows = [{k: v[i] for k, v in exp.zip.items()} for i in range(n_zip)]
        cells = [{**cell, **row} for cell in cells for row in rows]
    varying = [k for k in [*exp.grid, *exp.zip] if len(set(map(repr, (exp.grid | exp.zip)[k]))) > 1]
    variants = [("baseline", {}), *exp.ablations.items()] if exp.ablations else [("", {})]
    task_defaults = _task_defaults(exp.task)
    runs = []
    for ablation, overrides in variants:
        for cell in cells:
            resolved = {**exp.keys, **overrides, **cell}
            trainer = {k: key.default for k, key in TRAINER_KEYS.items()}
            trainer.update({k: v for k, v in resolved.items() if k in TRAINER_KEYS})
            task_args = {**task_defaults, **{k: v for k, v in resolved.items() if k not in TRAINER_KEYS}}
            axes = {k: cell[k] for k in varying}
            label = " ".join(x for x in (ablation, _label(axes)) if x)
            for seed in exp.seeds:
                runs.append(RunSpec(
                    id=run_id(exp.name, exp.task, trainer, task_args, seed),
                    experiment=exp.name, variant=label, seed=seed, task=exp.task,
                    trainer=dict(trainer), task_args=dict(task_args), axes=axes, ablation=ablation))
    return runs


def load_experiments(path: str | Path) -> list[ExperimentSpec]:
    """The file's experiments, validated; raises SpecError with every problem."""
    from gridrun.engine.spec_validate import validate_file  # lazy: it imports this module

    return validate_file(path)


def load_runs(path: str | Path, *, force: bool = False, cap: int = DEFAULT_CAP) -> list[RunSpec]:
    """Parse, validate and expand an experiment file. Raises SpecError with every problem.

    The run count is checked before anything is built: from the raw axis lengths
    before validation imports the task (a refusal costs milliseconds, whatever
    the product), and again from the validated experiments before expanding."""
    from gridrun.engine.spec_validate import Checker, check_size, validate_file

    experiments = validate_file(path, cap=cap, force=force)
    runs = []
    c = Checker(str(path), Path(path).read_text(encoding="utf-8"))
    check_size(c, {exp.name: count_runs(exp) for exp in experiments}, cap=cap, force=force)
    if c.problems:
        raise SpecError(c.problems)
    for exp in experiments:
        exp_runs = expand(exp)
        seen: dict[str, RunSpec] = {}
        for run in exp_runs:
            if run.id in seen:
                c.add(f"two cells resolve to the same config: {seen[run.id].variant or 'baseline'!r} "
                      f"and {run.variant or 'baseline'!r} (seed {run.seed}); remove one",
                      "experiments", exp.name, experiment=exp.name)
                break
            seen[run.id] = run
        runs.extend(exp_runs)
    if c.problems:
        raise SpecError(c.problems)
    return runs


def load_engine_config(path: str | Path) -> EngineConfig:
    """The file's `[engine]` table (defaults where absent); raises SpecError when invalid."""
    from gridrun.engine.spec_validate import validate_engine

    return validate_engine(path)
