"""Marked runs' curves overlaid in one plot (`v`), the legend naming each run; on a
search's trial with nothing marked, the search's best trials as compare ranks them."""

from __future__ import annotations

from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen

from gridrun.tui.guard import refresh
from gridrun.tui.screens.detail import FIRST, QUIT, SMOOTH_KEYS, UNITS, CurveData, Smoothing
from gridrun.tui.source import RunRow
from gridrun.tui.widgets import fmt
from gridrun.tui.widgets.curves import Curves
from gridrun.tui.widgets.keys import KeyBar


class OverlayScreen(Smoothing, Screen):
    """Marked runs' curves in one plot with a legend; `m` picks the metric, which
    starts as the validation metric the runs track (their best column's)."""

    CSS_PATH = "detail.tcss"
    BINDINGS: ClassVar = [
        Binding("m", "metric", "metric"),
        *SMOOTH_KEYS,
        Binding("l", "log", "log scale"),
        Binding("escape,backspace", "app.pop_screen", "back"),
        Binding("question_mark", "app.help", "help", key_display="?"),
        QUIT,
    ]

    def __init__(self, runs: list[RunRow], caption: str = "", metric: str | None = None) -> None:
        super().__init__()
        self.runs, self.caption = runs, caption  # caption: what chose the runs, when not marks
        self.data = {r.id: CurveData() for r in runs}
        self.chosen = metric  # set by `m`; until then this, or the validation metric
        self.log_scale = False

    @property
    def metric(self) -> str:
        if self.chosen:
            return self.chosen
        names = {n for d in self.data.values() for n in d.series}
        tracked = [f"val {r.best_name}" for r in self.runs if r.best_name]
        val = sorted(n for n in names if n.startswith("val "))
        return next((n for n in [*tracked, "val loss", *val] if n in names), "train loss")

    def compose(self) -> ComposeResult:
        yield Curves(id="overlay")
        yield KeyBar(FIRST)

    def on_mount(self) -> None:
        for r in self.runs:
            self.app.bridge.watch(r.id)
        self.app.nudge()

    def on_unmount(self) -> None:
        for r in self.runs:
            self.app.bridge.unwatch(r.id)

    @refresh
    def metrics_arrived(self, run_id: str, records: tuple[dict[str, Any], ...], reset: bool) -> None:
        if run_id in self.data:
            if reset:
                self.data[run_id] = CurveData()
            self.data[run_id].add(records)
            self.redraw()

    @refresh
    def redraw(self) -> None:
        # the legend names each run by its variant and seed (and id: two runs may share both)
        series = {f"{fmt.text(r.variant or r.experiment, 28)} seed {fmt.text(r.seed)} "
                  f"({fmt.text(r.id)[:6]})": self.data[r.id].series.get(self.metric, [])
                  for r in self.runs}
        title = f"{self.metric}{UNITS.get(self.metric, '')}"
        self.query_one(Curves).draw(f"{title}  ·  {self.caption}" if self.caption else title, series,
                                    log=self.log_scale,
                                    smoothing=0.0 if self.metric == "lr" else self.smoothing)

    def action_metric(self) -> None:
        """A menu of the metrics the runs logged."""
        from gridrun.tui.screens.sort import ChoiceMenu

        names = sorted({n for d in self.data.values() for n in d.series})
        if not names:
            self.notify("no metrics logged yet", timeout=2)
            return

        def done(name: str | None) -> None:
            if name:
                self.chosen = name
                self.redraw()
        self.app.push_screen(ChoiceMenu("metric to overlay", names, self.metric), done)

    def action_log(self) -> None:
        self.log_scale = not self.log_scale
        self.redraw()
