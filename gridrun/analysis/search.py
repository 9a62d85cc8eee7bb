"""A search's trials as a leaderboard (`gridrun compare` on a search's experiment):
the best trials, their values and the budget each used, and per parameter its
Spearman rank correlation with the metric. Plain rows, no pandas; its formats are
in analysis/tables.py with the ablation table's."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gridrun.analysis.rowtable import RowTable, missing
from gridrun.runs import layout, records

TOP = 10


def ranks(values: Sequence[Any]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: Sequence[Any], ys: Sequence[float]) -> float | None:
    """Spearman's rho (Pearson's r of the ranks); None below 3 pairs or with no spread."""
    if len(xs) < 3:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else None


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _best(row: dict[str, Any], metric: str) -> float | None:
    """A run's best evaluation of `metric`: its own best, else at the early-stop metric's."""
    value = next((v for v in (row.get(f"own_{metric}"), row.get(f"best_{metric}")) if _number(v)),
                 None)
    return None if value is None else float(value)


def _mean(values: list[float | None]) -> float | None:
    """The mean where every run (seed) has a value, else None."""
    ok = [v for v in values if v is not None]
    return sum(ok) / len(ok) if ok and len(ok) == len(values) else None


def trials(table: RowTable) -> list[dict[str, Any]]:
    """One entry per trial: its runs' (seeds') mean final metric (its last evaluation: at
    the end of the rung it reached) and mean best evaluation, epochs used, state."""
    by_trial: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in table:
        if not missing(row.get("trial")):
            by_trial[int(row["trial"])].append(row)
    out = []
    for trial, rows in sorted(by_trial.items()):
        metric = rows[0].get("search_metric") or rows[0].get("tracked") or "loss"
        out.append({"trial": trial, "rows": rows, "metric": metric,
                    "value": _mean([float(v) if _number(v := r.get(f"final_{metric}")) else None
                                    for r in rows]),
                    "best": _mean([_best(r, metric) for r in rows]),
                    "epochs_used": sum(int(r.get("epochs_used") or 0) for r in rows),
                    "epochs": max(int(r.get("epochs_used") or 0) for r in rows),
                    "rung": rows[0].get("rung"), "status": rows[0].get("status")})
    return out


def leaderboard(table: RowTable, axes: Iterable[str], first_rung: dict[int, float] | None = None,
                *, mode: str | None = None, top: int = TOP) -> dict[str, Any]:
    """The best trials first (the furthest trained, then the best metric, then the index),
    the budget used against every trial trained to the full budget, and per parameter
    its rank correlation with the metric (on `first_rung`, where every trial has a
    result, when given; else on the trials' last values)."""
    found = trials(table)
    if not found:
        return {}
    metric = found[0]["metric"]
    directions = table.attrs.get("directions") or {}
    mode = mode or ("min" if records.direction(metric, directions) == records.LOWER else "max")
    sign = 1 if mode == "min" else -1
    ranked = sorted(found, key=lambda t: (-t["epochs"], t["value"] is None,
                                          sign * (t["value"] or 0.0), t["trial"]))
    budget = max(int(r.get("epochs") or 0) for t in found for r in t["rows"])
    full = budget * sum(len(t["rows"]) for t in found)
    used = sum(t["epochs_used"] for t in found)
    correlations = {}
    for key in axes:  # over the trials with a result there (a rebuilt store may lack some)
        pairs = [(t["rows"][0].get(key), first_rung.get(t["trial"]) if first_rung else t["value"])
                 for t in found]
        pairs = [(x, y) for x, y in pairs if _number(x) and _number(y)]
        rho = spearman([x for x, _ in pairs], [y for _, y in pairs])
        correlations[key] = None if rho is None else round(rho, 3)
    return {"metric": metric, "mode": mode, "trials": len(found), "epochs_used": used,
            "epochs_full": full, "max_epochs": budget,
            "on": "the first rung" if first_rung else "the last value",
            "leaders": [{"rank": i + 1, "trial": t["trial"], "status": t["status"],
                         "rung": t["rung"], "epochs": t["epochs"], "value": t["value"],
                         "best": t["best"],
                         "values": {k: t["rows"][0].get(k) for k in axes},
                         "runs": [r.get("id") for r in t["rows"]]}
                        for i, t in enumerate(ranked[:top])],
            "spearman": correlations}


def first_rung(root: Any, search_id: str | None) -> dict[int, float] | None:
    """Each trial's result at its search's first rung (the mean over its seeds), from the
    store's kept results; None without a scheduler, a store or results."""
    if not search_id or not (Path(root) / layout.DB_NAME).is_file():
        return None
    try:
        from gridrun.runs.store import Store

        with Store(root, create=False, create_store=False) as store:
            kept = store.search_results(search_id)
    except Exception:  # no rung results: the correlations are on the last values
        return None
    if not kept:
        return None
    epoch = min(r.epoch for r in kept)
    at: dict[int, list[float | None]] = defaultdict(list)
    for r in kept:
        if r.epoch == epoch:
            at[r.trial].append(r.value)
    return {t: sum(v) / len(v) for t, v in at.items() if None not in v} or None  # type: ignore[arg-type]


def board_of(root: Any, table: RowTable, experiment: str, *, top: int = TOP,
             correlate: bool = True) -> dict[str, Any] | None:
    """The leaderboard of `experiment` when it is a search, else None; `correlate`
    False leaves the rank correlations out (they read the store's rung results)."""
    found = [r for r in table if r.get("experiment") == experiment and not missing(r.get("trial"))]
    if not found:
        return None
    mine = RowTable(found, table.columns, table.attrs)
    if not correlate:
        return leaderboard(mine, [], top=top)
    axes = [k for k in table.attrs.get("axes", []) if any(k in r for r in found)]
    return leaderboard(mine, axes, first_rung(root, found[0].get("search")), top=top)


METRIC_COLUMN = 5  # where leaderboard_cells puts the metric the trials are ranked by
AT_RUNG_END = "at rung end"  # what that column holds, said in its header and the notes


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


def leaderboard_cells(board: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The leaderboard's header and rows as text: one formatter for the CLI and the interface.
    The value ranked by is labelled as the one at the rung's end, the best beside it."""
    arrow = "↓" if board["mode"] == "min" else "↑"
    keys = list(board["leaders"][0]["values"]) if board["leaders"] else []
    head = ["RANK", "TRIAL", "STATUS", "RUNG", "EPOCHS", f"{board['metric']}{arrow} {AT_RUNG_END}",
            f"best {board['metric']}{arrow}", *keys]
    rows = [[str(t["rank"]), f"t{t['trial']}", str(t["status"]),
             "-" if t["rung"] is None else f"r{t['rung']}", str(t["epochs"]),
             _cell(t["value"]), _cell(t.get("best")),
             *(f"{v:.4g}" if isinstance(v, float) else str(v) for v in t["values"].values())]
            for t in board["leaders"]]
    return head, rows


def leaderboard_notes(board: dict[str, Any]) -> list[str]:
    """What the two values are, the budget the search used and each parameter's rank
    correlation with the metric."""
    arrow = "↓" if board["mode"] == "min" else "↑"
    share = board["epochs_used"] / board["epochs_full"] if board["epochs_full"] else 0.0
    lines = [f"{board['metric']}{arrow} {AT_RUNG_END}: each trial's evaluation at the end of the "
             "last rung it reached (the mean over its seeds), what the search ranks by; best: "
             "its best evaluation (what `gridrun ls` shows as BEST)",
             f"budget used: {board['epochs_used']:,} of {board['epochs_full']:,} epochs "
             f"({share:.0%}) that every trial trained to {board['max_epochs']} would take"]
    rho = ", ".join(f"{k} {'n/a' if v is None else f'{v:+.2f}'}"
                    for k, v in board["spearman"].items())
    if rho:
        lines.append(f"Spearman rank correlation with {board['metric']} (on {board['on']}): {rho}")
    return lines
