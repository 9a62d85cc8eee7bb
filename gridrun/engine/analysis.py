"""Ablation tables over seeds: mean, std, n, 95% CI, min and max per cell, the
best row per metric, and deltas with Welch's p-value against the baseline. The
frame they are built from: frames.py; their text: tables.py."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from gridrun.engine import records, states
from gridrun.engine.frames import PENDING, collector_paused


class AnalysisError(ValueError):
    """A user mistake (unknown experiment, metric or key); str() says what to do."""


# scipy.special's Student t functions are what scipy.stats.t calls (ppf = stdtrit,
# sf(x) = stdtr(-x)); scipy.stats itself costs half a second to import, which
# `gridrun compare` would pay on every call.

@functools.lru_cache(maxsize=1024)
def _t975(dof: int) -> float:
    from scipy import special

    return float(special.stdtrit(dof, 0.975))


def _summary_stats(values: np.ndarray) -> dict[str, float]:
    n = len(values)
    mean = float(values.mean()) if n else math.nan
    std = float(values.std(ddof=1)) if n >= 2 else math.nan
    ci = float(_t975(n - 1) * std / math.sqrt(n)) if n >= 2 else math.nan
    return {"mean": mean, "std": std, "ci95": ci,
            "min": float(values.min()) if n else math.nan,
            "max": float(values.max()) if n else math.nan}


def welch_p(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sided p-value of Welch's t-test, computed as
    `scipy.stats.ttest_ind(x, y, equal_var=False)` does (an undefined
    Welch-Satterthwaite dof counts as 1); nan when x and y agree exactly."""
    from scipy import special

    n1, n2 = len(x), len(y)
    with np.errstate(divide="ignore", invalid="ignore"):
        v1, v2 = np.var(x, ddof=1) / n1, np.var(y, ddof=1) / n2
        dof = (v1 + v2) ** 2 / (v1**2 / (n1 - 1) + v2**2 / (n2 - 1))
        t = (np.mean(x) - np.mean(y)) / np.sqrt(v1 + v2)
    return float(2 * special.stdtr(1.0 if np.isnan(dof) else dof, -np.abs(t)))


def _grouping(sub: pd.DataFrame, config_cols: list[str], by: list[str] | None,
              axes: Iterable[str] = ()) -> list[str]:
    """The keys a table groups by: `by`, else the config keys that vary, among the
    matrix's axes when the runs name them (a resolved setting such as `precision`,
    which reads differently before and after a run, is not an axis)."""
    if by:
        return by
    axes = set(axes)

    def varying(rows: pd.DataFrame) -> list[str]:
        return [c for c in config_cols if c in rows and (not axes or c in axes)
                and rows[c].nunique(dropna=False) > 1]
    if (sub["ablation"].fillna("") != "").any():
        # the axes of an ablation are its names; only grid axes of the baseline add to them
        return ["ablation", *varying(sub[sub["ablation"] == "baseline"])]
    return varying(sub)


def _cells_of(sub: pd.DataFrame, keys: list[str]) -> list[tuple[tuple[Any, ...], np.ndarray]]:
    """(values of `keys`, row positions) of each cell, in the order the cells first
    appear (`groupby(keys, sort=False, dropna=False)`'s)."""
    if not keys:
        return [((), np.arange(len(sub)))]
    codes = sub.groupby(keys, sort=False, dropna=False).ngroup().to_numpy()
    order = np.argsort(codes, kind="stable")
    starts = np.flatnonzero(np.diff(codes[order], prepend=-1))
    columns = [sub[k].to_numpy(dtype=object) for k in keys]
    return [(tuple(c[pos[0]] for c in columns), pos) for pos in np.split(order, starts[1:])]


def ablation_table(frame: pd.DataFrame, experiment: str | None = None,
                   by: Iterable[str] | None = None, metric: str | None = None,
                   final: bool = False) -> pd.DataFrame:
    """Mean, std, n, 95% CI, min and max over seeds per cell; see the module doc."""
    with collector_paused():
        return _ablation_table(frame, experiment, by, metric, final)


