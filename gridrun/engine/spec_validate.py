"""Validation of an experiment file: every problem collected, none raised early.

Split from spec.py to keep each module small; spec.py imports this lazily
(it needs spec's trainer keys and dataclasses, defined there).
"""

from __future__ import annotations

import inspect
import math
import re
import tomllib
from pathlib import Path
from typing import Any

from gridrun.engine.spec import MAX_RUNS, TRAINER_KEYS, EngineConfig, ExperimentSpec, format_value
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

RESERVED = ("task", "grid", "zip", "ablations", "seeds")
TOP_LEVEL = ("defaults", "experiments", "engine")
SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
MAX_NAME = 100  # an experiment name is a folder name: far below any file system's 255 bytes
MAX_DEPTH = 32  # tables and arrays within each other; tomllib recurses once per level
MAX_SEEDS = 100_000  # spec.MAX_RUNS: `seeds = 10**9` is refused before a billion seeds are made


class Checker:
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
            if value > MAX_SEEDS:
                self.add(f"expected a count of at most {MAX_SEEDS:,}, got {value:,}",
                         *path, experiment=exp, key="seeds")
                return None
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
        data = tomllib.loads(text)
    except RecursionError:
        return None, text, [Problem(file, "not valid TOML for gridrun: values are nested too "
                                    f"deeply (more than {MAX_DEPTH} levels)")]
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        line, col = (int(m.group(1)), int(m.group(2))) if m else (None, None)
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", msg)
        return None, text, [Problem(file, f"not valid TOML: {msg}", line=line, column=col)]
    deep = _too_deep(data)
    if deep is not None:
        return None, text, [Problem(file, f"not valid TOML for gridrun: {'.'.join(deep)} is nested "
                                    f"too deeply (more than {MAX_DEPTH} levels)",
                                    line=LineIndex(text).find(*deep))]
    return data, text, []


