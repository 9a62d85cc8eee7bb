"""The gridrun app: a data source in, a bridge thread, and the screens.

`GridrunApp(source)` takes anything that follows `gridrun.tui.source.Source`;
`gridrun tui` passes a `StoreSource`, tests a `FakeSource`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.text import Text
from textual import work
from textual.app import App
from textual.worker import Worker, WorkerState, get_current_worker

from gridrun.tui.bridge import (
    Bridge,
    EngineStateChanged,
    GpuSampled,
    MetricsArrived,
    RunsChanged,
    RunsRemoved,
    SourceNoticed,
)
from gridrun.tui.guard import report
from gridrun.tui.screens.main import MainScreen
from gridrun.tui.source import Source
from gridrun.tui.widgets.panels import farewell


class GridrunApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "gridrun"
    ENABLE_COMMAND_PALETTE = False

    def __init__(self, source: Source, *, clock: Callable[[], float] = time.time,
                 interval: float = 0.33, live: bool = True, persist: bool | None = None) -> None:
        super().__init__()
        self.source, self.clock, self.interval = source, clock, interval
        self.bridge = Bridge(source)
        self.live = live  # snapshot tests: one poll, no clock ticks
        self.persist = live if persist is None else persist  # ROOT/tui-state.json (state.py)
        self.ticks = 0  # bridge ticks done (tests wait on it)
        self.queue_on_start: str | None = None  # `gridrun tui FILE`

    @property
    def main(self) -> MainScreen:
        return self.get_screen("main")

    def on_mount(self) -> None:
        self.install_screen(MainScreen(), "main")
        self.push_screen("main")
        if self.queue_on_start:
            from gridrun.tui.screens.dialogs import QueueScreen
            self.push_screen(QueueScreen(self.queue_on_start))
        self.call_after_refresh(self.poll)  # paint first, then read the store
        if self.live:
            self.set_interval(1.0, self.main.clock_ticked)

    @work(thread=True, group="bridge", name="bridge", exit_on_error=False)
    def poll(self) -> None:
        """The bridge: ask the source what changed, post it, sleep, again."""
        worker = get_current_worker()
        while not worker.is_cancelled:
            for message in self.bridge.tick():
                self.post_message(message)
            self.call_from_thread(self._ticked)
            if not self.live:
                return
            time.sleep(self.interval)

    def nudge(self) -> None:
        """Someone started watching a run: without the live loop, poll once more."""
        if not self.live:
            self.poll()

    def _ticked(self) -> None:
        self.ticks += 1

    def on_runs_changed(self, message: RunsChanged) -> None:
        self.main.runs_changed(message.runs)
        for screen in self.screen_stack:  # a detail screen follows its run
            if hasattr(screen, "run_changed") and (row := self.main.table.runs.get(screen.run.id)):
                screen.run_changed(row)

    def on_runs_removed(self, message: RunsRemoved) -> None:
        self.main.runs_removed(message.ids)
        for screen in self.screen_stack:  # a detail screen on a removed run stops reading it
            if hasattr(screen, "run_removed"):
                screen.run_removed(message.ids)

    def on_engine_state_changed(self, message: EngineStateChanged) -> None:
        self.main.engine_changed(message.engine)

    def on_gpu_sampled(self, message: GpuSampled) -> None:
        self.main.machine_sampled(message.machine)

    def on_source_noticed(self, message: SourceNoticed) -> None:
        self.notify(message.text, title="store", severity="warning", timeout=30)

    def on_metrics_arrived(self, message: MetricsArrived) -> None:
        for screen in self.screen_stack:
            if hasattr(screen, "metrics_arrived"):  # each screen's is a guarded refresh
                screen.metrics_arrived(message.run_id, message.records, message.reset)

    def known_status(self, run_id: str) -> str | None:
        run = self.main.table.runs.get(run_id)
        return run.status if run else None

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """Every worker fails visibly, here, as a notification."""
        if event.state == WorkerState.ERROR:
            error = event.worker.error
            report(self, event.worker.group, error)
            if event.worker.group == "bridge" and self.live:
                self.set_timer(2.0, self.poll)  # keep watching after a transient error

    def action_help(self) -> None:
        from gridrun.tui.screens.help import HelpScreen
        self.push_screen(HelpScreen())

    def action_quit(self) -> None:
        if self.persist:
            try:
                self.main.save_state()
            except Exception as error:  # never keep someone from quitting
                report(self, "saving the view", error)
        # the engine as the header shows it; Text, so that a root's "[...]" is not markup
        self.exit(message=Text(farewell(self.main.engine, str(self.source.root))))
