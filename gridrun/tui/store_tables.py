"""The compare screen's tables of a store: the ablation table (a search's leaderboard
for a search), the spread by source, a search's best trials and the CSV export, each
from the experiment's rows kept between refreshes (analysis/experiment_frame.py).
Called from action workers."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from gridrun.runs.store import Store
from gridrun.tui.source import Leaders, Table


def named(header: tuple[str, ...], value: str | None) -> tuple[str, ...]:
    """The compare screen's headers say what the numbers are: `best val loss ↓`
    (or `final loss ↓`), `val accuracy ↑ at best loss` (the metric at the tracked
    metric's best evaluation), and `Welch p` for the test behind p."""
    kind = "final" if value == "final" else "best val"
    return tuple("Welch p" if h == "p" else f"{kind} {h}" if h.endswith(("↓", "↑"))
                 and not h.startswith("Δ") else f"val {h}" if " at best " in h
                 and not h.startswith("Δ") else h for h in header)


def lead(header: tuple[str, ...], tracked: list[str]) -> tuple[int, ...]:
    """The columns of the one metric the runs stop early on (table_cells' `f1 ↑`, then
    its `Δ f1` and `p` in an ablation), which the compare screen shows first; () without
    one."""
    if len(tracked) != 1:
        return ()
    for j, h in enumerate(header):
        if h in (f"{tracked[0]} ↑", f"{tracked[0]} ↓"):
            more = header[j + 1:j + 3] == (f"Δ {tracked[0]}", "p")
            return tuple(range(j, j + 3 if more else j + 1))
    return ()


class StoreTables:
    """A base of StoreSource: it reads `root` and `store` (the store is replaced when
    the root gets one, so it is read on each call, never kept)."""

    root: Path
    store: Store

    def __init__(self) -> None:
        self._compare_lock = threading.Lock()  # the compare and export workers share the frames
        self._frames: dict[str, Any] = {}  # experiment -> experiment_frame.ExperimentFrame
        self._shown: dict[str, tuple[Any, Table]] = {}  # experiment -> (its table, as shown)
        # experiment -> (the rows it was made of, a search's board and its Table, or None)
        self._boards: dict[str, tuple[Any, tuple[dict[str, Any], Table] | None]] = {}

    def _table(self, experiment: str):
        """The experiment's ablation table: the same object while nothing changed;
        only runs whose store row or running log changed are read again."""
        from gridrun.analysis import ablation as analysis
        from gridrun.analysis import tables
        from gridrun.analysis.experiment_frame import ExperimentFrame

        with self._compare_lock:
            frame = self._frames.setdefault(experiment, ExperimentFrame(self.root, experiment))
            if frame.refresh(self.store) or frame.table is None:
                frame.table = analysis.ablation(frame.rows, experiment)
                frame.table.attrs["notes"] = tables.notes(frame.rows)  # what the readers left out
            return frame.table

    def compare(self, experiment: str) -> Table:
        """Cells from the one formatter `gridrun compare` uses (for a search, its
        leaderboard of every trial); with nothing changed since the last call, the
        same Table (a query and a few stats)."""
        from gridrun.analysis import ablation as analysis
        from gridrun.analysis import tables

        board = self._board(experiment)
        if board is not None:
            return board[1]
        try:
            t = self._table(experiment)
        except analysis.AnalysisError as e:
            return Table(experiment, ("",), (), note=str(e))
        shown = self._shown.get(experiment)
        if shown is None or shown[0] is not t:
            c = tables.table_cells(t)
            table = Table(experiment, named(c.header, t.attrs.get("value")), c.rows, c.best,
                          note="\n".join([tables.legend(t, "bold:"), *t.attrs["notes"]]),
                          names=c.header.index("seeds") + 1 if "seeds" in c.header else 0,
                          lead=lead(c.header, t.attrs.get("tracked") or []))
            same = shown is not None and shown[1] == table  # e.g. a live run's log grew
            shown = self._shown[experiment] = (t, shown[1] if same else table)
        return shown[1]

    def _board(self, experiment: str) -> tuple[dict[str, Any], Table] | None:
        """A search's leaderboard of every trial, best first, as data and as shown; None
        for any other experiment."""
        from gridrun.analysis import search
        from gridrun.analysis.experiment_frame import ExperimentFrame

        with self._compare_lock:
            frame = self._frames.setdefault(experiment, ExperimentFrame(self.root, experiment))
            frame.refresh(self.store)  # a change also drops frame.table: made again when asked
            rows = frame.rows
            kept = self._boards.get(experiment)
            if kept is not None and kept[0] is rows:
                return kept[1]
        board = search.board_of(self.root, rows, experiment, top=len(rows))
        made = None
        if board and board["leaders"]:
            head, cells = search.leaderboard_cells(board)
            note = [f"search {experiment}: {board['trials']} trials, best first",
                    *search.leaderboard_notes(board)]
            made = board, Table(experiment, tuple(head), tuple(map(tuple, cells)),
                                frozenset({(0, search.METRIC_COLUMN)}), note="\n".join(note),
                                kind="leaderboard")
        self._boards[experiment] = (rows, made)
        return made

    def compare_sources(self, experiment: str) -> Table:
        """The spread of each metric by source of randomness (`compare --by-source`'s cells)."""
        from gridrun.analysis import bysource
        from gridrun.analysis.ablation import AnalysisError
        from gridrun.analysis.experiment_frame import ExperimentFrame

        try:
            with self._compare_lock:
                frame = self._frames.setdefault(experiment, ExperimentFrame(self.root, experiment))
                if frame.refresh(self.store):
                    frame.table = None  # the ablation table is made again when asked
                t = bysource.by_source(frame.rows, experiment)
        except AnalysisError as e:
            return Table(experiment, ("",), (), note=str(e))
        header, rows = bysource.cells(t)
        return Table(experiment, tuple(header), tuple(map(tuple, rows)),
                     note=bysource.legend(t))

    def best_trials(self, experiment: str, k: int) -> Leaders:
        """The first `k` of compare's leaderboard (no rank correlations: not shown here)."""
        from gridrun.analysis import search
        from gridrun.analysis.experiment_frame import ExperimentFrame

        with self._compare_lock:
            frame = self._frames.setdefault(experiment, ExperimentFrame(self.root, experiment))
            frame.refresh(self.store)
            rows = frame.rows
        board = search.board_of(self.root, rows, experiment, top=k, correlate=False) or {}
        leaders = board.get("leaders", [])
        return Leaders(experiment, board.get("metric", ""), board.get("mode", ""),
                       board.get("trials", 0), len(leaders),
                       tuple(i for t in leaders for i in t["runs"]))

    def export_csv(self, experiment: str, path: str, *, force: bool = False) -> str:
        """What `compare` shows as CSV (a search's leaderboard at full precision, else the
        ablation table), atomically; an existing file raises FileExistsError unless
        `force`, a symbolic link is refused (ValueError) even then."""
        from gridrun.analysis import export, tables
        from gridrun.userfiles import system_tree

        target = Path(path).expanduser()
        if system_tree(target.parent) is None:  # a system folder is refused below, not made
            target.parent.mkdir(parents=True, exist_ok=True)
        if (board := self._board(experiment)) is not None:  # a search: the leaderboard `t` shows
            with export.atomic_file(target, force=force) as f:
                f.write(tables.format_leaderboard(board[0], experiment, "csv"))
            return str(target)
        export.write_frame(self._table(experiment).to_frame(), target, force=force)
        return str(target)
