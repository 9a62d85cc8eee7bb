"""Ablation tables (and a search's leaderboard) as text: one cell formatter for the
CLI and the interface, and the formats `gridrun compare` prints (table, csv,
markdown, latex, json)."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gridrun.analysis.ablation import AnalysisError, ablation
from gridrun.analysis.frames import run_rows, store_runs
from gridrun.analysis.rowtable import RowTable, missing, spelled
from gridrun.analysis.search import METRIC_COLUMN, board_of, leaderboard_cells, leaderboard_notes
from gridrun.runs import layout, records

if TYPE_CHECKING:
    import pandas as pd


FORMATS = ("table", "csv", "markdown", "latex", "json")


def _decimals(mean: float, std: float) -> int:
    """Decimal places: two significant digits of the std, or four of the mean alone."""
    if not math.isnan(std) and std > 0:
        return max(0, 1 - math.floor(math.log10(std)))
    if math.isnan(mean) or mean == 0:
        return 2
    return max(0, 3 - math.floor(math.log10(abs(mean))))


def _num(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}"


@dataclass(frozen=True)
class Cells:
    """An ablation table as text cells: what `gridrun compare` prints and the
    interface's compare screen shows. `best` holds the (row, column) of each
    metric's best mean, for the caller to mark its own way."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    best: frozenset[tuple[int, int]]


def _rows(table: RowTable | pd.DataFrame) -> RowTable:
    return table if isinstance(table, RowTable) else RowTable.from_frame(table)


def table_cells(table: RowTable | pd.DataFrame, pm: str = " ± ",
                esc: Any = lambda text: text) -> Cells:
    """The one formatter of an ablation table's cells: the grouping keys, seeds
    ("k/n" while some run, "(f failed)"), then per metric (with its direction's
    arrow) mean ± std to two significant digits of the std, and for ablations
    Δ vs the baseline (relative in brackets) and Welch's p. `esc` escapes the
    plain text; `pm` goes in as it is."""
    table = _rows(table)
    metrics = table.attrs.get("metrics") or sorted(
        {c[:-5] for c in table.columns if c.endswith("_mean")})
    keys = table.attrs.get("keys") or []
    directions = table.attrs.get("directions", {})
    show_exp = len(set(table.column("experiment"))) > 1
    deltas = "ablation" in keys
    header = [*(["experiment"] if show_exp else []), *map(esc, keys), "seeds"]
    tracked = table.attrs.get("tracked") or []
    for m in metrics:
        arrow = "↓" if records.direction(m, directions) == records.LOWER else "↑"
        # by default a metric's value is taken at the tracked metric's best evaluation:
        # a column of another metric says so (its own best: --own-best)
        at = (f" at best {esc(tracked[0])}" if table.attrs.get("value", "best") == "best"
              and len(tracked) == 1 and m != tracked[0] else "")
        header.append(f"{esc(m)} {arrow}{at}")
        if deltas and f"{m}_delta" in table.columns:
            header += [f"Δ {esc(m)}", "p"]
    # a metric's deltas share one precision down the column (the finest its cells need)
    precision = {m: max((_decimals(r[f"{m}_mean"], r[f"{m}_std"]) for r in table.rows
                         if not missing(r[f"{m}_mean"])), default=2) for m in metrics}
    rows, best = [], set()
    for i, r in enumerate(table.rows):
        cells = [*([esc(str(r["experiment"]))] if show_exp else []),
                 *("" if missing(r[k]) else esc(str(r[k])) for k in keys), str(r["seeds"])]
        for m in metrics:
            mean, std = r[f"{m}_mean"], r[f"{m}_std"]
            d = _decimals(mean, std)
            if r[f"{m}_best"]:
                best.add((i, len(cells)))
            cells.append("–" if math.isnan(mean) else _num(mean, d) if math.isnan(std)
                         else f"{_num(mean, d)}{pm}{_num(std, d)}")
            if deltas and f"{m}_delta" in table.columns:
                delta, rel, p = r[f"{m}_delta"], r[f"{m}_delta_rel"], r[f"{m}_p"]
                cells.append("" if missing(delta) else esc(
                    f"{delta:+.{precision[m]}f}" + ("" if missing(rel) else f" ({rel:+.1%})")))
                cells.append("" if missing(p) else f"{p:.2g}" if p >= 0.001 else esc("<0.001"))
        rows.append(tuple(cells))
    return Cells(tuple(header), tuple(rows), frozenset(best))


