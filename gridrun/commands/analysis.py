"""`gridrun compare` and `gridrun export`: ablation tables and files from finished runs."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from gridrun.commands.common import DEFAULT_ROOT, STATES, RootOption, choices, fail, working


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
    from gridrun.commands.common import open_root

    open_root(root)  # a missing, unsafe or system root: one line, nothing created
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
    experiment: Annotated[str | None, typer.Argument(help="Only this experiment (default: all).",
                                                     metavar="EXPERIMENT")] = None,
    by: Annotated[str | None, typer.Option("--by", metavar="KEYS", help="Group by these keys, comma-separated "
                                           "(default: the keys that vary; never the seed).")] = None,
    metric: Annotated[str | None, typer.Option("--metric", metavar="METRIC",
                                                help="Only this metric.")] = None,
    final: Annotated[bool, typer.Option("--final", help="The value at the last evaluation "
                                        "instead of the best one (what early stopping keeps).")] = False,
    own_best: Annotated[bool, typer.Option(
        "--own-best", help="Each metric's own best evaluation, instead of every metric at the "
        "evaluation best in the early-stop metric (what early stopping keeps).")] = False,
    fmt: Annotated[Format, typer.Option(
        "--format", metavar="FORMAT", help=f"Output format: {choices(Format)}. csv has columns "
        "such as loss_mean, loss_std and n.")] = Format.table,
    by_source: Annotated[bool, typer.Option(
        "--by-source", help="For experiments that vary their sources of randomness one at a "
        "time (grid = { vary = [...] }): per source, the spread of each metric over its seeds "
        "(std, range, 95% CI of the mean) next to the spread when all sources vary.")] = False,
    root: RootOption = DEFAULT_ROOT,
) -> None:
    """Mean ± std over seeds per cell, the best cell per metric, deltas vs the baseline."""
    from gridrun.analysis.ablation import AnalysisError, ablation
    from gridrun.analysis.tables import format_table, notes

    if by_source and by:
        fail("--by-source groups by the experiment's sources: leave out --by")
    frame = _runs(root, experiment)
    if experiment is not None and by is None and not by_source and _search(root, frame, experiment,
                                                                           fmt):
        return
    if by_source:
        from gridrun.analysis.bysource import by_source as spread
        from gridrun.analysis.bysource import format_sources

        try:
            text = format_sources(spread(frame, experiment, metric=metric, final=final), fmt.value)
        except AnalysisError as exc:
            fail(str(exc))
        typer.echo(text, nl=False)
        _notes(notes(frame))
        return
    try:
        table = ablation(frame, experiment, by=by.split(",") if by else None,
                         metric=metric, final=final, own=own_best)
    except AnalysisError as exc:
        fail(str(exc))
    typer.echo(format_table(table, fmt.value), nl=False)
    _notes([*notes(frame), *table.attrs.get("notes", [])])


def _search(root: Path, frame: Any, experiment: str, fmt: Format) -> bool:
    """A search's experiment: its leaderboard (analysis/search.py) instead of a table of
    every trial; False for any other experiment."""
    from gridrun.analysis.tables import search_text

    text = search_text(root, frame, experiment, fmt.value)
    if text is None:
        return False
    typer.echo(text, nl=False)
    return True


def export(
    out: Annotated[Path, typer.Option("-o", "--output", metavar="FILE", help="The file to write: .csv, or "
                                      ".parquet (needs pyarrow).", dir_okay=False)],
    what: Annotated[What, typer.Option("--what", metavar="WHAT", help="runs: one row per run; "
                                       "metrics: every logged value, long format; ablation: the "
                                       "compare table.")
                    ] = What.runs,
    experiment: Annotated[str | None, typer.Option("--experiment", metavar="NAME",
                                                    help="Only this experiment.")] = None,
    status: Annotated[str | None, typer.Option(
        "--status", metavar="STATE", help=f"Only runs in this state: {STATES}.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists "
                                        "(never through a symbolic link).")] = False,
    root: RootOption = DEFAULT_ROOT,
) -> None:
    """Write runs, metrics or the ablation table to a CSV or Parquet file (atomically:
    the file is complete or not there; a full disk leaves an old one whole)."""
    from gridrun.analysis.ablation import AnalysisError
    from gridrun.analysis.export import TargetExists, check_target
    from gridrun.analysis.tables import notes
    from gridrun.runs import runlog, states

    if status is not None and status not in states.ALL:
        fail(f"unknown status {status!r}: choose one of {', '.join(states.ALL)}")
    try:  # before reading every run: refusing is instant (a link, a system folder, no folder)
        check_target(out, force)
    except (AnalysisError, TargetExists) as exc:
        fail(str(exc))
    with working(f"reading the runs under {root}") as progress:
        runs = _runs(root, experiment)
        frame = runs.to_frame()
        if status is not None:
            frame = frame[frame["status"] == status]
            if frame.empty:
                fail(f"no {status} runs under {root}" + (f" in {experiment!r}" if experiment else ""))
        progress.update(f"writing {out}")
        rows, skipped, refused = _write(what, root, out, experiment, status, frame, force)
    _notes([*notes(runs), *refused,
            *(runlog.skipped_note(n, path) for path, n in skipped.items())])
    typer.echo(f"wrote {rows:,} rows ({what.value}) to {out}")


def _write(what: What, root: Path, out: Path, experiment: str | None, status: str | None,
           frame: Any, force: bool) -> tuple[int, dict[str, int], list[str]]:
    """Rows written, the lines skipped in each metrics log read, and the logs refused."""
    from gridrun.analysis.ablation import AnalysisError, ablation_table
    from gridrun.analysis.export import TargetExists, export_metrics, write_frame

    skipped: dict[str, int] = {}
    refused: list[str] = []
    try:
        if what is What.metrics:
            statuses = dict(zip(frame["id"], frame["status"], strict=True))
            rows = export_metrics(root, out, experiment, status, statuses, force=force,
                                  skipped=skipped, refused=refused)
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
    return rows, skipped, refused


def register(app: typer.Typer) -> None:
    app.command()(compare)
    app.command()(export)
