"""`t`: the live ablation table of an experiment (a search's leaderboard for a search);
`e` exports what it shows as CSV; `s` shows the spread of each metric by source
of randomness instead (`compare --by-source`)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Static

from gridrun.tui.guard import refresh
from gridrun.tui.screens.detail import QUIT
from gridrun.tui.source import Table
from gridrun.tui.widgets.compare_columns import Arranged, arrange
from gridrun.tui.widgets.compare_table import CompareTable
from gridrun.tui.widgets.keys import KeyBar

SCROLLBAR = 2  # cells the table's vertical scrollbar may take


class CompareScreen(Screen):
    CSS_PATH = "compare.tcss"
    BINDINGS: ClassVar = [
        Binding("e", "export", "export CSV"),
        Binding("s", "by_source", "spread by source", show=False),
        Binding("escape,backspace", "app.pop_screen", "back"),
        Binding("j", "cursor_down", "down", show=False),
        Binding("k", "cursor_up", "up", show=False),
        Binding("question_mark", "app.help", "help", key_display="?"),
        QUIT,
    ]

    def __init__(self, experiment: str) -> None:
        super().__init__()
        self.experiment = experiment
        self.shown: Table | None = None
        self.arranged: Arranged | None = None  # its columns as shown at the screen's width
        self.by_source = False  # `s`: the spread by source of randomness

    def title_text(self) -> str:
        if self.by_source:
            return f" compare by source: {self.experiment}  (s: the ablation table; refreshes live)"
        if self.shown is not None and self.shown.kind == "leaderboard":
            return f" search: {self.experiment}  (every trial, best first; refreshes live)"
        return f" compare: {self.experiment}  (best per column in bold; refreshes live)"

    def compose(self) -> ComposeResult:
        yield Static(self.title_text(), id="title")
        yield CompareTable(id="ablation", cursor_type="row")
        yield Static("", id="note")
        yield KeyBar(("export", "app.pop_screen", "app.help", "app.quit"))

    def on_mount(self) -> None:
        self.query_one(CompareTable).loading = True  # until the first table is built
        self.load()
        self.set_interval(2.0, self.load)

    @work(thread=True, group="compare", exclusive=True, exit_on_error=False)
    def load(self) -> None:
        source = self.app.source
        table = (source.compare_sources if self.by_source else source.compare)(self.experiment)
        self.app.call_from_thread(self.show, table)

    def action_by_source(self) -> None:
        self.by_source = not self.by_source
        self.query_one("#title", Static).update(self.title_text())
        self.load()

    @refresh
    def show(self, t: Table) -> None:
        dt = self.query_one(CompareTable)
        dt.loading = False
        if t == self.shown:
            return
        self.shown = t
        self.query_one("#title", Static).update(self.title_text())
        self.fill(t)
        note = t.note or ("no runs yet" if not t.rows else "")
        if not self.by_source and "vary" in t.columns:  # an experiment that varies its sources
            note += "\ns: the spread of each metric by source of randomness"
        self.query_one("#note", Static).update(note)

    def fill(self, t: Table) -> None:
        """The table's columns as they fit the screen (widgets/compare_columns.py): the
        early-stop metric's right after the rows' names, the others' headers short when
        the whole does not fit."""
        dt = self.query_one(CompareTable)
        self.arranged = shown = arrange(t, self.size.width - SCROLLBAR)
        row = dt.cursor_row
        dt.clear(columns=True)
        dt.fixed_columns = shown.frozen
        dt.add_columns(*shown.labels)
        for i, cells in enumerate(t.rows):
            dt.add_row(*(Text(cells[j] if j < len(cells) else "",
                              style="bold reverse" if (i, k) in shown.best else "")
                         for k, j in enumerate(shown.order)))
        if t.rows:
            dt.move_cursor(row=min(row, len(t.rows) - 1))

    def on_resize(self) -> None:
        if self.shown is not None and self.arranged is not None and \
                arrange(self.shown, self.size.width - SCROLLBAR) != self.arranged:
            self.fill(self.shown)

    def action_cursor_down(self) -> None:
        self.query_one(CompareTable).action_cursor_down()

    def action_cursor_up(self) -> None:
        self.query_one(CompareTable).action_cursor_up()

    def action_export(self) -> None:
        from gridrun.tui.screens.dialogs import Prompt
        default = str(Path.cwd() / f"{self.experiment}.csv")  # where the user is, not the root

        def done(path: str | None) -> None:
            if path:
                self.export(path)
        self.app.push_screen(Prompt("Export the table as CSV to", default), done)

    @work(thread=True, group="export", exit_on_error=False)
    def export(self, path: str, force: bool = False) -> None:
        """An existing file is replaced only after a yes; a symbolic link is refused
        (the error becomes a notification)."""
        try:
            written = self.app.source.export_csv(self.experiment, path, force=force)
        except FileExistsError:
            self.app.call_from_thread(self.ask_replace, path)
            return
        self.app.call_from_thread(self.notify, f"wrote {written}")

    def ask_replace(self, path: str) -> None:
        from gridrun.tui.screens.dialogs import Confirm

        def done(yes: bool | None) -> None:
            if yes:
                self.export(path, force=True)
            else:
                self.notify(f"{path} left as it was", timeout=3)
        self.app.push_screen(Confirm(f"{path} exists: replace it?"), done)
