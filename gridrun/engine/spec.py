"""The experiment file: TOML -> validated ExperimentSpec -> one RunSpec per cell and seed.

Never imports torch: `gridrun plan` and the TUI's validation stay fast.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from gridrun.engine.spec_errors import (
    NO_DEFAULT,
    LineIndex,
    Problem,
    SpecError,
    check_task_value,
    check_trainer_value,
    nearest,
    toml_type,
)

__all__ = ["EngineConfig", "ExperimentSpec", "Problem", "RunSpec", "SpecError", "load_runs"]


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
    """`config.toml` of a run folder, written atomically."""
    path = Path(path)
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(tomli_w.dumps(run.to_dict()))
    tmp.replace(path)


def read_run_config(path: str | Path) -> RunSpec:
    with open(path, "rb") as f:
        return RunSpec.from_dict(tomllib.load(f))


# --------------------------------------------------------------------------- parsing

RESERVED = ("task", "grid", "zip", "ablations", "seeds")
TOP_LEVEL = ("defaults", "experiments", "engine")
SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
DEFAULT_CAP = 10_000


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


def _format_value(v: Any) -> str:
    if isinstance(v, float):
        short = f"{v:g}"
        return short if float(short) == v else repr(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ",".join(_format_value(x) for x in v) + "]"
    return str(v)


def _label(axes: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={_format_value(v)}" for k, v in axes.items())


class _Checker:
    """Collects every problem of one file; each check returns the cleaned value or None."""

    def __init__(self, file: str, text: str):
        self.file = file
        self.lines = LineIndex(text)
        self.problems: list[Problem] = []

    def unique(self) -> list[Problem]:
        """Problems once each: a bad key in [defaults] is found again by every experiment."""
        seen, out = set(), []
        for p in self.problems:
            mark = (p.line, p.key, p.message)
            if mark not in seen:
                seen.add(mark)
                out.append(p)
        return out

    def add(self, message: str, *path: str, experiment: str | None = None, key: str | None = None,
            suggestion: str | None = None, line: int | None = None) -> None:
        self.problems.append(Problem(
            file=self.file, message=message, line=line or self.lines.find(*path),
            experiment=experiment, key=key, suggestion=suggestion))

    def seeds(self, value: Any, path: tuple[str, ...], exp: str | None) -> tuple[int, ...] | None:
        if isinstance(value, int) and not isinstance(value, bool):
            if value >= 1:
                return tuple(range(value))
            self.add(f"expected a count >= 1 or a non-empty array of integers, got {value!r}",
                     *path, experiment=exp, key="seeds")
            return None
        if (isinstance(value, list) and value and all(isinstance(s, int) and not isinstance(s, bool)
                                                       and s >= 0 for s in value)):
            if len(set(value)) != len(value):
                self.add("seeds are repeated in the array", *path, experiment=exp, key="seeds")
                return None
            return tuple(value)
        self.add(f"expected a count >= 1 or a non-empty array of integers >= 0, got {value!r}",
                 *path, experiment=exp, key="seeds")
        return None


def _read(path: Path) -> tuple[dict[str, Any] | None, str, list[Problem]]:
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, "", [Problem(file, "no such file")]
    except UnicodeDecodeError:
        return None, "", [Problem(file, "not a TOML file: it is not UTF-8 text")]
    except OSError as exc:
        return None, "", [Problem(file, f"cannot read the file: {exc.strerror}")]
    try:
        return tomllib.loads(text), text, []
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        line, col = (int(m.group(1)), int(m.group(2))) if m else (None, None)
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", msg)
        return None, text, [Problem(file, f"not valid TOML: {msg}", line=line, column=col)]


def _task_params(c: _Checker, exp: str, task: str) -> dict[str, Any] | None:
    """{param: default or NO_DEFAULT} of the task factory, or None (any keyword: **kwargs)."""
    from gridrun.engine import tasks

    line = c.lines.find("experiments", exp, "task") or c.lines.find("defaults", "task")
    if ":" not in task and task not in tasks.BUILTIN:
        c.add(f"unknown task {task!r}: built-in tasks are {', '.join(sorted(tasks.BUILTIN))}, "
              "or write 'package.module:factory' for a task of your own",
              experiment=exp, key="task", suggestion=nearest(task, tasks.BUILTIN), line=line)
        return {}
    try:
        factory = tasks.resolve(task)
    except tasks.TaskNotFound as exc:
        c.add(str(exc), experiment=exp, key="task", line=line)
        return {}
    params: dict[str, Any] = {}
    for p in inspect.signature(factory).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            return None
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            params[p.name] = NO_DEFAULT if p.default is p.empty else p.default
    return params


def _key_label(path: tuple[str, ...]) -> str:
    return ".".join(path) if path[0] == "defaults" else ".".join(path[2:])


def _check_key(c: _Checker, exp: str, key: str, value: Any, params: dict[str, Any] | None,
               path: tuple[str, ...]) -> tuple[bool, Any]:
    """(ok, cleaned value) for one trainer or task key."""
    if key in TRAINER_KEYS:
        cleaned, expected = check_trainer_value(TRAINER_KEYS[key], value)
    elif params is None:
        return True, value
    elif key in params:
        cleaned, expected = check_task_value(key, params[key], value)
    else:
        known = [*TRAINER_KEYS, *params, *RESERVED]
        c.add(f"unknown key {key!r}: not a trainer key and not a parameter of the task",
              *path, experiment=exp, key=_key_label(path), suggestion=nearest(key, known))
        return False, None
    if expected is not None:
        c.add(expected, *path, experiment=exp, key=_key_label(path))
        return False, None
    return True, cleaned


def _check_axes(c: _Checker, exp: str, kind: str, table: Any, params: dict[str, Any] | None
                ) -> dict[str, tuple[Any, ...]]:
    path = ("experiments", exp, kind)
    if not isinstance(table, dict):
        c.add(f"expected a table of arrays, e.g. {kind} = {{ lr = [1e-3, 3e-4] }}, got {toml_type(table)}",
              *path, experiment=exp, key=kind)
        return {}
    axes: dict[str, tuple[Any, ...]] = {}
    for key, values in table.items():
        if key in RESERVED:
            c.add(f"{key!r} cannot vary in {kind}", *path, key, experiment=exp, key=f"{kind}.{key}")
            continue
        if not isinstance(values, list):
            c.add(f"expected an array of values, got {toml_type(values)}", *path, key,
                  experiment=exp, key=f"{kind}.{key}")
            continue
        if not values:
            c.add("expected a non-empty array: an empty axis gives no runs", *path, key,
                  experiment=exp, key=f"{kind}.{key}")
            continue
        cleaned = []
        for v in values:
            ok, value = _check_key(c, exp, key, v, params, (*path, key))
            if not ok:
                break
            cleaned.append(value)
        else:
            repeated = [v for i, v in enumerate(cleaned) if v in cleaned[:i]]
            if repeated:  # 1e-3 and 0.001 are one value: the cells would be the same runs
                c.add(f"the value {_format_value(repeated[0])} is listed twice: both cells would be "
                      "the same runs", *path, key, experiment=exp, key=f"{kind}.{key}")
            else:
                axes[key] = tuple(cleaned)
    return axes


def _experiment(c: _Checker, name: str, table: Any, defaults: dict[str, Any]) -> ExperimentSpec | None:
    path = ("experiments", name)
    if not SAFE_NAME.match(name) or name in (".", ".."):
        c.add("the experiment name becomes a folder name: use only letters, digits, '.', '_' "
              "and '-' (and not '.' or '..')", *path, experiment=name)
        return None
    if not isinstance(table, dict):
        c.add(f"expected a table, got {toml_type(table)}", *path, experiment=name)
        return None
    n_before = len(c.problems)
    task = table.get("task", defaults.get("task"))
    if task is None:
        c.add('has no task: add task = "spirals" (a built-in) or "package.module:factory"',
              *path, experiment=name, key="task")
        return None
    if not isinstance(task, str):
        c.add(f"expected a string, got {toml_type(task)}", *path, "task", experiment=name, key="task")
        return None
    params = _task_params(c, name, task)
    if len(c.problems) > n_before:
        return None

    keys: dict[str, Any] = {}
    for source, items in (("defaults", defaults), ("experiments", table)):
        for key, value in items.items():
            if key in RESERVED:
                continue
            kpath = ("defaults", key) if source == "defaults" else (*path, key)
            ok, cleaned = _check_key(c, name, key, value, params, kpath)
            if ok:
                keys[key] = cleaned
    grid = _check_axes(c, name, "grid", table["grid"], params) if "grid" in table else {}
    zipped = _check_axes(c, name, "zip", table["zip"], params) if "zip" in table else {}
    if zipped and len({len(v) for v in zipped.values()}) > 1:
        lengths = ", ".join(f"{k} has {len(v)}" for k, v in zipped.items())
        c.add(f"zip lists must have equal lengths: {lengths}", *path, "zip", experiment=name, key="zip")
    for key in set(grid) & set(zipped):
        c.add(f"{key!r} is in both grid and zip", *path, "zip", key, experiment=name, key=f"zip.{key}")

    ablations: dict[str, dict[str, Any]] = {}
    raw_ablations = table.get("ablations", {})
    if not isinstance(raw_ablations, dict):
        c.add(f"expected a table of named variants, got {toml_type(raw_ablations)}", *path, "ablations",
              experiment=name, key="ablations")
        raw_ablations = {}
    for variant, overrides in raw_ablations.items():
        vpath = (*path, "ablations", variant)
        if variant == "baseline":
            c.add("'baseline' is the name of the unchanged experiment; name this variant otherwise",
                  *vpath, experiment=name, key=f"ablations.{variant}")
            continue
        if not isinstance(overrides, dict) or not overrides:
            c.add("expected a non-empty table of keys to change, e.g. { warmup = 0 }", *vpath,
                  experiment=name, key=f"ablations.{variant}")
            continue
        clean = {}
        for key, value in overrides.items():
            if key in RESERVED:
                c.add(f"{key!r} cannot change in an ablation", *vpath, key, experiment=name,
                      key=f"ablations.{variant}.{key}")
                continue
            ok, cleaned = _check_key(c, name, key, value, params, (*vpath, key))
            if ok:
                clean[key] = cleaned
        ablations[variant] = clean

    seeds_value, seeds_path = ((table["seeds"], (*path, "seeds")) if "seeds" in table
                               else (defaults.get("seeds", [0]), ("defaults", "seeds")))
    seeds = c.seeds(seeds_value, seeds_path, name)
    if params:
        given = set(keys) | set(grid) | set(zipped) | {k for a in ablations.values() for k in a}
        for p, default in params.items():
            if default is NO_DEFAULT and p not in given:
                c.add(f"task {task!r} needs the key {p!r} (its factory has no default for it)",
                      *path, experiment=name, key=p)
    if len(c.problems) > n_before or seeds is None:
        return None
    return ExperimentSpec(name=name, task=task, keys=keys, grid=grid, zip=zipped,
                          ablations=ablations, seeds=seeds)


def _task_defaults(task: str) -> dict[str, Any]:
    from gridrun.engine import tasks

    out = {}
    for p in inspect.signature(tasks.resolve(task)).parameters.values():
        if p.default is not p.empty and isinstance(p.default, bool | int | float | str):
            out[p.name] = p.default
    return out


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


def _load(path: str | Path) -> tuple[dict[str, Any] | None, _Checker]:
    path = Path(path)
    data, text, problems = _read(path)
    c = _Checker(str(path), text)
    c.problems.extend(problems)
    if data is not None:
        for key in data:
            if key not in TOP_LEVEL:
                c.add(f"unknown table {key!r}: a file holds [defaults], [experiments.NAME] and [engine]",
                      key, suggestion=nearest(key, TOP_LEVEL))
    return data, c


def load_experiments(path: str | Path) -> list[ExperimentSpec]:
    data, c = _load(path)
    if data is None:
        raise SpecError(c.problems)
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        c.add(f"expected a table, got {toml_type(defaults)}", "defaults")
        defaults = {}
    experiments = data.get("experiments", {})
    if not isinstance(experiments, dict) or not experiments:
        c.add("no experiments: add a table such as [experiments.first] with task = \"spirals\"",
              "experiments")
        experiments = {}
    specs = [_experiment(c, name, table, defaults) for name, table in experiments.items()]
    engine_config(data.get("engine", {}), c)
    if c.problems:
        raise SpecError(c.unique())
    return [s for s in specs if s is not None]


def load_runs(path: str | Path, *, force: bool = False, cap: int = DEFAULT_CAP) -> list[RunSpec]:
    """Parse, validate and expand an experiment file. Raises SpecError with every problem."""
    experiments = load_experiments(path)
    runs, problems = [], []
    c = _Checker(str(path), Path(path).read_text(encoding="utf-8"))
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
    if len(runs) > cap and not force:
        c.add(f"the matrix expands to {len(runs):,} runs, more than the cap of {cap:,}; "
              "check the grid, or pass --force to take it as it is")
    problems = c.problems
    if problems:
        raise SpecError(problems)
    return runs


def engine_config(table: Any, c: _Checker) -> EngineConfig:
    if not isinstance(table, dict):
        c.add(f"expected a table, got {toml_type(table)}", "engine")
        return EngineConfig()
    fields = {}
    names = ("gpus", "runs_per_gpu", "cpu_slots", "backend", "ray_address")
    for key, value in table.items():
        path = ("engine", key)
        if key not in names:
            c.add(f"unknown key {key!r} in [engine]", *path, key=f"engine.{key}",
                  suggestion=nearest(key, names))
        elif key == "gpus":
            if value == "auto":
                fields[key] = "auto"
            elif isinstance(value, list) and all(isinstance(g, int) and not isinstance(g, bool)
                                                 and g >= 0 for g in value):
                fields[key] = tuple(value)
            else:
                c.add(f'expected "auto", [] or an array of GPU indices, got {value!r}', *path,
                      key="engine.gpus")
        elif key in ("runs_per_gpu", "cpu_slots"):
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                fields[key] = value
            else:
                c.add(f"expected an integer >= 1, got {value!r}", *path, key=f"engine.{key}")
        elif key == "backend":
            if value in ("local", "ray"):
                fields[key] = value
            else:
                c.add(f'expected "local" or "ray", got {value!r}', *path, key="engine.backend",
                      suggestion=nearest(str(value), ("local", "ray")))
        elif isinstance(value, str) and value:
            fields[key] = value
        else:
            c.add(f'expected "auto", "ray://host:port" or "host:port", got {value!r}', *path,
                  key="engine.ray_address")
    return EngineConfig(**fields)


def load_engine_config(path: str | Path) -> EngineConfig:
    data, c = _load(path)
    config = engine_config((data or {}).get("engine", {}), c)
    if c.problems:
        raise SpecError(c.problems)
    return config
