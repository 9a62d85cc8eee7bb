"""Validation of an experiment file's tables: every problem collected, none raised early.

Works on what tomllib gave (load.py reads the file); imports a task's module only
to read its factory's signature, once per experiment.
"""

from __future__ import annotations

import math
import re
from typing import Any

from gridrun.spec import sources
from gridrun.spec.errors import LineIndex, Problem, toml_type
from gridrun.spec.keys import (
    MAX_SEED,
    NO_DEFAULT,
    RESERVED,
    TRAINER_KEYS,
    TaskSignature,
    check_task_value,
    check_trainer_value,
    show_value,
    suggest_key,
    task_signature,
)
from gridrun.spec.model import ExperimentSpec, format_value
from gridrun.spec.search import SearchSpec, check_search

TOP_LEVEL = ("defaults", "experiments", "engine")
# What each of an experiment's own keys (keys.RESERVED) is, for the reference page
# (scripts/docs.py): (TOML type, meaning)
RESERVED_DOCS = {
    "task": ("string", 'the task: a built-in task\'s name or "package.module:factory" of '
             "your own; required"),
    "grid": ("table of arrays", "the cartesian product of these keys' values: one cell each"),
    "zip": ("table of arrays", "these keys' values varied together, pairwise (arrays of one "
            "length)"),
    "ablations": ("table of tables", "named changes, each one variant beside the unchanged "
                  "baseline"),
    "seeds": ("integer or array of integers", "a count (3: seeds 0, 1, 2) or the seeds "
              "themselves; every cell runs once per seed (default: [0])"),
    "search": ("table", "a search space sampled into trials: the search table's keys below"),
}
SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
MAX_NAME = 100  # an experiment name is a folder name: far below any file system's 255 bytes
MAX_SEEDS = 100_000  # MAX_RUNS: `seeds = 10**9` is refused before a billion seeds are made
DEFAULT_CAP = 10_000  # runs one file may queue without --force
MAX_RUNS = 100_000  # ... and with it: a bigger matrix is a mistake, refused before it is built


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

    def seeds(self, value: Any, path: tuple[str, ...], exp: str) -> tuple[int, ...] | None:
        """`value` of the `seeds` key written at `path` (the experiment's or [defaults]')."""
        where = key_where(exp, path)
        if isinstance(value, int) and not isinstance(value, bool):
            if value > MAX_SEEDS:
                self.add(f"expected a count of at most {MAX_SEEDS:,}, got {value:,}",
                         *path, **where)
                return None
            if value >= 1:
                return tuple(range(value))
            self.add(f"expected a count >= 1 or a non-empty array of integers, got {value!r}",
                     *path, **where)
            return None
        if (isinstance(value, list) and value and all(isinstance(s, int) and not isinstance(s, bool)
                                                       and 0 <= s < MAX_SEED for s in value)):
            if len(set(value)) != len(value):
                self.add("seeds are repeated in the array", *path, **where)
                return None
            return tuple(value)
        bad = next((s for s in value if not (isinstance(s, int) and not isinstance(s, bool)
                                             and 0 <= s < MAX_SEED)), None) \
            if isinstance(value, list) and value else value
        self.add(f"expected a count >= 1 or a non-empty array of integers >= 0 and < 2^63 "
                 f"({MAX_SEED:,}), got {show_value(bad)}", *path, **where)
        return None


def _task_signature(c: Checker, exp: str, task: str, path: tuple[str, ...]
                    ) -> TaskSignature | None:
    """The signature of the factory of `task`, written at `path` (importing its module), or
    None after adding the problem: one in [defaults] is said once, at its line there."""
    from gridrun import tasks

    where = key_where(exp, path)
    if ":" not in task and task not in tasks.BUILTIN:
        c.add(f"unknown task {task!r}: built-in tasks are {', '.join(sorted(tasks.BUILTIN))}, "
              "or write 'package.module:factory' for a task of your own", *path, **where,
              suggestion=suggest_key(task, tasks.BUILTIN))
        return None
    try:
        return task_signature(tasks.resolve(task))
    except tasks.TaskNotFound as exc:
        c.add(str(exc), *path, **where)
        return None


