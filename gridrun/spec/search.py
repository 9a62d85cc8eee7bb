"""`[experiments.NAME.search]`: a search space and how its trials are sampled and
scheduled, checked like the rest of the file; the trials' values; the rungs.

    [experiments.tune.search]
    trials = 27
    sampler = "sobol"                      # sobol | random | grid
    seed = 0
    params.lr = { dist = "log_uniform", low = 1e-4, high = 1e-1 }
    params.hidden = { dist = "choice", values = [32, 64, 128] }
    scheduler = "asha"                     # optional: successive halving
    metric = "accuracy"
    min_epochs = 1
    max_epochs = 9
    eta = 3

Everything here is a pure function of the table: trial i's values depend only on
the sampler, the seed and i (never on the machine or the slot count).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gridrun.spec import sobol
from gridrun.spec.errors import nearest, toml_type
from gridrun.spec.keys import show_value

SAMPLERS = ("sobol", "random", "grid")
DISTS = ("uniform", "log_uniform", "int_uniform", "int_log_uniform", "choice")
SCHEDULERS = ("asha",)
MODES = ("min", "max")
TABLE_KEYS = ("trials", "sampler", "seed", "params", "scheduler", "metric", "mode", "min_epochs",
              "max_epochs", "eta", "brackets")
MAX_TRIALS = 10_000
# a key left out of the table is this (trials, params and, with a scheduler, metric and
# max_epochs have none: they must be given)
DEFAULTS = {"sampler": "sobol", "seed": 0, "scheduler": "", "mode": "", "min_epochs": 1, "eta": 3,
            "brackets": 1}
# What each key is, for the reference page (scripts/docs.py): (TOML type, meaning)
DOCS = {
    "trials": ("integer", f"how many trials are sampled (1 to {MAX_TRIALS:,})"),
    "sampler": ("string", '"sobol" (quasi-random, even coverage), "random" or "grid" (choice '
                "and int distributions only)"),
    "seed": ("integer", "the sampler's seed: trial i's values depend only on the sampler, the "
             "seed and i"),
    "params": ("table of tables", 'the searched keys, each a distribution: { dist = "uniform", '
               '"log_uniform", "int_uniform" or "int_log_uniform", low, high } or { dist = '
               '"choice", values = [...] }'),
    "scheduler": ("string", '"asha": successive halving (trials pause at rungs, the best '
                  "1/eta go on); empty: every trial trains to the end"),
    "metric": ("string", "the validation metric the scheduler ranks trials by (with a scheduler)"),
    "mode": ("string", '"min" or "max" (empty: the direction the task declares for the metric)'),
    "min_epochs": ("integer", "the first rung: the epochs every trial trains"),
    "max_epochs": ("integer", "the epochs of a trial that is never stopped (with a scheduler)"),
    "eta": ("integer", "the rungs' ratio: min_epochs x eta^k, and 1/eta of a rung goes on"),
    "brackets": ("integer", "brackets of trials, each starting at a later rung"),
}
DIGITS = 4  # significant digits of a sampled float: the value as the run's config and id hold it

# the parameter a search may not sample: the scheduler owns the budget, the matrix its seeds
NOT_SEARCHED = ("epochs", "max_steps", "seed")


@dataclass(frozen=True)
class Param:
    name: str
    dist: str
    low: Any = None
    high: Any = None
    values: tuple[Any, ...] = ()

    def value(self, u: float) -> Any:
        """The value at `u` in [0, 1): its quantile under the distribution."""
        if self.dist == "choice":
            return self.values[min(int(u * len(self.values)), len(self.values) - 1)]
        if self.dist == "uniform":
            return _clamp(rounded(self.low + u * (self.high - self.low)), self.low, self.high)
        if self.dist == "log_uniform":
            x = math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
            return _clamp(rounded(x), self.low, self.high)
        if self.dist == "int_uniform":
            return min(self.low + int(u * (self.high - self.low + 1)), self.high)
        x = math.exp(math.log(self.low) + u * (math.log(self.high + 1) - math.log(self.low)))
        return _clamp(int(x), self.low, self.high)  # int_log_uniform

    def grid(self) -> list[Any]:
        return list(self.values) if self.dist == "choice" else list(range(self.low, self.high + 1))

    def to_json(self) -> dict[str, Any]:
        return ({"dist": self.dist, "values": list(self.values)} if self.dist == "choice"
                else {"dist": self.dist, "low": self.low, "high": self.high})


@dataclass(frozen=True)
class SearchSpec:
    trials: int
    sampler: str
    seed: int
    params: tuple[Param, ...]
    scheduler: str = ""  # "" (every trial to the end) | "asha"
    metric: str = ""
    mode: str = ""  # "" until the task declares its metric's direction
    min_epochs: int = 1
    max_epochs: int = 1
    eta: int = 3
    brackets: int = 1

    def points(self) -> list[dict[str, Any]]:
        """Trial i's values, i in [0, trials), in the order the params are written."""
        if self.sampler == "grid":
            product = itertools.product(*(p.grid() for p in self.params))
            rows = list(itertools.islice(product, self.trials))
        elif self.sampler == "sobol":
            units = sobol.sobol(self.trials, len(self.params), seed=self.seed)
            rows = [[p.value(u) for p, u in zip(self.params, row, strict=True)] for row in units]
        else:  # random: trial i draws from its own stream, whatever the trial count
            rows = []
            for i in range(self.trials):
                rng = random.Random(f"gridrun-search:{self.seed}:{i}")
                rows.append([p.value(rng.random()) for p in self.params])
        return [{p.name: v for p, v in zip(self.params, row, strict=True)} for row in rows]

    def identity(self, experiment: str) -> str:
        """The search's id: a hash of its experiment's name and of this table."""
        content = {"experiment": experiment, "trials": self.trials, "sampler": self.sampler,
                   "seed": self.seed, "params": {p.name: p.to_json() for p in self.params},
                   "scheduler": self.scheduler, "metric": self.metric, "mode": self.mode,
                   "min_epochs": self.min_epochs, "max_epochs": self.max_epochs, "eta": self.eta,
                   "brackets": self.brackets}
        blob = json.dumps(content, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    def run_config(self, experiment: str, units: int) -> dict[str, Any]:
        """What each of its runs carries (RunSpec.search): enough for the engine to decide.
        `units`: the trials that compete (trials x grid cells x ablation variants)."""
        out = {"id": self.identity(experiment), "trials": units, "sampler": self.sampler}
        if self.scheduler:
            out.update(scheduler=self.scheduler, metric=self.metric, min_epochs=self.min_epochs,
                       max_epochs=self.max_epochs, eta=self.eta, brackets=self.brackets)
            if self.mode:
                out["mode"] = self.mode
        return out


def rounded(x: float) -> float:
    return float(f"{x:.{DIGITS}g}")


def _clamp(x: Any, low: Any, high: Any) -> Any:
    return min(max(x, low), high)


def rungs(min_epochs: int, max_epochs: int, eta: int, bracket: int = 0) -> list[int]:
    """The epochs a trial of `bracket` pauses at, then max_epochs: min_epochs * eta^k
    (k from `bracket`) below max_epochs."""
    out, k = [], bracket
    while min_epochs * eta ** k < max_epochs:
        out.append(min_epochs * eta ** k)
        k += 1
    return [*out, max_epochs]


def bracket_of(trial: int, brackets: int) -> int:
    return trial % max(1, brackets)


def first_pause(search: Mapping[str, Any], trial: int) -> int | None:
    """The epoch trial `trial` first pauses at (None: it trains to the end)."""
    if search.get("scheduler") != "asha":
        return None
    steps = rungs(search["min_epochs"], search["max_epochs"], search["eta"],
                  bracket_of(trial, search.get("brackets", 1)))
    return steps[0] if len(steps) > 1 else None


def rung_label(search: Mapping[str, Any] | None, trial: int | None, epoch: int | None) -> str:
    """`r1 e3/9`: the rung a trial has reached (0 first), the epochs it trained, the budget."""
    if not search or search.get("scheduler") != "asha" or trial is None:
        return ""
    steps = rungs(search["min_epochs"], search["max_epochs"], search["eta"],
                  bracket_of(trial, search.get("brackets", 1)))
    done = epoch or 0
    reached = sum(1 for r in steps if r <= done)
    return f"r{max(reached - 1, 0)} e{done}/{search['max_epochs']}"


# ---- the table checked ----------------------------------------------------------

Check = Callable[[str, Any, tuple[str, ...]], tuple[bool, Any]]  # key, value, path -> (ok, cleaned)
Add = Callable[..., None]


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return (_int(value) or isinstance(value, float)) and math.isfinite(value)


def _param(add: Add, check: Check, name: str, raw: Any, path: tuple[str, ...]) -> Param | None:
    where = (*path, "params", name)
    key = f"search.params.{name}"
    if not isinstance(raw, dict):
        add(f"expected a table such as {{ dist = \"log_uniform\", low = 1e-4, high = 1e-1 }}, got "
            f"{toml_type(raw)}", *where, key=key)
        return None
    dist = raw.get("dist")
    if dist not in DISTS:
        add(f"expected dist = one of {' | '.join(map(repr, DISTS))}, got {show_value(dist)}",
            *where, key=f"{key}.dist", suggestion=nearest(str(dist), DISTS))
        return None
    allowed = ("dist", "values") if dist == "choice" else ("dist", "low", "high")
    extra = [k for k in raw if k not in allowed]
    if extra:
        add(f"{extra[0]!r} is not a field of a {dist} distribution: it takes "
            f"{', '.join(allowed[1:])}", *where, key=f"{key}.{extra[0]}",
            suggestion=nearest(extra[0], allowed))
        return None
    if dist == "choice":
        values = raw.get("values")
        if not isinstance(values, list) or not values:
            add(f"expected values = a non-empty array, got {show_value(values)}", *where,
                key=f"{key}.values")
            return None
        cleaned = []
        for v in values:
            ok, v = check(name, v, where)
            if not ok:
                return None
            cleaned.append(v)
        if len({json.dumps(v, sort_keys=True) for v in cleaned}) != len(cleaned):
            add("a value is listed twice in values", *where, key=f"{key}.values")
            return None
        return Param(name, dist, values=tuple(cleaned))
    low, high = raw.get("low"), raw.get("high")
    integer = dist.startswith("int_")
    kind = "an integer" if integer else "a finite number"
    for field, v in (("low", low), ("high", high)):
        if not (_int(v) if integer else _number(v)):
            add(f"expected {field} = {kind}, got {show_value(v)}", *where, key=f"{key}.{field}")
            return None
    if low > high:
        add(f"low ({show_value(low)}) is above high ({show_value(high)}): swap them", *where,
            key=key)
        return None
    if "log" in dist and low <= 0:
        add(f"a {dist} range must be above 0 (the log of {show_value(low)} is undefined): "
            "set low > 0, or use " + ("int_uniform" if integer else "uniform"), *where,
            key=f"{key}.low")
        return None
    for v in (low, high):  # the ends are values of the key (a range is convex: so is its inside)
        ok, _ = check(name, v if integer else float(v), where)
        if not ok:
            return None
    return Param(name, dist, low if integer else float(low), high if integer else float(high))


def _count(add: Add, table: dict[str, Any], field: str, path: tuple[str, ...], default: int | None,
           least: int, most: int = 1_000_000) -> int | None:
    value = table.get(field, default)
    if value is None:
        add(f"expected {field} = an integer >= {least}", *path, key=f"search.{field}")
        return None
    if not _int(value) or not least <= value <= most:
        add(f"expected an integer >= {least}" + (f" and <= {most:,}" if most < 1_000_000 else "")
            + f", got {show_value(value)}", *path, field, key=f"search.{field}")
        return None
    return value


def check_search(add: Add, check: Check, table: Any, path: tuple[str, ...],
                 fixed: Mapping[str, Any]) -> SearchSpec | None:
    """The `search` table at `path`, or None after adding its problems. `add(message,
    *path, key=, suggestion=)` reports; `check(key, value, path)` checks one value of a
    trainer or task key; `fixed`: the keys the grid, zip and ablations set."""
    path = (*path, "search")
    if not isinstance(table, dict):
        add(f"expected a table ([experiments.NAME.search]), got {toml_type(table)}", *path,
            key="search")
        return None
    before = [0]

    def counted(*args: Any, **kwargs: Any) -> None:
        before[0] += 1
        add(*args, **kwargs)

    for field in table:
        if field not in TABLE_KEYS:
            counted(f"unknown key {field!r} in the search table", *path, field,
                    key=f"search.{field}", suggestion=nearest(field, TABLE_KEYS))
    trials = _count(counted, table, "trials", path, None, 1, MAX_TRIALS)
    sampler = table.get("sampler", DEFAULTS["sampler"])
    if sampler not in SAMPLERS:
        counted(f"expected one of {' | '.join(map(repr, SAMPLERS))}, got {show_value(sampler)}",
                *path, "sampler", key="search.sampler", suggestion=nearest(str(sampler), SAMPLERS))
    seed = table.get("seed", DEFAULTS["seed"])
    if not _int(seed) or not 0 <= seed < 2**63:
        counted(f"expected an integer >= 0, got {show_value(seed)}", *path, "seed",
                key="search.seed")
    raw_params = table.get("params")
    params: list[Param] = []
    if not isinstance(raw_params, dict) or not raw_params:
        counted('expected params = a table of distributions, e.g. params.lr = { dist = '
                '"log_uniform", low = 1e-4, high = 1e-1 }', *path, "params", key="search.params")
    else:
        for name, raw in raw_params.items():
            if name in NOT_SEARCHED:
                counted(f"{name!r} cannot be searched: " + ("the scheduler sets the budget "
                        "(max_epochs)" if name != "seed" else "seeds replicate each trial"),
                        *path, "params", name, key=f"search.params.{name}")
                continue
            if name in fixed:
                counted(f"{name!r} is both searched and set by the grid, zip or an ablation: "
                        "keep one", *path, "params", name, key=f"search.params.{name}")
                continue
            found = _param(counted, check, name, raw, path)
            if found is None:
                before[0] += 1
            else:
                params.append(found)
        if len(params) > sobol.MAX_DIMENSIONS and sampler == "sobol":
            counted(f"the sobol sampler takes at most {sobol.MAX_DIMENSIONS} params, got "
                    f"{len(params)}: use sampler = \"random\"", *path, "params",
                    key="search.params")
    if sampler == "grid" and params and trials:
        continuous = [p.name for p in params if p.dist in ("uniform", "log_uniform")]
        if continuous:
            counted(f"the grid sampler takes choice and int distributions only; {continuous[0]!r} "
                    "is continuous: use sampler = \"sobol\" or dist = \"choice\"", *path, "sampler",
                    key="search.sampler")
        else:
            size = math.prod(len(p.grid()) for p in params)
            if trials > size:
                counted(f"trials ({trials}) is more than the grid's {size} points: set trials = "
                        f"{size}, or use sampler = \"sobol\"", *path, "trials", key="search.trials")
    scheduler = table.get("scheduler", DEFAULTS["scheduler"])
    options: dict[str, Any] = {}
    if scheduler:
        options = _scheduler(counted, table, path, scheduler) or {}
    else:
        for field in ("metric", "mode", "min_epochs", "max_epochs", "eta", "brackets"):
            if field in table:
                counted(f"{field!r} belongs to a scheduler: add scheduler = \"asha\" or remove it",
                        *path, field, key=f"search.{field}")
    if before[0] or trials is None:
        return None
    return SearchSpec(trials=trials, sampler=sampler, seed=seed, params=tuple(params),
                      scheduler=scheduler, **options)


def _scheduler(add: Add, table: dict[str, Any], path: tuple[str, ...],
               scheduler: Any) -> dict[str, Any] | None:
    if scheduler not in SCHEDULERS:
        add(f"expected scheduler = \"asha\", got {show_value(scheduler)}", *path, "scheduler",
            key="search.scheduler", suggestion=nearest(str(scheduler), SCHEDULERS))
        return None
    metric = table.get("metric")
    if not isinstance(metric, str) or not metric:
        add("expected metric = the name of a validation metric of the task, e.g. \"accuracy\", "
            f"got {show_value(metric)}", *path, "metric", key="search.metric")
    mode = table.get("mode", DEFAULTS["mode"])
    if mode not in ("", *MODES):
        add(f"expected mode = \"min\" or \"max\" (or leave it out: the metric's own direction), "
            f"got {show_value(mode)}", *path, "mode", key="search.mode",
            suggestion=nearest(str(mode), MODES))
    low = _count(add, table, "min_epochs", path, DEFAULTS["min_epochs"], 1)
    high = _count(add, table, "max_epochs", path, None, 1)
    eta = table.get("eta", DEFAULTS["eta"])
    if not _int(eta) or eta < 2:
        add(f"expected eta = an integer >= 2 (the share kept at each rung is 1/eta), got "
            f"{show_value(eta)}", *path, "eta", key="search.eta")
        eta = None
    if low is not None and high is not None and low > high:
        add(f"min_epochs ({low}) is above max_epochs ({high}): swap them", *path, "min_epochs",
            key="search.min_epochs")
        return None
    if None in (low, high, eta) or not isinstance(metric, str) or not metric \
            or mode not in ("", *MODES):
        return None
    most = len(rungs(low, high, eta))
    brackets = _count(add, table, "brackets", path, DEFAULTS["brackets"], 1, most)
    if brackets is None:
        return None
    return {"metric": metric, "mode": mode, "min_epochs": low, "max_epochs": high, "eta": eta,
            "brackets": brackets}
