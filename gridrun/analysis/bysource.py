"""Variance by source (`gridrun compare --by-source`): for an experiment that varies
its sources of randomness one at a time (`grid = { vary = [...] }`, spec/sources.py),
the spread of each metric over the seeds of each source (std, range, the 95% CI of
the mean) next to the spread when every source varies.

The protocol of Summers & Dinneen (ICML 2021) and Bouthillier et al. (MLSys 2021):
N runs per source, each varying that source alone, the others fixed at the base
seed, and N runs varying them all. A source whose spread is close to "all"'s is
enough on its own to make two runs disagree that much.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

from gridrun.analysis.ablation import AnalysisError, _grouping, _number, _summary_stats
from gridrun.analysis.frames import TRACKED, collector_paused
from gridrun.analysis.rowtable import RowTable, missing
from gridrun.runs import records, states
from gridrun.spec.sources import ALL, SOURCES, VARY

STATS = ("mean", "std", "ci95", "min", "max", "range", "vs_all")
FORMATS = ("table", "markdown", "csv", "json")


def source_name(vary: Any) -> str:
    """A `vary` value as the table names it: "order", "init+order", "all"."""
    if missing(vary) or vary == ALL:
        return ALL
    if isinstance(vary, str):
        return vary
    with contextlib.suppress(TypeError):
        return "+".join(str(v) for v in vary)
    return str(vary)


def _order(name: str) -> tuple[int, int, str]:
    """Single sources in SOURCES' order, then combinations, then all."""
    if name == ALL:
        return (2, 0, name)
    return (0, SOURCES.index(name), name) if name in SOURCES else (1, 0, name)


def by_source(runs: RowTable, experiment: str | None = None, metric: str | None = None,
              final: bool = False) -> RowTable:
    """One row per (cell of the other axes, source): the spread of each metric."""
    with collector_paused():
        return _by_source(runs, experiment, metric, final)


def _by_source(runs: RowTable, experiment: str | None, metric: str | None,
               final: bool) -> RowTable:
    if runs.empty:
        raise AnalysisError("no runs yet")
    kind = "final" if final else "best"
    directions = dict(runs.attrs.get("directions", {}))
    metrics = list(runs.attrs.get("metrics", []))
    if metric is not None:
        if metric not in metrics:
            raise AnalysisError(f"no metric {metric!r}; the runs report: "
                                f"{', '.join(metrics) or 'nothing yet'}")
        metrics = [metric]
    metrics = [m for m in metrics if f"{kind}_{m}" in runs.columns]
    rows = runs.rows
    known = list(dict.fromkeys(str(r.get("experiment")) for r in rows))
    if experiment is not None:
        if experiment not in known:
            raise AnalysisError(f"no experiment {experiment!r}; there are: {', '.join(sorted(known))}")
        known = [experiment]
    varying = [e for e in known if any(source_name(r.get(VARY)) != ALL
                                       for r in rows if r.get("experiment") == e)]
    if not varying:
        which = f"experiment {experiment!r} does not" if experiment else "no experiment does"
        raise AnalysisError(
            f"{which} vary its sources of randomness one at a time: give it, e.g., "
            'seeds = 5 and grid = { vary = ["all", "init", "order", "augment", "model"] }')
    config_cols = list(runs.attrs.get("config_columns", []))
    axes = list(runs.attrs.get("axes", []))
    out: list[dict[str, Any]] = []
    all_keys: dict[str, None] = {}
    tracked: dict[str, None] = {}  # the metrics the runs' best evaluations are best in
    for exp in varying:
        sub = [r for r in rows if r.get("experiment") == exp]
        tracked.update(dict.fromkeys(r[TRACKED] for r in sub if isinstance(r.get(TRACKED), str)))
        keys = [k for k in _grouping(sub, config_cols, None, axes) if k not in (VARY, "ablation")]
        if any(r.get("ablation") not in (None, "") for r in sub):
            keys = ["ablation", *keys]
        all_keys.update(dict.fromkeys(keys))
        cells: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = {}
        for r in sub:
            cell = cells.setdefault(tuple(repr(r.get(k)) for k in keys), {})
            cell.setdefault(source_name(r.get(VARY)), []).append(r)
        for groups in cells.values():
            first = next(iter(groups.values()))[0]
            base = {k: first.get(k) for k in keys}
            made = []
            for name in sorted(groups, key=_order):
                members = groups[name]
                done = [r for r in members if r.get("status") == states.COMPLETED]
                row: dict[str, Any] = {"experiment": exp, **base, "source": name, "n": len(done),
                                       "runs": len(members)}
                for m in metrics:
                    values = [v for v in (_number(r.get(f"{kind}_{m}")) for r in done)
                              if not math.isnan(v)]
                    stats = _summary_stats(values)
                    stats["range"] = stats["max"] - stats["min"] if values else math.nan
                    row.update({f"{m}_{s}": v for s, v in stats.items()})
                made.append(row)
            everything = next((r for r in made if r["source"] == ALL), None)
            for row in made:
                for m in metrics:
                    reference = everything[f"{m}_std"] if everything else math.nan
                    ratio = row[f"{m}_std"] / reference if reference and not math.isnan(
                        reference) else math.nan
                    row[f"{m}_vs_all"] = ratio
            out.extend(made)
    columns = ["experiment", *all_keys, "source", "n", "runs",
               *(f"{m}_{s}" for m in metrics for s in STATS)]
    return RowTable(out, columns, {"metrics": metrics, "keys": list(all_keys), "value": kind,
                                   "tracked": list(tracked),
                                   "directions": {m: records.direction(m, directions)
                                                  for m in metrics}})


