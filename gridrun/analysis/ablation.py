"""Ablation tables over seeds: mean, std, n, 95% CI, min and max per cell, the
best row per metric, and deltas with Welch's p-value against the baseline. The
runs they are built from: frames.py; their text: tables.py.

Plain Python over rows (`RowTable`): `gridrun compare` pays no pandas, NumPy or
scipy import. `ablation_table` is the same table as a DataFrame, for files and
for callers that hold one.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gridrun.analysis import tdist
from gridrun.analysis.devices import DEFAULTS as DEVICE_KEYS
from gridrun.analysis.frames import PENDING, TRACKED, collector_paused
from gridrun.analysis.rowtable import RowTable, missing
from gridrun.runs import records, states
from gridrun.spec.errors import suggest_metric

if TYPE_CHECKING:
    import pandas as pd


class AnalysisError(ValueError):
    """A user mistake (unknown experiment, metric or key); str() says what to do."""


def _summary_stats(values: list[float]) -> dict[str, float]:
    n = len(values)
    mean = math.fsum(values) / n if n else math.nan
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n >= 2 else math.nan
    ci = tdist.t_ppf(0.975, n - 1) * std / math.sqrt(n) if n >= 2 else math.nan
    return {"mean": mean, "std": std, "ci95": ci,
            "min": min(values) if n else math.nan, "max": max(values) if n else math.nan}


def welch_p(x: list[float], y: list[float]) -> float:
    """Two-sided p-value of Welch's t-test, computed as
    `scipy.stats.ttest_ind(x, y, equal_var=False)` does (an undefined
    Welch-Satterthwaite dof counts as 1); nan when x and y agree exactly."""
    n1, n2 = len(x), len(y)
    m1, m2 = math.fsum(x) / n1, math.fsum(y) / n2
    v1 = math.fsum((v - m1) ** 2 for v in x) / (n1 - 1) / n1
    v2 = math.fsum((v - m2) ** 2 for v in y) / (n2 - 1) / n2
    if v1 + v2 == 0:  # no spread at all: equal means say nothing, different ones everything
        return math.nan if m1 == m2 else 0.0
    dof = (v1 + v2) ** 2 / (v1**2 / (n1 - 1) + v2**2 / (n2 - 1))
    t = (m1 - m2) / math.sqrt(v1 + v2)
    return 2 * tdist.t_sf(abs(t), dof)


def _number(value: Any) -> float:
    """A metric's value as a float; nan for what is not a number (as pd.to_numeric(errors="coerce"))."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return float(value)
    return math.nan


def _group_key(value: Any) -> Any:
    """A grouping value as a dict key: every missing value is one group (None)."""
    if missing(value):
        return None
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _grouping(sub: list[dict[str, Any]], config_cols: list[str], by: list[str] | None,
              axes: Iterable[str] = ()) -> list[str]:
    """The keys a table groups by: `by`, else the config keys that vary, among the
    matrix's axes when the runs name them (a resolved setting such as `precision`,
    which reads differently before and after a run, is not an axis)."""
    if by:
        return by
    axes = set(axes)
    config_cols = [c for c in config_cols if not axes or c in axes]

    def varying(rows: list[dict[str, Any]]) -> list[str]:
        seen: dict[str, set[Any]] = {c: set() for c in config_cols}
        for r in rows:  # one pass; a key a row lacks is a value (None) of its own
            for c, values in seen.items():
                if len(values) < 2:
                    values.add(_group_key(r.get(c)))
        present = {c for r in rows for c in r}
        return [c for c in config_cols if c in present and len(seen[c]) > 1]
    if any(not missing(r.get("ablation")) and r.get("ablation") != "" for r in sub):
        # the axes of an ablation are its names; only grid axes of the baseline add to them
        return ["ablation", *varying([r for r in sub if r.get("ablation") == "baseline"])]
    return varying(sub)


