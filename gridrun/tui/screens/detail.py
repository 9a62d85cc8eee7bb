"""One run in depth (curves, config, output, summary, traceback), and marked runs overlaid."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.markup import escape
from textual.screen import Screen
from textual.widgets import Static, TabbedContent, TabPane

from gridrun.engine import records as rec
from gridrun.engine.states import FINISHED
from gridrun.tui.source import RunDetail, RunRow, Verdict
from gridrun.tui.widgets import fmt
from gridrun.tui.widgets.curves import DEFAULT_SMOOTHING, Curves, Series, step_smoothing
from gridrun.tui.widgets.diagnostics import Diagnostics
from gridrun.tui.widgets.keys import KeyBar

QUIT = Binding("q", "app.quit", "quit", tooltip="the engine keeps running")
SMOOTH_KEYS = [Binding("right_square_bracket", "smooth(1)", "smooth+", key_display="]"),
               Binding("left_square_bracket", "smooth(-1)", "smooth-", key_display="[")]
FIRST = ("app.pop_screen", "smooth(1)", "smooth(-1)", "metric", "log", "export_model", "app.help",
         "app.quit")


class Smoothing:
    """`]` and `[` step the curves' EMA weight (0: raw); the screen redraws."""

    smoothing = DEFAULT_SMOOTHING

    def action_smooth(self, by: int) -> None:
        self.smoothing = step_smoothing(self.smoothing, by)
        self.redraw()
        self.notify(f"smoothing {self.smoothing:g}" if self.smoothing else "raw curves", timeout=2)


class CurveData:
    """Series per name built from metric records as they arrive."""

    def __init__(self) -> None:
        self.series: dict[str, Series] = {}

    def add(self, records: tuple[dict[str, Any], ...]) -> None:
        for line in records:
            step, split = line.get(rec.STEP, 0), line.get(rec.SPLIT)
            if split not in (rec.TRAIN, rec.VAL):
                continue  # the start line declares, it holds no curve
            for key, value in rec.values(line).items():
                if not isinstance(value, int | float):
                    continue
                name = key if key in rec.LOOP else f"{split} {key}"  # "train loss", "val accuracy"
                self.series.setdefault(name, []).append((step, value))

    def pick(self, *names: str) -> dict[str, Series]:
        return {n: self.series[n] for n in names if n in self.series}

    @property
    def val_names(self) -> list[str]:
        return [n for n in self.series if n.startswith("val ")]