def _decimals(rows: list[dict[str, Any]], m: str) -> int:
    """One precision per metric: two significant digits of its smallest nonzero spread."""
    spreads = [r[f"{m}_std"] for r in rows if not missing(r[f"{m}_std"]) and r[f"{m}_std"] > 0]
    if not spreads:
        return 4
    return max(0, 1 - math.floor(math.log10(min(spreads))))


def cells(table: RowTable) -> tuple[list[str], list[list[str]]]:
    """The header and the text cells of the table, markdown and terminal alike."""
    metrics, keys = table.attrs["metrics"], table.attrs["keys"]
    show_exp = len(set(table.column("experiment"))) > 1
    header = [*(["experiment"] if show_exp else []), *keys, "source", "seeds"]
    for m in metrics:
        arrow = "↓" if table.attrs["directions"].get(m) == records.LOWER else "↑"
        header += [f"{m} {arrow} mean ± 95% CI", "std", "range", "std/all"]
    precision = {m: _decimals(table.rows, m) for m in metrics}
    body = []
    for r in table.rows:
        line = [*([str(r["experiment"])] if show_exp else []),
                *("" if missing(r.get(k)) else str(r.get(k)) for k in keys), r["source"],
                str(r["n"]) if r["n"] == r["runs"] else f"{r['n']}/{r['runs']}"]
        for m in metrics:
            d = precision[m]
            num = lambda v, d=d: "–" if missing(v) else f"{v:.{d}f}"  # noqa: E731
            mean, ci = r[f"{m}_mean"], r[f"{m}_ci95"]
            line += [num(mean) + ("" if missing(ci) else f" ± {ci:.{d}f}"), num(r[f"{m}_std"]),
                     num(r[f"{m}_range"]),
                     "–" if missing(r[f"{m}_vs_all"]) else f"{r[f'{m}_vs_all']:.2f}"]
        body.append(line)
    return header, body


def legend(table: RowTable) -> str:
    """What the columns hold, one line: with --final each seed's last evaluation; else
    every metric at the evaluation best in the tracked (early-stop) metric, as
    `compare`'s table takes them, not each metric's own best."""
    if table.attrs.get("value") == "final":
        value = "each finished seed's last evaluation"
    else:
        tracked = table.attrs.get("tracked") or []
        at = f"best {tracked[0]}" if len(tracked) == 1 else "best early-stop metric"
        value = (f"each finished seed's evaluation with the {at} (every metric at that "
                 "evaluation, as early stopping keeps it)")
    return (f"{value}, only that source varying (the others at the first seed); ± 95% CI of "
            "the mean (Student t); range: max - min; std/all: the std over the std with every "
            "source varying")


def format_sources(table: RowTable, fmt: str = "table") -> str:
    """The by-source table as text: table | markdown | csv | json."""
    if fmt == "json":
        return json.dumps([{c: None if missing(r.get(c)) else r.get(c) for c in table.columns}
                           for r in table.rows], indent=1, default=str) + "\n"
    if fmt == "csv":
        return table.to_csv()
    header, body = cells(table)
    if fmt == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join([*lines, "", legend(table)]) + "\n"
    if fmt == "table":
        widths = [max(len(x) for x in col) for col in zip(header, *body, strict=True)]
        line = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()  # noqa: E731
        return "\n".join([line(header), "  ".join("─" * w for w in widths), *map(line, body),
                          legend(table)]) + "\n"
    raise AnalysisError(f"--by-source prints {', '.join(FORMATS)}, not {fmt!r}")