def _cells(table: RowTable, bold: tuple[str, str], pm: str,
           esc: Any = lambda text: text) -> tuple[list[str], list[list[str]]]:
    """Header and text cells of the terminal, Markdown and LaTeX tables, the best
    ones between `bold`'s two marks."""
    c = table_cells(table, pm, esc)
    rows = [[f"{bold[0]}{text}{bold[1]}" if (i, j) in c.best else text for j, text in enumerate(row)]
            for i, row in enumerate(c.rows)]
    return list(c.header), rows


def legend(table: RowTable | pd.DataFrame, mark: str) -> str:
    """What the numbers of a formatted table are, one line; `mark` names the best cells' mark."""
    kind, tracked = table.attrs.get("value"), table.attrs.get("tracked") or []
    if kind == "final":
        value = "the last evaluation's values"
    elif kind == "own":
        value = "each metric's own best validation value"
    else:
        at = f"best {tracked[0]}" if len(tracked) == 1 else "best early-stop metric"
        value = (f"each run's evaluation with the {at} (what early stopping keeps; "
                 "--own-best: each metric's own best)")
    text = f"mean ± std over finished seeds of {value}; {mark} best per metric"
    if "ablation" in table.attrs.get("keys", []):
        text += "; Δ vs baseline, p from Welch's t-test (needs 2+ seeds each)"
    return text


def _latex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"),
                 ("#", r"\#"), ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("<", "$<$")):
        text = text.replace(a, b)
    return text


def _plain(value: Any) -> Any:
    """A cell as JSON has it: missing as null, NumPy scalars as Python's."""
    if missing(value):
        return None
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        return value.item()
    return value


