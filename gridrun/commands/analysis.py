"""`gridrun compare` and `gridrun export`: ablation tables and files from finished runs."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from gridrun.commands.common import DEFAULT_ROOT, RootOption, fail


class Format(StrEnum):
    table = "table"
    csv = "csv"
    markdown = "markdown"
    latex = "latex"
    json = "json"


class What(StrEnum):
    runs = "runs"
    metrics = "metrics"
    ablation = "ablation"


START_HINT = "start some with: gridrun run experiments.toml"


def _runs(root: Path, experiment: str | None) -> Any:
    """The runs (of one experiment) from the store, their folders only where needed
    (see gridrun.analysis.frames); a root without a store from its folders. Rows,
    not a DataFrame: `compare` never imports pandas."""
    from gridrun.analysis import frames

    frame = frames.load_rows(root, experiment)
    if frame.empty:
        known = frames.experiments(root) if experiment is not None else []
        if experiment is None or not known:
            fail(f"no runs under {root} yet; {START_HINT}")
        if experiment not in known:
            fail(f"no experiment {experiment!r} under {root}; there are: {', '.join(known)}")
        from gridrun.analysis.tables import notes

        _notes(notes(frame))
        fail(f"no readable runs of {experiment!r} under {root}")
    return frame


def _notes(notes: list[str]) -> None:
    """What the readers left out (an unreadable config.toml, lines of a metrics log),
    on stderr so that a table piped elsewhere stays clean."""
    for note in dict.fromkeys(notes):
        typer.echo(f"note: {note}", err=True)


def compare(
    experiment: Annotated[str | None, typer.Argument(help="Only this experiment (default: all).")] = None,
    by: Annotated[str | None, typer.Option("--by", help="Group by these keys, comma-separated "
                                           "(default: the keys that vary; never the seed).")] = None,
    metric: Annotated[str | None, typer.Option("--metric", help="Only this metric.")] = None,
    final: Annotated[bool, typer.Option("--final", help="The value at the last evaluation "
                                        "instead of the best one (what early stopping keeps).")] = False,
    own_best: Annotated[bool, typer.Option(
        "--own-best", help="Each metric's own best evaluation, instead of every metric at the "
        "evaluation best in the early-stop metric (what early stopping keeps).")] = False,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
    root: RootOption = DEFAULT_ROOT,
) -> None:
    """Mean ± std over seeds per cell, the best cell per metric, deltas vs the baseline."""
    from gridrun.analysis.ablation import AnalysisError, ablation
    from gridrun.analysis.tables import format_table, notes

    frame = _runs(root, experiment)
    try:
        table = ablation(frame, experiment, by=by.split(",") if by else None,
                         metric=metric, final=final, own=own_best)
    except AnalysisError as exc:
        fail(str(exc))
    typer.echo(format_table(table, fmt.value), nl=False)
    _notes([*notes(frame), *table.attrs.get("notes", [])])


def export(
    out: Annotated[Path, typer.Option("-o", "--output", help="The file to write: .csv, or "
                                      ".parquet (needs pyarrow).", dir_okay=False)],
    what: Annotated[What, typer.Option("--what", help="runs: one row per run; metrics: every "
                                       "logged value, long format; ablation: the compare table.")
                    ] = What.runs,
    experiment: Annotated[str | None, typer.Option("--experiment", help="Only this experiment.")] = None,
    status: Annotated[str | None, typer.Option("--status", help="Only runs in this state "
                                               "(completed, running, failed, ...).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists "
                                        "(never through a symbolic link).")] = False,
    root: RootOption = DEFAULT_ROOT,
) -> None:
    """Write runs, metrics or the ablation table to a CSV or Parquet file (atomically:
    the file is complete or not there)."""
    from gridrun.analysis.ablation import AnalysisError, ablation_table
    from gridrun.analysis.export import TargetExists, check_target, export_metrics, write_frame
    from gridrun.analysis.tables import notes
    from gridrun.runs import runlog, states

    if status is not None and status not in states.ALL:
        fail(f"unknown status {status!r}: choose one of {', '.join(states.ALL)}")
    if not out.parent.is_dir():
        fail(f"cannot write {out}: the folder {out.parent} does not exist")
    try:
        check_target(out, force)  # before reading every run: refusing is instant
    except (AnalysisError, TargetExists) as exc:
        fail(str(exc))
    runs = _runs(root, experiment)
    frame = runs.to_frame()
    if status is not None:
        frame = frame[frame["status"] == status]
        if frame.empty:
            fail(f"no {status} runs under {root}" + (f" in {experiment!r}" if experiment else ""))
    skipped: dict[str, int] = {}
    try:
        if what is What.metrics:
            statuses = dict(zip(frame["id"], frame["status"], strict=True))
            rows = export_metrics(root, out, experiment, status, statuses, force=force,
                                  skipped=skipped)
        elif what is What.ablation:
            rows = write_frame(ablation_table(frame, experiment), out, force=force)
        else:
            if experiment is not None:
                frame = frame[frame["experiment"] == experiment]
            rows = write_frame(frame, out, force=force)
    except (AnalysisError, TargetExists) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
    _notes([*notes(runs), *(runlog.skipped_note(n, path) for path, n in skipped.items())])
    typer.echo(f"wrote {rows:,} rows ({what.value}) to {out}")


def register(app: typer.Typer) -> None:
    app.command()(compare)
    app.command()(export)
