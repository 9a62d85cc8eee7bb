"""The main screen: header, machine panel, runs table, filter, footer."""

from __future__ import annotations

import contextlib
from typing import ClassVar

from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Input

from gridrun.tui import state
from gridrun.tui.guard import refresh
from gridrun.tui.source import ACTIVE, RETRYABLE, EngineState, Leaders, Machine, RunRow
from gridrun.tui.state import Saved
from gridrun.tui.widgets import fmt
from gridrun.tui.widgets.keys import KeyBar
from gridrun.tui.widgets.panels import MachinePanel, StatusHeader
from gridrun.tui.widgets.runs_table import RunsTable

# The actions whose availability depends on the rows or the engine (see check_action).
KEYED = ("detail", "mark", "overlay", "cancel", "retry", "priority", "clone", "compare",
         "start_engine", "remove")
# The footer keeps these first when the terminal is narrow (the first MUST always, in their
# SHORT words if need be: all of them fit at 80 columns); `?` lists every key.
FOOTER_FIRST = ("detail", "mark", "queue", "cancel", "retry", "filter", "sort", "app.help",
                "app.quit", "overlay", "start_engine", "pause", "compare", "clone", "group")
MUST = 9
BEST_TRIALS = 5  # `v` on a search's trial overlays this many of its best trials
SHORT = {"detail": "open", "queue": "queue", "filter": "find"}
QUIT = Binding("q", "app.quit", "quit", tooltip="the engine is left as it is")
# keys whose action may not apply to the selection: pressed anyway, they say why (on_key)
REFUSABLE = {"c": "cancel", "r": "retry", "R": "retry", "plus": "priority", "equals_sign": "priority",
             "minus": "priority", "v": "overlay", "E": "start_engine"}


