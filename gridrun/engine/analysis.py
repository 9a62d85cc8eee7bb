"""Run folders -> pandas: one row per run, ablation tables over seeds (exports: export.py).

Reads only files (config.toml, summary.json, metrics.jsonl); the store's view
of each run's state can be passed in. Metric directions are the task's own
("metrics": {name: "lower" | "higher"} in summary.json, or in a live run's
start line); where no run declares one, `records.direction` guesses. Live
runs go through `progress.fold`, as in the interface.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gridrun.engine import layout, progress, records, runlog, states
from gridrun.engine.spec import RunSpec, read_run_config

BASE = ["id", "experiment", "variant", "ablation", "seed", "task", "status"]
RUN_FIELDS = ["step", "total_steps", "best_step", "started_at", "ended_at", "wall_time_s",
              "train_loss", "samples_per_s", "tokens_per_s", "peak_memory_bytes", "device",
              "precision", "error"]
PENDING = (states.QUEUED, states.RUNNING, states.INTERRUPTED)
FORMATS = ("table", "csv", "markdown", "latex", "json")


class AnalysisError(ValueError):
    """A user mistake (unknown experiment, metric or key); str() says what to do."""


# --------------------------------------------------------------------------- runs_frame

def _read_config(path: Path) -> RunSpec | None:
    """A run folder's config.toml, or None when it is not one gridrun wrote:
    unreadable, not TOML, nested too deep, or a field of the wrong type."""
    try:
        spec = read_run_config(path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    names = (spec.id, spec.experiment, spec.variant, spec.task, spec.ablation)
    if not all(isinstance(n, str) for n in names) or not all(
            isinstance(k, str) for k in (*spec.trainer, *spec.task_args)):
        return None
    return spec


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


def _live(path: Path, spec: RunSpec, notes: list[str]) -> dict[str, Any]:
    """What a run without summary.json has logged so far (torn last line skipped;
    lines that are not records are skipped and noted), through the one fold."""
    got = runlog.read(path)
    if got.skipped:
        notes.append(runlog.skipped_note(got.skipped, path))
    known = progress.Progress.known(early_stop_metric=spec.trainer.get("early_stop_metric"))
    p = progress.fold(got.records, previous=known)
    return {"step": p.step if p.lines else None, "train_loss": p.train_loss,
            "samples_per_s": p.mean_samples_per_s, "final": dict(p.last),
            "best": dict(p.best_values), "best_step": p.best_step, "metrics": dict(p.metrics)}


def _row(spec: RunSpec, folder: Path | None, status: str | None,
         provenance: Mapping[str, Any] | None, directions: dict[str, str],
         notes: list[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"id": spec.id, "experiment": spec.experiment, "variant": spec.variant,
                           "ablation": spec.ablation, "seed": spec.seed, "task": spec.task}
    for key, value in spec.config.items():
        row.setdefault(key, _hashable(value))
    summary = runlog.read_summary(folder / layout.SUMMARY) if folder else None
    metrics_path = folder / layout.METRICS if folder else None
    if summary is not None:
        data, file_status = summary.to_json(), summary.status
    elif metrics_path is not None and metrics_path.exists():
        data, file_status = _live(metrics_path, spec, notes), states.RUNNING
    else:
        data, file_status = {}, states.QUEUED
    for name, direction in (data.get("metrics") or {}).items():  # as the task declares them
        directions.setdefault(name, direction)
    row["status"] = status or file_status or states.QUEUED
    for key in RUN_FIELDS:
        row[key] = data.get(key)
    for kind in ("final", "best"):
        for name, value in (data.get(kind) or {}).items():
            row[f"{kind}_{name}"] = value
    for source in (summary and summary.provenance, provenance):
        for key, value in (source if isinstance(source, Mapping) else {}).items():
            if key.startswith("git"):
                row[key] = value
            elif source is provenance and not isinstance(value, Mapping | list):
                row[f"git_{key}"] = value  # the store's {"commit", "dirty", ...}
    return row


def runs_frame(root: str | os.PathLike, statuses: Mapping[str, str] | None = None, *,
               queued: Iterable[RunSpec] = (),
               provenance: Mapping[str, Mapping[str, Any]] | None = None) -> pd.DataFrame:
    """One row per run folder ROOT/<experiment>/<run_id>/ holding a config.toml.

    `statuses` ({run_id: state}, e.g. from the store) overrides what the files
    say; `queued` adds runs the store knows that have no folder yet;
    `provenance` ({run_id: {"git_commit": ..., ...}}) adds provenance columns.
    Folders whose config.toml cannot be read are skipped and listed in
    `frame.attrs["skipped"]`; "notes" says what else was left out (metrics
    lines that are not records). `frame.attrs` also holds "directions"
    ({metric: "lower"|"higher"}), "metrics" and "config_columns".
    """
    root = Path(root)
    statuses, provenance = statuses or {}, provenance or {}
    directions: dict[str, str] = {}
    rows, skipped, seen, notes = [], [], set(), []
    config_columns: dict[str, None] = {}
    experiments = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    for exp_dir in experiments:
        for folder in sorted(exp_dir.iterdir()):
            config = folder / layout.CONFIG
            if not config.is_file():
                continue
            spec = _read_config(config)
            if spec is None:
                skipped.append(str(folder))
                continue
            seen.add(spec.id)
            config_columns.update(dict.fromkeys(spec.config))
            rows.append(_row(spec, folder, statuses.get(spec.id), provenance.get(spec.id), directions,
                             notes))
    for spec in queued:
        if spec.id not in seen:
            config_columns.update(dict.fromkeys(spec.config))
            rows.append(_row(spec, None, statuses.get(spec.id), provenance.get(spec.id), directions,
                             notes))
    frame = pd.DataFrame(rows)
    if frame.empty:
        frame = pd.DataFrame(columns=BASE)
    metrics: dict[str, None] = {}
    for column in frame.columns:
        for kind in ("best_", "final_"):
            if column.startswith(kind) and column != "best_step":
                metrics[column[len(kind):]] = None
    for name in metrics:
        directions.setdefault(name, records.direction(name))
    front = [c for c in BASE if c in frame.columns]
    config_cols = [c for c in config_columns if c not in BASE]
    rest = [c for c in frame.columns if c not in front and c not in config_cols]
    frame = frame[front + config_cols + rest]
    frame.attrs.update(directions=directions, metrics=list(metrics), skipped=skipped,
                       config_columns=config_cols, notes=notes)
    return frame


# --------------------------------------------------------------------------- ablation_table

def _summary_stats(values: np.ndarray) -> dict[str, float]:
    from scipy import stats

    n = len(values)
    mean = float(values.mean()) if n else math.nan
    std = float(values.std(ddof=1)) if n >= 2 else math.nan
    ci = float(stats.t.ppf(0.975, n - 1) * std / math.sqrt(n)) if n >= 2 else math.nan
    return {"mean": mean, "std": std, "ci95": ci,
            "min": float(values.min()) if n else math.nan,
            "max": float(values.max()) if n else math.nan}


def _grouping(sub: pd.DataFrame, config_cols: list[str], by: list[str] | None) -> list[str]:
    if by:
        return by
    def varying(rows: pd.DataFrame) -> list[str]:
        return [c for c in config_cols if c in rows and rows[c].nunique(dropna=False) > 1]
    if (sub["ablation"].fillna("") != "").any():
        # the axes of an ablation are its names; only grid axes of the baseline add to them
        return ["ablation", *varying(sub[sub["ablation"] == "baseline"])]
    return varying(sub)


def ablation_table(frame: pd.DataFrame, experiment: str | None = None,
                   by: Iterable[str] | None = None, metric: str | None = None,
                   final: bool = False) -> pd.DataFrame:
    """Mean, std, n, 95% CI, min and max over seeds per cell; see the module doc."""
    from scipy import stats

    directions = dict(frame.attrs.get("directions", {}))
    all_metrics = list(frame.attrs.get("metrics", []))
    config_cols = list(frame.attrs.get("config_columns", []))
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
        keys = _grouping(sub, config_cols, by)
        all_keys.update(dict.fromkeys(keys))
        groups = list(sub.groupby(keys, sort=False, dropna=False)) if keys else [((), sub)]
        cells = []
        for values, g in groups:
            values = values if isinstance(values, tuple) else (values,)
            done = g[g["status"] == states.COMPLETED]
            pending = int(g["status"].isin(PENDING).sum())
            row: dict[str, Any] = {"experiment": exp, **dict(zip(keys, values, strict=True))}
            k, failed = len(done), len(g) - len(done) - pending
            seeds = (f"{k}/{k + pending}" if pending else str(k)) + (
                f" ({failed} failed)" if failed else "")
            row.update(seeds=seeds, n=k, runs=len(g), pending=pending, failed=failed)
            samples = {}
            for m in metrics:
                vals = pd.to_numeric(done[f"{kind}_{m}"], errors="coerce").dropna().to_numpy(float)
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
                            with warnings.catch_warnings():
                                # seeds that agree exactly have no p-value (nan), and
                                # scipy's precision-loss warning says nothing more
                                warnings.simplefilter("ignore", RuntimeWarning)
                                p = float(stats.ttest_ind(x, y, equal_var=False).pvalue)
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


# --------------------------------------------------------------------------- formatting

def _decimals(mean: float, std: float) -> int:
    """Decimal places: two significant digits of the std, or four of the mean alone."""
    if not math.isnan(std) and std > 0:
        return max(0, 1 - math.floor(math.log10(std)))
    if math.isnan(mean) or mean == 0:
        return 2
    return max(0, 3 - math.floor(math.log10(abs(mean))))


def _num(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}"


def _cells(table: pd.DataFrame, bold: tuple[str, str], pm: str,
           esc: Any = lambda text: text) -> tuple[list[str], list[list[str]]]:
    """Header and text cells shared by the terminal, Markdown and LaTeX tables;
    `esc` escapes the plain text, then `bold` and `pm` go in as they are."""
    metrics = table.attrs.get("metrics") or sorted(
        {c[:-5] for c in table.columns if c.endswith("_mean")})
    keys = table.attrs.get("keys") or []
    directions = table.attrs.get("directions", {})
    show_exp = table["experiment"].nunique() > 1
    deltas = "ablation" in keys
    header = [*(["experiment"] if show_exp else []), *map(esc, keys), "seeds"]
    for m in metrics:
        arrow = "↓" if records.direction(m, directions) == records.LOWER else "↑"
        header.append(f"{esc(m)} {arrow}")
        if deltas and f"{m}_delta" in table:
            header += [f"Δ {esc(m)}", "p"]
    rows = []
    for _, r in table.iterrows():
        cells = [*([esc(str(r["experiment"]))] if show_exp else []),
                 *("" if _missing(r[k]) else esc(str(r[k])) for k in keys), str(r["seeds"])]
        for m in metrics:
            mean, std = r[f"{m}_mean"], r[f"{m}_std"]
            d = _decimals(mean, std)
            text = ("–" if math.isnan(mean) else _num(mean, d) if math.isnan(std)
                    else f"{_num(mean, d)}{pm}{_num(std, d)}")
            cells.append(f"{bold[0]}{text}{bold[1]}" if r[f"{m}_best"] else text)
            if deltas and f"{m}_delta" in table:
                delta, rel, p = r[f"{m}_delta"], r[f"{m}_delta_rel"], r[f"{m}_p"]
                cells.append("" if _missing(delta) else esc(
                    f"{delta:+.{d}f}" + ("" if _missing(rel) else f" ({rel:+.1%})")))
                cells.append("" if _missing(p) else f"{p:.2g}" if p >= 0.001 else esc("<0.001"))
        rows.append(cells)
    return header, rows


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _legend(table: pd.DataFrame, mark: str) -> str:
    value = "final" if table.attrs.get("value") == "final" else "best validation"
    text = f"mean ± std over finished seeds of the {value} value; {mark} best per metric"
    if "ablation" in table.attrs.get("keys", []):
        text += "; Δ vs baseline, p from Welch's t-test (needs 2+ seeds each)"
    return text


def _latex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"),
                 ("#", r"\#"), ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("<", "$<$")):
        text = text.replace(a, b)
    return text


def format_table(table: pd.DataFrame, fmt: str = "table") -> str:
    """The ablation table as text: table | csv | markdown | latex | json."""
    if fmt == "csv":
        return table.to_csv(index=False)
    if fmt == "json":
        return json.dumps(json.loads(table.to_json(orient="records")), indent=1) + "\n"
    if fmt in ("table", "markdown", "latex") and table["experiment"].nunique() > 1:
        # experiments vary different keys: one block each
        blocks = []
        for exp in dict.fromkeys(table["experiment"]):
            part = table[table["experiment"] == exp].copy()
            part.attrs = {**table.attrs,
                          "keys": [k for k in table.attrs.get("keys", []) if part[k].notna().any()]}
            title = {"table": f"{exp}\n", "markdown": f"### {exp}\n\n", "latex": f"% {exp}\n"}[fmt]
            blocks.append(title + format_table(part, fmt))
        return "\n".join(blocks)
    if fmt == "table":
        header, rows = _cells(table, ("", " *"), " ± ")
        widths = [max(len(x) for x in col) for col in zip(header, *rows, strict=True)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
        out = [line(header), "  ".join("─" * w for w in widths), *map(line, rows)]
        return "\n".join([*out, _legend(table, "*")]) + "\n"
    if fmt == "markdown":
        header, rows = _cells(table, ("**", "**"), " ± ")
        out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join([*out, "", _legend(table, "bold:")]) + "\n"
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


def notes(frame: pd.DataFrame) -> list[str]:
    """What a reader of these files should know was left out, one line each."""
    return [*(f"skipped {folder}: its {layout.CONFIG} cannot be read"
              for folder in frame.attrs.get("skipped", [])), *frame.attrs.get("notes", [])]


def comparison_text(root: str | os.PathLike, experiments: Iterable[str] | None = None,
                    statuses: Mapping[str, str] | None = None) -> str:
    """The table `gridrun run` prints when its runs are done, and how to export it."""
    frame = runs_frame(root, statuses)
    if frame.empty:
        return ""
    parts = []
    for exp in experiments or dict.fromkeys(frame["experiment"]):
        if exp in set(frame["experiment"]):
            parts.append(f"{exp}\n" + format_table(ablation_table(frame, exp)))
    parts.extend(f"note: {n}" for n in notes(frame))
    parts.append(f"export: gridrun export --what ablation -o results.csv --root {root}")
    return "\n".join(parts) + "\n"