def _ablation_table(frame: pd.DataFrame, experiment: str | None, by: Iterable[str] | None,
                    metric: str | None, final: bool) -> pd.DataFrame:
    directions = dict(frame.attrs.get("directions", {}))
    all_metrics = list(frame.attrs.get("metrics", []))
    config_cols = list(frame.attrs.get("config_columns", []))
    axes = list(frame.attrs.get("axes", []))
    frame = frame.copy(deep=False)
    frame.attrs = {}  # pandas deep-copies attrs into every selection: thousands here
    kind = "final" if final else "best"
    if frame.empty:
        raise AnalysisError("no runs yet")
    if experiment is not None:
        known = sorted(frame["experiment"].unique())
        if experiment not in known:
            raise AnalysisError(f"no experiment {experiment!r}; there are: {', '.join(known)}")
        frame = frame[frame["experiment"] == experiment]
    if metric is not None:
        if metric not in all_metrics:
            raise AnalysisError(f"no metric {metric!r}; the runs report: "
                                f"{', '.join(all_metrics) or 'nothing yet'}")
        all_metrics = [metric]
    metrics = [m for m in all_metrics if f"{kind}_{m}" in frame]
    by = [k.strip() for k in by if k.strip()] if by else None
    for key in by or ():
        if key in ("seed", "id"):
            raise AnalysisError(f"cannot group by {key!r}: tables aggregate over seeds")
        if key not in frame.columns:
            raise AnalysisError(f"no column {key!r} to group by; config keys are: {', '.join(config_cols)}")
    out_rows: list[dict[str, Any]] = []
    all_keys: dict[str, None] = {}
    for exp in dict.fromkeys(frame["experiment"]):
        sub = frame[frame["experiment"] == exp]
        keys = _grouping(sub, config_cols, by, axes)
        all_keys.update(dict.fromkeys(keys))
        # whole columns as arrays, each cell a set of row positions: per-cell pandas
        # objects cost about a millisecond a cell
        status = sub["status"].to_numpy(dtype=object)
        completed, pending_all = status == states.COMPLETED, np.isin(status, PENDING)
        numbers = {m: pd.to_numeric(sub[f"{kind}_{m}"], errors="coerce").to_numpy(float)
                   for m in metrics}
        cells = []
        for values, pos in _cells_of(sub, keys):
            done = completed[pos]
            pending = int(pending_all[pos].sum())
            row: dict[str, Any] = {"experiment": exp, **dict(zip(keys, values, strict=True))}
            k = int(done.sum())
            failed = len(pos) - k - pending
            seeds = (f"{k}/{k + pending}" if pending else str(k)) + (
                f" ({failed} failed)" if failed else "")
            row.update(seeds=seeds, n=k, runs=len(pos), pending=pending, failed=failed)
            samples = {}
            for m in metrics:
                vals = numbers[m][pos][done]
                vals = vals[~np.isnan(vals)]
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
                            p = welch_p(x, y)  # seeds that agree exactly: nan, no warning
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
    table = pd.DataFrame(out_rows)
    for key in all_keys:  # object columns: 32 stays 32 where another experiment lacks the key
        table[key] = pd.Series([r.get(key) for r in out_rows], dtype=object, index=table.index)
    front = ["experiment", *all_keys, "seeds", "n", "runs", "pending", "failed"]
    stats_cols = [f"{m}_{s}" for m in metrics for s in ("mean", "std", "ci95", "min", "max", "best",
                                                        "delta", "delta_rel", "p")]
    table = table[front + [c for c in stats_cols if c in table.columns]]
    table.attrs.update(directions={m: records.direction(m, directions) for m in metrics},
                       metrics=metrics, keys=list(all_keys), value=kind)
    return table