def format_table(table: RowTable | pd.DataFrame, fmt: str = "table") -> str:
    """The ablation table as text: table | csv | markdown | latex | json."""
    table = _rows(table)
    if fmt == "csv":
        return table.to_csv()
    if fmt == "json":
        rows = [{c: _plain(r.get(c)) for c in table.columns} for r in table.rows]
        return json.dumps(rows, indent=1, default=str) + "\n"
    experiments = list(dict.fromkeys(table.column("experiment")))
    if fmt in ("table", "markdown", "latex") and len(experiments) > 1:
        # experiments vary different keys: one block each
        blocks = []
        for exp in experiments:
            part = table.where("experiment", exp)
            part.attrs["keys"] = [k for k in table.attrs.get("keys", [])
                                  if any(not missing(r.get(k)) for r in part.rows)]
            title = {"table": f"{exp}\n", "markdown": f"### {exp}\n\n", "latex": f"% {exp}\n"}[fmt]
            blocks.append(title + format_table(part, fmt))
        return "\n".join(blocks)
    if fmt == "table":
        header, rows = _cells(table, ("", " *"), " ± ")
        widths = [max(len(x) for x in col) for col in zip(header, *rows, strict=True)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
        out = [line(header), "  ".join("─" * w for w in widths), *map(line, rows)]
        return "\n".join([*out, legend(table, "*")]) + "\n"
    if fmt == "markdown":
        header, rows = _cells(table, ("**", "**"), " ± ")
        out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join([*out, "", legend(table, "bold:")]) + "\n"
    if fmt == "latex":
        header, rows = _cells(table, ("\\textbf{", "}"), " $\\pm$ ", _latex_escape)
        symbols = {"↓": r"$\downarrow$", "↑": r"$\uparrow$", "Δ": r"$\Delta$"}
        header = ["".join(symbols.get(ch, ch) for ch in h) for h in header]
        lead = header.index("seeds")  # the grouping columns, left-aligned; numbers right
        out = [r"\begin{tabular}{" + "l" * lead + "r" * (len(header) - lead) + "}", r"\toprule",
               " & ".join(header) + r" \\", r"\midrule"]
        out += [" & ".join(r) + r" \\" for r in rows]
        out += [r"\bottomrule", r"\end{tabular}"]
        return "\n".join(out) + "\n"
    raise AnalysisError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")


def search_text(root: Any, table: RowTable, experiment: str, fmt: str = "table") -> str | None:
    """The leaderboard of `experiment` when it is a search, else None."""
    board = board_of(root, table, experiment)
    return None if board is None else format_leaderboard(board, experiment, fmt)


def format_leaderboard(board: dict[str, Any], experiment: str, fmt: str = "table") -> str:
    """A search's leaderboard in each of compare's formats: csv holds the values at
    full precision, the others the cells and the budget (and correlation) lines."""
    if fmt == "json":
        return json.dumps(board) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        keys = list(board["leaders"][0]["values"]) if board["leaders"] else []
        # the metric's column is at the rung's end, as before; best_<metric> was added after it
        writer.writerow(["rank", "trial", "status", "rung", "epochs", board["metric"],
                         f"best_{board['metric']}", *keys])
        writer.writerows([t["rank"], t["trial"], t["status"], t["rung"], t["epochs"], t["value"],
                          t.get("best"), *map(spelled, t["values"].values())]
                         for t in board["leaders"])
        return out.getvalue()
    head, rows = leaderboard_cells(board)
    below = leaderboard_notes(board)
    if fmt == "table":
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        lines = [f"search {experiment}: {board['trials']} trials, "
                 f"the best {len(board['leaders'])}"]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                  for r in [head, *rows]]
        return "\n".join([*lines, *below]) + "\n"
    if fmt == "markdown":
        bold = [[f"**{c}**" if (i, j) == (0, METRIC_COLUMN) else c for j, c in enumerate(r)]
                for i, r in enumerate(rows)]
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in bold]
        return "\n".join([*lines, "", *below]) + "\n"
    if fmt == "latex":
        symbols = {"↓": r"$\downarrow$", "↑": r"$\uparrow$"}
        head = ["".join(symbols.get(ch, ch) for ch in _latex_escape(h)) for h in head]
        cells = [[f"\\textbf{{{_latex_escape(c)}}}" if (i, j) == (0, METRIC_COLUMN)
                  else _latex_escape(c) for j, c in enumerate(r)] for i, r in enumerate(rows)]
        lines = [f"% search {experiment}", *(f"% {line}" for line in below),
                 r"\begin{tabular}{lllrr" + "r" * (len(head) - 5) + "}", r"\toprule",
                 " & ".join(head) + r" \\", r"\midrule", *(" & ".join(r) + r" \\" for r in cells),
                 r"\bottomrule", r"\end{tabular}"]
        return "\n".join(lines) + "\n"
    raise AnalysisError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")


def notes(frame: RowTable | pd.DataFrame) -> list[str]:
    """What a reader of these files should know was left out, one line each."""
    return [*(f"skipped {folder}: its {layout.CONFIG} cannot be read"
              for folder in frame.attrs.get("skipped", [])), *frame.attrs.get("notes", [])]


def comparison_text(root: str | os.PathLike, experiments: Iterable[str] | None = None,
                    statuses: Mapping[str, str] | None = None) -> str:
    """The table `gridrun run` prints when its runs are done, and how to export it:
    each experiment's runs from the store (its folders without one); `statuses`
    override what the store says."""
    names = list(experiments or ()) or None
    frames = [run_rows(root, statuses, runs=store_runs(root, exp), experiment=exp)
              for exp in (names or [None])]
    parts, notes_ = [], []
    for frame in frames:
        for exp in dict.fromkeys(frame.column("experiment")):
            if names is None or exp in names:
                board = search_text(root, frame, exp)  # a search: its leaderboard
                parts.append(board.rstrip("\n") + "\n" if board else
                             f"{exp}\n" + format_table(ablation(frame, exp)))
        notes_.extend(notes(frame))
    if all(frame.empty for frame in frames):
        return ""
    parts.extend(f"note: {n}" for n in dict.fromkeys(notes_))
    parts.append(f"export: gridrun export --what ablation -o results.csv --root {root}")
    return "\n".join(parts) + "\n"