def _filled(sub: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows, a run from before `devices` and `reduce` with the values it trained with
    (1 device, "ddp") where other runs of its table name them: the same runs, one cell."""
    for key, default in DEVICE_KEYS.items():
        if any(key in r for r in sub) and not all(key in r for r in sub):
            sub = [r if key in r else {**r, key: default} for r in sub]
    return sub


def _spread(sub: list[dict[str, Any]], keys: list[str]) -> list[str]:
    """`keys`, and `devices` and `reduce` when runs that `keys` put in one cell differ in
    them: runs on other device counts, or summed another way, are never averaged
    together unseen. A grid over `devices` names it already; an ablation's name tells
    its own. The rows are `_filled`: each names the key, or none does."""
    for key in DEVICE_KEYS:
        if key in keys or not sub or key not in sub[0]:
            continue
        seen: dict[tuple[Any, ...], set[Any]] = {}
        for r in sub:
            cell = tuple(_group_key(r.get(k)) for k in keys)
            seen.setdefault(cell, set()).add(_group_key(r[key]))
        if any(len(values) > 1 for values in seen.values()):
            keys = [*keys, key]
    return keys


def _cells_of(sub: list[dict[str, Any]], keys: list[str]) -> list[tuple[tuple[Any, ...], list[int]]]:
    """(values of `keys`, row positions) of each cell, in the order the cells first appear."""
    cells: dict[tuple[Any, ...], tuple[tuple[Any, ...], list[int]]] = {}
    for i, r in enumerate(sub):
        values = tuple(r.get(k) for k in keys)
        group = tuple(_group_key(v) for v in values)
        if group not in cells:
            cells[group] = (tuple(None if missing(v) else v for v in values), [])
        cells[group][1].append(i)
    return list(cells.values())


def ablation(runs: RowTable, experiment: str | None = None, by: Iterable[str] | None = None,
             metric: str | None = None, final: bool = False, own: bool = False) -> RowTable:
    """Mean, std, n, 95% CI, min and max over seeds per cell; see the module doc.
    A run's value of a metric is, by default, the metric at the run's best evaluation
    in its early-stop metric (what early stopping keeps); `final`: at its last
    evaluation; `own`: the metric's own best over the run's evaluations."""
    with collector_paused():
        return _ablation(runs, experiment, by, metric, final, own)


def ablation_table(frame: pd.DataFrame, experiment: str | None = None,
                   by: Iterable[str] | None = None, metric: str | None = None,
                   final: bool = False, own: bool = False) -> pd.DataFrame:
    """`ablation` of a DataFrame of runs (`frames.runs_frame`), as a DataFrame."""
    return ablation(RowTable.from_frame(frame), experiment, by, metric, final, own).to_frame()


def _ablation(runs: RowTable, experiment: str | None, by: Iterable[str] | None,
              metric: str | None, final: bool, own: bool = False) -> RowTable:
    directions = dict(runs.attrs.get("directions", {}))
    all_metrics = list(runs.attrs.get("metrics", []))
    config_cols = list(runs.attrs.get("config_columns", []))
    axes = list(runs.attrs.get("axes", []))
    if final and own:
        raise AnalysisError("--final and --own-best ask for different values: choose one")
    kind = "final" if final else "own" if own else "best"
    if runs.empty:
        raise AnalysisError("no runs yet")
    rows = runs.rows
    if experiment is not None:
        known = sorted({str(r.get("experiment")) for r in rows})
        if experiment not in known:
            raise AnalysisError(f"no experiment {experiment!r}; there are: {', '.join(known)}")
        rows = [r for r in rows if r.get("experiment") == experiment]
    if metric is not None:
        if metric not in all_metrics:
            guess = suggest_metric(metric, all_metrics)
            raise AnalysisError(f"no metric {metric!r}; the runs report: "
                                f"{', '.join(all_metrics) or 'nothing yet'}"
                                + (f" (did you mean {guess!r}?)" if guess else ""))
        all_metrics = [metric]
    metrics = all_metrics  # declared by a started run, or with values: a column each
    notes: list[str] = []
    by = [k.strip() for k in by if k.strip()] if by else None
    for key in by or ():
        if key in ("seed", "id"):
            raise AnalysisError(f"cannot group by {key!r}: tables aggregate over seeds")
        if key not in runs.columns:
            raise AnalysisError(f"no column {key!r} to group by; config keys are: {', '.join(config_cols)}")
    out_rows: list[dict[str, Any]] = []
    all_keys: dict[str, None] = {}
    tracked: dict[str, None] = {}
    for exp in dict.fromkeys(r.get("experiment") for r in rows):
        sub = [r for r in rows if r.get("experiment") == exp]
        tracked.update(dict.fromkeys(r[TRACKED] for r in sub if isinstance(r.get(TRACKED), str)))
        if own and (older := sum(r.get("status") == states.COMPLETED and not any(
                f"own_{m}" in r for m in metrics) for r in sub)):
            notes.append(f"{exp}: {older} run{'s' * (older != 1)} recorded before own bests "
                         "were (an older gridrun): left out of the --own-best values")
        sub = _filled(sub)
        keys = _grouping(sub, config_cols, by, axes)
        if by is None:
            keys = _spread(sub, keys)
        all_keys.update(dict.fromkeys(keys))
        numbers = {m: [_number(r.get(f"{kind}_{m}")) for r in sub] for m in metrics}
        cells = []
        for values, pos in _cells_of(sub, keys):
            done = [i for i in pos if sub[i].get("status") == states.COMPLETED]
            pending = sum(sub[i].get("status") in PENDING for i in pos)
            row: dict[str, Any] = {"experiment": exp, **dict(zip(keys, values, strict=True))}
            k = len(done)
            failed = len(pos) - k - pending
            seeds = (f"{k}/{k + pending}" if pending else str(k)) + (
                f" ({failed} failed)" if failed else "")
            row.update(seeds=seeds, n=k, runs=len(pos), pending=pending, failed=failed)
            samples = {}
            for m in metrics:
                vals = [v for v in (numbers[m][i] for i in done) if not math.isnan(v)]
                samples[m] = vals
                row.update({f"{m}_{s}": v for s, v in _summary_stats(vals).items()})
            cells.append((row, samples))
        if "ablation" in keys:
            others = [k for k in keys if k != "ablation"]
            base = {tuple(r[k] for k in others): (r, s) for r, s in cells if r["ablation"] == "baseline"}
            cells.sort(key=lambda c: (c[0]["ablation"] != "baseline", str(c[0]["ablation"])))
            for row, samples in cells:
                b = base.get(tuple(row[k] for k in others))
                for m in metrics:
                    delta = rel = p = math.nan
                    if b is not None and row["ablation"] != "baseline":
                        bmean = b[0][f"{m}_mean"]
                        delta = row[f"{m}_mean"] - bmean
                        rel = delta / abs(bmean) if bmean else math.nan
                        x, y = samples[m], b[1][m]
                        if len(x) >= 2 and len(y) >= 2:
                            p = welch_p(x, y)  # seeds that agree exactly: nan
                    row.update({f"{m}_delta": delta, f"{m}_delta_rel": rel, f"{m}_p": p})
        elif keys:
            with contextlib.suppress(TypeError):  # mixed types: keep the folders' order
                cells.sort(key=lambda c: tuple(c[0][k] for k in keys))
        for m in metrics:
            means = [c[0][f"{m}_mean"] for c in cells]
            finite = [i for i, v in enumerate(means) if not math.isnan(v)]
            pick = min if records.direction(m, directions) == records.LOWER else max
            best = pick(finite, key=lambda i: means[i]) if finite else None
            for i, (row, _) in enumerate(cells):
                row[f"{m}_best"] = i == best
        out_rows.extend(row for row, _ in cells)
    front = ["experiment", *all_keys, "seeds", "n", "runs", "pending", "failed"]
    stats_cols = [f"{m}_{s}" for m in metrics for s in ("mean", "std", "ci95", "min", "max", "best",
                                                        "delta", "delta_rel", "p")]
    present = {k for r in out_rows for k in r}
    return RowTable(out_rows, front + [c for c in stats_cols if c in present],
                    {"directions": {m: records.direction(m, directions) for m in metrics},
                     "metrics": metrics, "keys": list(all_keys), "value": kind,
                     "tracked": list(tracked), "notes": notes})
