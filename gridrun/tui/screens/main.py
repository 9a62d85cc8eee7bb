"""The main screen: header, machine panel, runs table, filter, footer."""

from __future__ import annotations

import contextlib
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Input

from gridrun.tui.source import ACTIVE, RETRYABLE, EngineState, Machine, RunRow
from gridrun.tui.widgets.keys import KeyBar
from gridrun.tui.widgets.panels import MachinePanel, StatusHeader
from gridrun.tui.widgets.runs_table import RunsTable

# The actions whose availability depends on the rows or the engine (see check_action).
KEYED = ("detail", "mark", "overlay", "cancel", "retry", "priority", "clone", "compare",
         "start_engine")
# The footer keeps these first when the terminal is narrow; `?` lists every key.
FOOTER_FIRST = ("detail", "app.help", "app.quit", "queue", "mark", "overlay", "cancel", "retry",
                "filter", "sort", "start_engine", "pause", "compare", "clone", "group")
QUIT = Binding("q", "app.quit", "quit", tooltip="the engine keeps running")


class MainScreen(Screen):
    CSS_PATH = "main.tcss"
    BINDINGS: ClassVar = [
        Binding("enter", "detail", "detail", priority=True),
        Binding("space", "mark", "mark"),
        Binding("v", "overlay", "overlay"),
        Binding("a", "queue", "queue file"),
        Binding("c", "cancel", "cancel"),
        Binding("r", "retry", "retry"),
        Binding("R", "retry(True)", "retry from scratch", show=False),
        Binding("plus,equals_sign", "priority(1)", "prio+", key_display="+"),
        Binding("minus", "priority(-1)", "prio-", key_display="-"),
        Binding("p", "pause", "pause/resume"),
        Binding("d", "clone", "clone"),
        Binding("t", "compare", "compare"),
        Binding("slash", "filter", "filter", key_display="/"),
        Binding("s", "sort", "sort"),
        Binding("S", "sort(True)", "reverse", show=False),
        Binding("g", "group", "group"),
        Binding("E", "start_engine", "start engine"),
        Binding("escape", "clear", "clear", show=False),
        Binding("question_mark", "app.help", "help", key_display="?"),
        QUIT,
    ]

    def __init__(self) -> None:
        super().__init__()
        self.engine: EngineState | None = None
        self._filter_timer = None
        self._keys_shown: tuple | None = None  # what the footer last showed, see _refresh_keys

    def compose(self) -> ComposeResult:
        yield StatusHeader(id="header")
        yield MachinePanel(id="machine")
        yield RunsTable(self.app.clock, id="runs")
        yield Input(placeholder="filter: words that must all appear (esc clears)", id="filter")
        yield KeyBar(FOOTER_FIRST)

    @property
    def table(self) -> RunsTable:
        return self.query_one(RunsTable)

    def on_mount(self) -> None:
        self.query_one(StatusHeader).show(str(self.app.source.root), None)
        self.table.focus()

    def on_runs_table_cursor_moved(self) -> None:
        self._refresh_keys()  # cancel, retry and priority depend on the run under the cursor

    # ---- fed by the bridge ------------------------------------------------------

    def runs_changed(self, runs: tuple[RunRow, ...]) -> None:
        with self.app.batch_update():
            self.table.apply(runs)
        self._refresh_keys()

    def engine_changed(self, engine: EngineState) -> None:
        self.engine = engine
        self.query_one(StatusHeader).show(str(self.app.source.root), engine)
        self._refresh_keys()

    def machine_sampled(self, machine: Machine) -> None:
        self.query_one(MachinePanel).show(machine)

    def clock_ticked(self) -> None:
        self.table.tick()

    # ---- keys -------------------------------------------------------------------

    def _keys(self) -> tuple:
        return tuple(self.check_action(action, ()) for action in KEYED)

    def _refresh_keys(self) -> None:
        """Refresh the footer only when a key's availability changed: each refresh
        rebuilds the footer's widgets, and rows change on most bridge ticks."""
        if self._keys() != self._keys_shown:
            self.refresh_bindings()

    def refresh_bindings(self) -> None:
        super().refresh_bindings()
        if self.is_mounted:  # note what the footer shows, now and once it has rebuilt
            self._note_keys()
            self.call_after_refresh(self._note_keys)

    def _note_keys(self) -> None:
        with contextlib.suppress(NoMatches):  # after a refresh, the screen may be closing
            self._keys_shown = self._keys()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if isinstance(self.focused, Input) and action not in ("clear", "detail"):
            return False if action not in ("app.quit", "app.help") else None
        sel = [self.table.runs[i] for i in self.table.selection] if self.is_mounted else []
        needs = {"cancel": ACTIVE, "retry": RETRYABLE, "priority": ("queued",)}
        if action in needs:
            return True if any(r.status in needs[action] for r in sel) else None
        if action in ("detail", "clone", "mark", "compare"):
            return True if sel else None
        if action == "overlay":
            return True if self.table.marked else None
        if action == "start_engine":
            return None if self.engine is None or self.engine.running else True
        return True

    def action_detail(self) -> None:
        if isinstance(self.focused, Input):
            self.table.focus()
            return
        if (run := self.table.current) is not None:
            from gridrun.tui.screens.detail import DetailScreen
            self.app.push_screen(DetailScreen(run))

    def action_mark(self) -> None:
        self.table.toggle_mark()
        self.refresh_bindings()

    def action_overlay(self) -> None:
        from gridrun.tui.screens.detail import OverlayScreen
        self.app.push_screen(OverlayScreen([self.table.runs[i] for i in self.table.selection]))

    def action_queue(self) -> None:
        from gridrun.tui.screens.dialogs import QueueScreen
        self.app.push_screen(QueueScreen())

    def action_cancel(self) -> None:
        from gridrun.tui.screens.dialogs import Confirm
        ids = [i for i in self.table.selection if self.table.runs[i].status in ACTIVE]
        question = f"Cancel {len(ids)} run{'s' * (len(ids) != 1)} ({', '.join(ids[:3])}" \
                   f"{'…' if len(ids) > 3 else ''})? Running ones checkpoint first."

        def done(yes: bool | None) -> None:
            if yes:
                self.act("cancel", ids)
        self.app.push_screen(Confirm(question), done)

    def action_retry(self, fresh: bool = False) -> None:
        ids = [i for i in self.table.selection if self.table.runs[i].status in RETRYABLE]
        if not fresh:
            self.act("retry", ids)
            return
        from gridrun.tui.screens.dialogs import Confirm
        question = f"Start {len(ids)} run{'s' * (len(ids) != 1)} ({', '.join(ids[:3])}" \
                   f"{'…' if len(ids) > 3 else ''}) over from scratch? Their checkpoints are deleted."

        def done(yes: bool | None) -> None:
            if yes:
                self.act("retry", ids, True)
        self.app.push_screen(Confirm(question), done)

    def action_priority(self, delta: int) -> None:
        self.act("bump_priority", self.table.selection, delta)

    def action_pause(self) -> None:
        self.act("set_paused", not (self.engine and self.engine.paused))

    def action_start_engine(self) -> None:
        self.act("start_engine")

    def action_clone(self) -> None:
        from gridrun.tui.screens.dialogs import Prompt
        run = self.table.current

        def done(message: str | None) -> None:
            if message:
                self.notify(message)
        # the dialog checks the keys as a file's are and stays open on a refusal
        self.app.push_screen(Prompt(f"Clone {run.id} ({run.variant or run.experiment}) "
                                    "with key=value ..., e.g. lr=0.001 epochs=60", "",
                                    submit=lambda text: self.app.source.clone(run.id, text)), done)

    def action_compare(self) -> None:
        from gridrun.tui.screens.compare import CompareScreen
        self.app.push_screen(CompareScreen(self.table.current.experiment))

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    @on(Input.Changed, "#filter")
    def filter_changed(self, event: Input.Changed) -> None:
        # Refilter once typing pauses: each refilter rebuilds the table.
        if self._filter_timer is not None:
            self._filter_timer.stop()
        self._filter_timer = self.set_timer(0.15, lambda: self.table.set_filter(event.value))

    @on(Input.Submitted, "#filter")
    def filter_done(self, event: Input.Submitted) -> None:
        if self._filter_timer is not None:
            self._filter_timer.stop()
        self.table.set_filter(event.value)
        self.table.focus()

    def action_clear(self) -> None:
        box = self.query_one("#filter", Input)
        if box.value or box.display:
            if self._filter_timer is not None:
                self._filter_timer.stop()
            with box.prevent(Input.Changed):  # else its change event refilters again, later
                box.value = ""
            box.display = False
            self.table.set_filter("")
        elif self.table.marked:
            self.table.marked.clear()
            self.table.set_filter(self.table.needle)
        self.table.focus()
        self.refresh_bindings()

    def action_sort(self, reverse: bool = False) -> None:
        self.notify(f"sorted by {self.table.cycle_sort(reverse)}", timeout=2)

    def action_group(self) -> None:
        self.table.grouped = not self.table.grouped
        self.table.resort()
        self.notify("grouped by experiment" if self.table.grouped else "not grouped", timeout=2)

    @work(thread=True, group="actions", exit_on_error=False)
    def act(self, method: str, *args) -> None:
        if args and isinstance(args[0], list) and not args[0]:
            self.app.call_from_thread(self.notify, "nothing to do for the selected runs",
                                      severity="warning")
            return
        message = getattr(self.app.source, method)(*args)
        self.app.call_from_thread(self.notify, message)