class DetailScreen(Smoothing, Screen):
    CSS_PATH = "detail.tcss"
    BINDINGS: ClassVar = [
        *SMOOTH_KEYS,
        Binding("l", "log", "log scale"),
        Binding("x", "export_model", "export model"),
        Binding("escape,backspace", "app.pop_screen", "back"),
        Binding("question_mark", "app.help", "help", key_display="?"),
        QUIT,
    ]

    def __init__(self, run: RunRow) -> None:
        super().__init__()
        self.run, self.log_scale, self.data = run, False, CurveData()
        self.title = f"{run.id} {run.experiment} {run.variant}"

    def compose(self) -> ComposeResult:
        yield Static(self.heading(), id="title")
        with TabbedContent(id="tabs"):
            with TabPane("curves", id="curves-tab"), Horizontal(id="plots"):
                yield Curves(id="loss")
                yield Curves(id="rate")
            with TabPane("diagnostics", id="diagnostics-tab"):
                yield Diagnostics(id="diagnostics")
            with TabPane("output", id="output-tab"):
                yield Static("", id="output")
            with TabPane("summary", id="summary-tab"):
                yield Static("", id="summary")
            with TabPane("config", id="config-tab"):
                yield Static("", id="config")
        yield KeyBar(FIRST)

    def heading(self, verdict: Verdict | None = None) -> Text:
        r = self.run
        text = Text(f" {r.id}  {r.experiment}  {r.variant or '-'}  seed {r.seed}  "
                    f"{fmt.status(r.status).plain}")
        if verdict:
            text.append("  ").append_text(fmt.verdict(verdict))
        return text

    def on_mount(self) -> None:
        self.app.bridge.watch(self.run.id)
        self.app.nudge()
        self.load()
        self.set_interval(1.0, self.load)

    def on_unmount(self) -> None:
        self.app.bridge.unwatch(self.run.id)

    def on_resize(self, event: events.Resize) -> None:
        """Both plots side by side when wide, stacked when tall, else the loss alone."""
        width, height = event.size
        self.set_class(width < 110 and height >= 34, "-stacked")
        self.set_class(width < 110 and height < 34, "-single")

    @work(thread=True, group="detail", exclusive=True, exit_on_error=False)
    def load(self) -> None:
        """Config, summary and the output tail: files, so a worker reads them."""
        detail = self.app.source.detail(self.run.id)
        tail = self.app.source.output_tail(self.run.id)
        self.app.call_from_thread(self.show, detail, tail)

    def show(self, d: RunDetail, tail: str) -> None:
        self.query_one("#config", Static).update(
            escape("\n".join(f"{k} = {v!r}" for k, v in sorted(d.config.items()))) or "(no config)")
        # files' text is shown as it is, never read as markup ("[/x]" in a traceback)
        # fields the run never set (null, []) say nothing: left out
        summary = escape("\n".join(f"{k}: {json.dumps(v)}" for k, v in (d.summary or {}).items()
                                    if k != "traceback" and v not in (None, [], {})))
        trace = (d.summary or {}).get("traceback") or d.error
        if trace:
            summary = f"[b red]error[/]\n{escape(str(trace))}\n\n{summary}"
        if d.notes:
            summary = "\n".join(f"[yellow]{escape(n)}[/]" for n in d.notes) + "\n\n" + summary
        if d.verdict:
            line = fmt.verdict(d.verdict)
            summary = f"[{line.style}]{escape(line.plain)}[/]\n\n{summary}"
        self.query_one("#summary", Static).update(summary or "(no summary yet)")
        self.query_one("#title", Static).update(self.heading(d.verdict))
        self.query_one("#output", Static).update(Text(tail) if tail else "(no output yet)")
        self.query_one(Diagnostics).show_summary(d.summary)

    def metrics_arrived(self, run_id: str, records: tuple[dict[str, Any], ...], reset: bool) -> None:
        if run_id != self.run.id:
            return
        if reset:
            self.data = CurveData()
        self.data.add(records)
        self.redraw()

    def redraw(self) -> None:
        # validation metrics other than the loss (accuracy, ...) live on their own scale
        val = self.data.val_names
        others = tuple(n for n in val if n != "val loss")
        title = "loss" + (f" (left), {', '.join(others)} (right)" if others else "")
        self.query_one("#loss", Curves).draw(
            title, self.data.pick("train loss", *val), log=self.log_scale, right=others,
            smoothing=self.smoothing)
        self.query_one("#rate", Curves).draw(
            "samples/s (left), lr (right)", self.data.pick("samples_per_s", "lr"),
            log=self.log_scale, right=("lr",), smoothing=self.smoothing, plain=("lr",))
        self.query_one(Diagnostics).draw(self.data.series, self.smoothing)

    def action_log(self) -> None:
        self.log_scale = not self.log_scale
        self.redraw()
        self.notify("log scale" if self.log_scale else "linear scale", timeout=2)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "export_model":  # a finished run's best.pt; greyed out before
            return True if self.run.status in FINISHED else None
        return True

    def action_export_model(self) -> None:
        self.notify(f"exporting {self.run.id} and checking parity …", timeout=4)
        self.export_model()

    @work(thread=True, group="export model", exclusive=True, exit_on_error=False)
    def export_model(self) -> None:
        """`gridrun export-model` in a subprocess: the interface never imports torch."""
        message = self.app.source.export_model(self.run.id)
        self.app.call_from_thread(self.app.notify, message, timeout=15)


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

    def __init__(self, runs: list[RunRow]) -> None:
        super().__init__()
        self.runs = runs
        self.data = {r.id: CurveData() for r in runs}
        self.chosen: str | None = None  # set by `m`; until then the validation metric
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

    def metrics_arrived(self, run_id: str, records: tuple[dict[str, Any], ...], reset: bool) -> None:
        if run_id in self.data:
            if reset:
                self.data[run_id] = CurveData()
            self.data[run_id].add(records)
            self.redraw()

    def redraw(self) -> None:
        series = {f"{r.id} {r.variant}"[:40]: self.data[r.id].series.get(self.metric, [])
                  for r in self.runs}
        self.query_one(Curves).draw(self.metric, series, log=self.log_scale,
                                    smoothing=0.0 if self.metric == "lr" else self.smoothing)

    def action_metric(self) -> None:
        names = sorted({n for d in self.data.values() for n in d.series} - {"lr"})
        if names:
            i = names.index(self.metric) + 1 if self.metric in names else 0
            self.chosen = names[i % len(names)]
            self.redraw()

    def action_log(self) -> None:
        self.log_scale = not self.log_scale
        self.redraw()