def _too_deep(data: dict[str, Any]) -> tuple[str, ...] | None:
    """The key path of a value nested more than MAX_DEPTH levels, if any (no recursion:
    later checks format values recursively)."""
    stack: list[tuple[Any, tuple[str, ...], int]] = [(data, (), 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            return path
        if isinstance(value, dict):
            stack += [(v, (*path, str(k)), depth + 1) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, path, depth + 1) for v in value]
    return None


def _task_params(c: Checker, exp: str, task: str) -> dict[str, Any] | None:
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


def _key_where(exp: str, path: tuple[str, ...]) -> dict[str, Any]:
    """Where a key's problem is reported: `[defaults] lr`, or `[experiments.a] grid.lr`."""
    if path[0] == "defaults":
        return {"experiment": None, "key": "[defaults] " + ".".join(path[1:])}
    return {"experiment": exp, "key": ".".join(path[2:])}


def _check_key(c: Checker, exp: str, key: str, value: Any, params: dict[str, Any] | None,
               path: tuple[str, ...], task: str = "") -> tuple[bool, Any]:
    """(ok, cleaned value) for one trainer or task key."""
    if key in TRAINER_KEYS:
        cleaned, expected = check_trainer_value(TRAINER_KEYS[key], value)
    elif params is None:
        return True, value
    elif key in params:
        cleaned, expected = check_task_value(key, params[key], value)
    else:
        known = [*TRAINER_KEYS, *params, *RESERVED]
        # a [defaults] key is checked by every experiment: name the task, not the experiment
        of = f"task {task!r}" if path[0] == "defaults" and task else "the task"
        c.add(f"unknown key {key!r}: not a trainer key and not a parameter of {of}",
              *path, **_key_where(exp, path), suggestion=nearest(key, known))
        return False, None
    if expected is not None:
        c.add(expected, *path, **_key_where(exp, path))
        return False, None
    return True, cleaned


def _check_axes(c: Checker, exp: str, kind: str, table: Any, params: dict[str, Any] | None
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
                c.add(f"the value {format_value(repeated[0])} is listed twice: both cells would be "
                      "the same runs", *path, key, experiment=exp, key=f"{kind}.{key}")
            else:
                axes[key] = tuple(cleaned)
    return axes


def _experiment(c: Checker, name: str, table: Any, defaults: dict[str, Any]) -> ExperimentSpec | None:
    path = ("experiments", name)
    if not SAFE_NAME.match(name) or name in (".", ".."):
        c.add("the experiment name becomes a folder name: use only letters, digits, '.', '_' "
              "and '-' (and not '.' or '..')", *path, experiment=name)
        return None
    if len(name) > MAX_NAME:
        c.add(f"the experiment name becomes a folder name: use at most {MAX_NAME} characters "
              f"(this one has {len(name)})", *path, experiment=name)
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
            ok, cleaned = _check_key(c, name, key, value, params, kpath, task=str(task))
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


def read_checked(path: str | Path) -> tuple[dict[str, Any] | None, Checker]:
    path = Path(path)
    data, text, problems = _read(path)
    c = Checker(str(path), text)
    c.problems.extend(problems)
    if data is not None:
        for key in data:
            if key not in TOP_LEVEL:
                c.add(f"unknown table {key!r}: a file holds [defaults], [experiments.NAME] and [engine]",
                      key, suggestion=nearest(key, TOP_LEVEL))
    return data, c


def _raw_count(table: Any, defaults: dict[str, Any]) -> int:
    """The runs an experiment table expands to, from its raw values (before validation;
    malformed parts count as one: validation reports them)."""
    if not isinstance(table, dict):
        return 0

    def lengths(kind: str) -> list[int]:
        axes = table.get(kind)
        return [len(v) for v in axes.values() if isinstance(v, list)] if isinstance(axes, dict) else []

    cells = math.prod(lengths("grid"))
    cells *= (lengths("zip") or [1])[0]
    ablations = table.get("ablations")
    variants = 1 + len(ablations) if isinstance(ablations, dict) and ablations else 1
    seeds = table.get("seeds", defaults.get("seeds", [0]))
    n_seeds = len(seeds) if isinstance(seeds, list) else seeds if isinstance(seeds, int) else 1
    return cells * variants * max(1, n_seeds)


def check_size(c: Checker, counts: dict[str, int], *, cap: int, force: bool) -> None:
    """The cap (lifted by --force) and the ceiling (never lifted) on the number of runs."""
    total, ceiling = sum(counts.values()), max(cap, MAX_RUNS)
    if total <= cap or (force and total <= ceiling):
        return
    big = max(counts, key=lambda name: counts[name])
    where: dict[str, Any] = {"experiment": big} if counts[big] > cap else {}
    if total > ceiling:
        why = (f"more than the cap of {cap:,} and more than gridrun takes even with --force "
               f"({ceiling:,}); shrink the grid or split the file")
    else:
        why = f"more than the cap of {cap:,}; check the grid, or pass --force to take it as it is"
    c.add(f"the matrix expands to {total:,} runs, {why}",
          *(("experiments", big) if where else ()), **where)


def validate_file(path: str | Path, *, cap: int | None = None,
                  force: bool = False) -> list[ExperimentSpec]:
    """Every experiment of the file, validated; SpecError with every problem otherwise.
    With `cap`, a file of too many runs is refused first, alone, before any task is
    imported (spec.load_runs)."""
    data, c = read_checked(path)
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
    if cap is not None:
        before = len(c.problems)
        check_size(c, {name: _raw_count(t, defaults) for name, t in experiments.items()},
                   cap=cap, force=force)
        if len(c.problems) > before:
            raise SpecError(c.unique())
    specs = [_experiment(c, name, table, defaults) for name, table in experiments.items()]
    engine_config(data.get("engine", {}), c)
    if c.problems:
        raise SpecError(c.unique())
    return [s for s in specs if s is not None]


def engine_config(table: Any, c: Checker) -> EngineConfig:
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



def validate_engine(path: str | Path) -> EngineConfig:
    data, c = read_checked(path)
    config = engine_config((data or {}).get("engine", {}), c)
    if c.problems:
        raise SpecError(c.problems)
    return config