class MainScreen(Screen):
    CSS_PATH = "main.tcss"
    BINDINGS: ClassVar = [
        Binding("enter", "detail", "detail", priority=True),
        Binding("space", "mark", "mark"),
        Binding("v", "overlay", "overlay", tooltip="or a search's best 5 trials"),
        Binding("a", "queue", "queue file"),
        Binding("c", "cancel", "cancel"),
        Binding("r", "retry", "retry"),
        Binding("R", "retry(True)", "retry from scratch", show=False),
        Binding("plus,equals_sign", "priority(1)", "prio+", key_display="+"),
        Binding("minus", "priority(-1)", "prio-", key_display="-"),
        Binding("x,delete", "remove", "remove"),
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
        self.saved = Saved()  # the view as it was last quit (state.py); its cursor is restored once

    def compose(self) -> ComposeResult:
        yield StatusHeader(id="header")
        yield MachinePanel(id="machine")
        yield RunsTable(self.app.clock, id="runs")
        yield Input(placeholder="filter: words that must all appear (esc clears)", id="filter")
        yield KeyBar(FOOTER_FIRST, must=MUST, short=SHORT)

    @property
    def table(self) -> RunsTable:
        return self.query_one(RunsTable)

    def on_mount(self) -> None:
        self.query_one(StatusHeader).show(str(self.app.source.root), None)
        self.table.focus()
        if self.app.persist:
            self.restore_state()

    def restore_state(self) -> None:
        """Filter, sort, grouping and marks as they were on quit; the cursor once its run arrives."""
        saved, problem = state.load(self.app.source.root)
        if problem:
            self.notify(problem, title="view not restored", severity="warning", timeout=8)
        t = self.table
        t.needle, t.reverse, t.grouped = saved.filter, saved.reverse, saved.grouped
        t.sort_column = saved.sort if saved.sort in t.sortable_columns() else None
        t.marked = set(saved.marks)
        box = self.query_one("#filter", Input)
        with box.prevent(Input.Changed):  # the table has the needle already
            box.value = saved.filter
        self.saved = saved

    def save_state(self) -> None:
        state.save(self.app.source.root, self.saved.of(self.table))

    def on_runs_table_cursor_moved(self) -> None:
        self._refresh_keys()  # cancel, retry and priority depend on the run under the cursor

    # ---- fed by the bridge ------------------------------------------------------

    @refresh
    def runs_changed(self, runs: tuple[RunRow, ...]) -> None:
        with self.app.batch_update():
            self.table.apply(runs)
            self.saved.restore_cursor(self.table)
        self._refresh_keys()
        self._show_count()

    def _show_count(self) -> None:
        """`12 of 31 shown` in the header while a filter hides rows."""
        t = self.table
        self.query_one(StatusHeader).show_filtered(
            len(t.shown) if t.needle else None, len(t.runs), t.needle)

    @refresh
    def runs_removed(self, ids: tuple[str, ...]) -> None:
        self.table.remove(ids)
        self._refresh_keys()
        self._show_count()

    @refresh
    def engine_changed(self, engine: EngineState) -> None:
        self.engine = engine
        self.query_one(StatusHeader).show(str(self.app.source.root), engine)
        self._refresh_keys()

    @refresh
    def machine_sampled(self, machine: Machine) -> None:
        self.query_one(MachinePanel).show(machine)

    @refresh
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
        if action == "overlay":  # the marked runs, or the best trials of the search under the cursor
            return True if self.table.marked or (sel and sel[0].trial is not None) else None
        if action == "start_engine":
            return None if self.engine is None or self.engine.running else True
        return True

    def on_key(self, event: events.Key) -> None:
        """A key whose action does not apply here says why (the footer shows it dim)."""
        action = REFUSABLE.get(event.key)
        if action and not isinstance(self.focused, Input) and self.check_action(action, ()) is None:
            event.stop()
            self.notify(self.why_not(action), title="nothing done", severity="warning", timeout=4)

    def why_not(self, action: str) -> str:
        if action == "start_engine":
            return ("the engine is already running" if self.engine is not None
                    else "the engine's state is not known yet")
        sel = [self.table.runs[i] for i in self.table.selection]
        if not sel:
            return "no run here" + (": the filter hides every run (esc clears it)" if self.table.needle else "")
        what = (f"{sel[0].id} is {fmt.text(sel[0].status)}" if len(sel) == 1
                else f"none of the {len(sel)} marked runs is")
        return {
            "cancel": f"{what} {'queued or running' if len(sel) > 1 else ''}".strip()
                      + ": only queued or running runs can be cancelled",
            "retry": f"{what}{' failed, diverged, out of memory or cancelled' * (len(sel) > 1)}: "
                     "r retries failed, diverged, out-of-memory or cancelled runs",
            "priority": f"{what}{' queued' * (len(sel) > 1)}: priority orders the queue, "
                        "so only queued runs have one to change",
            "overlay": "mark runs with space first: v overlays the marked runs' curves "
                       "(on a search's trial, its search's best trials)",
        }.get(action, "not available here")

    def action_detail(self) -> None:
        if isinstance(self.focused, Input):  # enter in the filter bar (a priority binding)
            self.close_filter(self.focused)
            return
        if (run := self.table.current) is not None:
            from gridrun.tui.screens.detail import DetailScreen
            self.app.push_screen(DetailScreen(run))

    def action_mark(self) -> None:
        self.table.toggle_mark()
        self.refresh_bindings()

    def action_overlay(self) -> None:
        from gridrun.tui.screens.overlay import OverlayScreen
        if self.table.marked:
            self.app.push_screen(OverlayScreen([self.table.runs[i] for i in self.table.selection]))
        elif (run := self.table.current) is not None and run.trial is not None:
            self.overlay_best(run.experiment)

    @work(thread=True, group="actions", exit_on_error=False)
    def overlay_best(self, experiment: str) -> None:
        """The leaderboard reads every trial's results: off the interface's thread."""
        leaders = self.app.source.best_trials(experiment, BEST_TRIALS)
        self.app.call_from_thread(self._show_best, leaders)

    def _show_best(self, leaders: Leaders) -> None:
        from gridrun.tui.screens.overlay import OverlayScreen
        rows = [row for i in leaders.ids if (row := self.table.runs.get(i)) is not None]
        if not rows:
            self.notify(f"no trial of {leaders.experiment} has a result yet", timeout=4)
            return
        arrow = {"min": " ↓", "max": " ↑"}.get(leaders.mode, "")
        self.app.push_screen(OverlayScreen(rows, f"the best {leaders.shown} of {leaders.trials} "
                                                 f"trials by {leaders.metric}{arrow}",
                                           f"val {leaders.metric}" if leaders.metric else None))

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

    def action_remove(self) -> None:
        from gridrun.tui.screens.dialogs import RemoveConfirm
        ids = [i for i in self.table.selection if self.table.runs[i].status != "running"]
        running = len(self.table.selection) - len(ids)
        if not ids:
            self.notify("a running run cannot be removed: cancel it first (c)", severity="warning")
            return

        def done(answer: str | None) -> None:
            if answer:
                self.act("remove", ids, answer == "delete")
        self.app.push_screen(RemoveConfirm(ids, running), done)

    def action_priority(self, delta: int) -> None:
        """Only queued runs have a priority that matters; the row moves to its place in
        the queue when the change arrives (RunsTable.apply), the toast says the new value."""
        ids = [i for i in self.table.selection if self.table.runs[i].status == "queued"]
        new = sorted({(fmt.whole(self.table.runs[i].priority) or 0) + delta for i in ids})
        which = ids[0] if len(ids) == 1 else f"{len(ids)} runs"
        self.act("bump_priority", ids, delta,
                 say=f"priority of {which}: {', '.join(map(str, new))} "
                     f"({'earlier' if delta > 0 else 'later'} in the queue)")

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
        with box.prevent(Input.Changed):  # the filter in force, to edit
            box.value = self.table.needle
        box.display = True
        box.focus()

    @on(Input.Changed, "#filter")
    def filter_changed(self, event: Input.Changed) -> None:
        # Refilter once typing pauses: each refilter rebuilds the table.
        if self._filter_timer is not None:
            self._filter_timer.stop()
        self._filter_timer = self.set_timer(0.15, lambda: self.set_filter(event.value))

    def set_filter(self, needle: str) -> None:
        self.table.set_filter(needle)
        self._show_count()

    @on(Input.Submitted, "#filter")
    def filter_done(self, event: Input.Submitted) -> None:
        self.close_filter(event.input)

    def close_filter(self, box: Input) -> None:
        """Enter keeps the filter and closes the bar (the header says what is shown)."""
        if self._filter_timer is not None:
            self._filter_timer.stop()
        self.set_filter(box.value.strip())
        box.display = False
        self.table.focus()

    def action_clear(self) -> None:
        box = self.query_one("#filter", Input)
        if box.value or box.display:
            if self._filter_timer is not None:
                self._filter_timer.stop()
            with box.prevent(Input.Changed):  # else its change event refilters again, later
                box.value = ""
            box.display = False
            self.set_filter("")
        elif self.table.needle:
            self.set_filter("")
        elif self.table.marked:
            self.table.marked.clear()
            self.table.set_filter(self.table.needle)
        self.table.focus()
        self.refresh_bindings()

    def action_sort(self, reverse: bool = False) -> None:
        table = self.table
        if reverse:
            self.notify(f"sorted by {table.sort_by(table.sort_column, not table.reverse)}"
                        f" {'▼' if table.reverse else '▲'}", timeout=2)
            return
        from gridrun.tui.screens.sort import SortMenu

        def done(column: str | bool | None) -> None:
            if column is not False:
                self.notify(f"sorted by {table.sort_by(column or None)}", timeout=2)
        self.app.push_screen(SortMenu(table.sortable_columns(), table.sort_column), done)

    def action_group(self) -> None:
        self.table.grouped = not self.table.grouped
        self.table.resort()
        self.notify("grouped by experiment" if self.table.grouped else "not grouped", timeout=2)

    @work(thread=True, group="actions", exit_on_error=False)
    def act(self, method: str, *args, say: str | None = None) -> None:
        if args and isinstance(args[0], list) and not args[0]:
            self.app.call_from_thread(self.notify, "nothing to do for the selected runs",
                                      severity="warning")
            return
        message = getattr(self.app.source, method)(*args)
        self.app.call_from_thread(self.notify, say or message)