def key_where(exp: str, path: tuple[str, ...]) -> dict[str, Any]:
    """Where a key's problem is reported: `[defaults] lr`, or `[experiments.a] grid.lr`.
    A key in [defaults] is named without the experiment that inherits it, so the problem
    every experiment finds there is one problem (Checker.unique), at the line it is on."""
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
              *path, **key_where(exp, path), suggestion=suggest_key(key, known))
        return False, None
    if expected is not None:
        c.add(expected, *path, **key_where(exp, path))
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
    task_path = (*path, "task") if "task" in table else ("defaults", "task")
    if task is None:
        c.add('has no task: add task = "spirals" (a built-in) or "package.module:factory"',
              *path, experiment=name, key="task")
        return None
    if not isinstance(task, str):
        c.add(f"expected a string, got {toml_type(task)}", *task_path, **key_where(name, task_path))
        return None
    signature = _task_signature(c, name, task, task_path)
    if signature is None:
        return None
    params = None if signature.any_keyword else signature.params

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

    search = _search(c, name, table, keys, params, {*grid, *zipped, *(k for a in ablations.values()
                                                                     for k in a)})
    clash = sources.conflict([keys, grid, zipped, *ablations.values()])
    if clash:
        c.add(clash, *path, experiment=name, key=sources.VARY)
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
                          ablations=ablations, seeds=seeds, task_defaults=signature.defaults,
                          search=search)


def _search(c: Checker, name: str, table: dict[str, Any], keys: dict[str, Any],
            params: dict[str, Any] | None, fixed: set[str]) -> SearchSpec | None:
    """The experiment's `search` table checked (spec/search.py), or None."""
    if "search" not in table:
        return None
    path = ("experiments", name)

    def add(message: str, *where: str, key: str, suggestion: str | None = None) -> None:
        c.add(message, *where, experiment=name, key=key, suggestion=suggestion)

    def check(key: str, value: Any, where: tuple[str, ...]) -> tuple[bool, Any]:
        return _check_key(c, name, key, value, params, where)

    search = check_search(add, check, table["search"], path, fixed)
    if search is None or not search.scheduler:
        return search
    for key, wanted, why in (("eval_every", 0, "a rung's result is the evaluation at the end of "
                              "its epoch"),
                             ("early_stop_patience", 0, "the scheduler decides which trials "
                              "stop")):
        if keys.get(key, wanted) != wanted:
            where = (*path, key) if key in table else ("defaults", key)
            c.add(f"must be {wanted} in an experiment with scheduler = \"asha\": {why}", *where,
                  experiment=name, key=key)
            return None
    # best.pt and a trial's best value follow the metric the search ranks by, unless set
    keys.setdefault("early_stop_metric", search.metric)
    return search


def check_top_level(c: Checker, data: dict[str, Any]) -> None:
    for key in data:
        if key not in TOP_LEVEL:
            c.add(f"unknown table {key!r}: a file holds [defaults], [experiments.NAME] and [engine]",
                  key, suggestion=suggest_key(key, TOP_LEVEL))


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
    search = table.get("search")
    trials = search.get("trials") if isinstance(search, dict) else None
    cells *= trials if isinstance(trials, int) and not isinstance(trials, bool) and trials > 0 else 1
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


def check_experiments(c: Checker, data: dict[str, Any], *, cap: int | None,
                      force: bool = False) -> list[ExperimentSpec] | None:
    """Every valid experiment of the file (problems go to `c`); None when the file
    is refused for its size (with `cap`), checked first, from the raw axis lengths,
    before any task is imported (a refusal costs milliseconds, whatever the product)."""
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
            return None
    specs = [_experiment(c, name, table, defaults) for name, table in experiments.items()]
    return [s for s in specs if s is not None]
