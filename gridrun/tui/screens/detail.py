"""One run in depth, followed live: curves, output, summary, config, traceback (the
marked runs overlaid are in overlay.py)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Input, Static, TabbedContent, TabPane

from gridrun.runs import records as rec
from gridrun.runs.states import FINISHED
from gridrun.tui.guard import refresh
from gridrun.tui.source import ACTIVE, RunDetail, RunMemory, RunRow, Verdict
from gridrun.tui.widgets import fmt
from gridrun.tui.widgets.curves import DEFAULT_SMOOTHING, Curves, Series, step_smoothing
from gridrun.tui.widgets.diagnostics import Diagnostics
from gridrun.tui.widgets.keys import KeyBar
from gridrun.tui.widgets.summary import table as summary_table
from gridrun.tui.widgets.textview import TextView

QUIT = Binding("q", "app.quit", "quit", tooltip="the engine is left as it is")
SMOOTH_KEYS = [Binding("right_square_bracket", "smooth(1)", "smooth+", key_display="]"),
               Binding("left_square_bracket", "smooth(-1)", "smooth-", key_display="[")]
# The keys that act only on some tabs, and those tabs: elsewhere they are off the key bar
# and do nothing (they used to show on the summary tab, where they change nothing seen).
# Smoothing also draws the diagnostics' grad norm; its log axis and steps are fixed.
ON_TABS = {"log": ("curves-tab",), "wall_clock": ("curves-tab",),
           "smooth": ("curves-tab", "diagnostics-tab")}
FIRST = ("back", "app.pop_screen", "search", "smooth(1)", "smooth(-1)", "metric", "log",
         "wall_clock", "export_model", "app.help", "app.quit")


UNITS = {"step_time": " (seconds per step)", "samples_per_s": " (samples/s)",
         "tokens_per_s": " (tokens/s)"}  # what a curve's numbers are in, where it has a unit


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
        self.times: dict[str, list[float]] = {}  # name -> each point's wall-clock time
        self.t0: float | None = None  # the first record's time

    def add(self, records: tuple[dict[str, Any], ...]) -> None:
        for line in records:
            if not isinstance(line, dict):
                continue
            step, split = fmt.finite(line.get(rec.STEP, 0)), line.get(rec.SPLIT)
            if split not in (rec.TRAIN, rec.VAL) or step is None:
                continue  # the start line declares, it holds no curve; a bad step, no point
            t = fmt.finite(line.get("t"))
            if t is not None and self.t0 is None:
                self.t0 = t
            for key, value in rec.values(line).items():
                if fmt.finite(value) is None:
                    continue
                name = key if key in rec.LOOP else f"{split} {key}"  # "train loss", "val accuracy"
                self.series.setdefault(name, []).append((step, value))
                self.times.setdefault(name, []).append(t if t is not None else math.nan)

    def pick(self, *names: str, wall: bool = False) -> dict[str, Series]:
        if not wall:
            return {n: self.series[n] for n in names if n in self.series}
        t0 = self.t0 or 0.0
        return {n: [(t - t0, y) for t, (_, y) in zip(self.times[n], self.series[n], strict=True)
                    if math.isfinite(t)] for n in names if n in self.series}

    @staticmethod
    def x_label(wall: bool) -> str:
        return "seconds since start" if wall else "step"

    @property
    def val_names(self) -> list[str]:
        return [n for n in self.series if n.startswith("val ")]


class DetailScreen(Smoothing, Screen):
    """One run, followed live until it ends: its heading (status), curves, output,
    summary and config. Output and config scroll (j/k, PgDn, g/G) and search (/, n, N)."""

    CSS_PATH = "detail.tcss"
    BINDINGS: ClassVar = [
        *SMOOTH_KEYS,
        Binding("l", "log", "log scale", tooltip="on the curves tab"),
        Binding("w", "wall_clock", "x: time/step", tooltip="on the curves tab"),
        Binding("tab", "tab(1)", "next tab", show=False),
        Binding("shift+tab", "tab(-1)", "previous tab", show=False),
        Binding("slash", "search", "search", key_display="/"),
        Binding("n", "find(1)", "next match", show=False),
        Binding("N", "find(-1)", "previous match", show=False),
        Binding("x", "export_model", "export model"),
        Binding("escape,backspace", "back", "back"),
        Binding("question_mark", "app.help", "help", key_display="?"),
        QUIT,
    ]

    def __init__(self, run: RunRow) -> None:
        super().__init__()
        self.run, self.log_scale, self.data = run, False, CurveData()
        self.wall_clock = False  # x axis: steps, or seconds since the first record (`w`)
        self.title = f"{run.id} {run.experiment} {run.variant}"
        self.verdict: Verdict | None = None  # `gridrun verify` may write one at any time

    def compose(self) -> ComposeResult:
        yield Static(self.heading(), id="title")
        with TabbedContent(id="tabs"):
            with TabPane("curves", id="curves-tab"):
                yield Static("", id="waiting")
                with Horizontal(id="plots"):
                    yield Curves(id="loss")
                    yield Curves(id="rate")
            with TabPane("output", id="output-tab"):
                yield TextView("(no output yet)", id="output")
            with TabPane("summary", id="summary-tab"):
                yield Static("", id="summary")
            with TabPane("config", id="config-tab"):
                yield TextView("(no config)", id="config")
            with TabPane("diagnostics", id="diagnostics-tab"):
                yield Diagnostics(id="diagnostics")
        yield Input(placeholder="search: enter finds, n / N next and previous, esc closes",
                    id="search")
        yield KeyBar(FIRST)

    def heading(self) -> Text:
        r = self.run
        text = Text(f" {fmt.text(r.id)}  {fmt.text(r.experiment)}  {fmt.text(r.variant or '-')}  "
                    f"seed {fmt.text(r.seed)}  ")
        text.append_text(fmt.status(r.status))
        if r.status == "running" and r.total_steps:
            text.append(f"  {fmt.progress(r)}")
        if self.verdict:
            text.append("  ").append_text(fmt.verdict(self.verdict))
        return text

    def on_mount(self) -> None:
        self.app.bridge.watch(self.run.id)
        self.app.nudge()
        self.show_waiting()
        self.load()
        self._reader = self.set_interval(1.0, self.load)

    def on_unmount(self) -> None:
        self.app.bridge.unwatch(self.run.id)

    def on_resize(self, event: events.Resize) -> None:
        """Both plots side by side when wide, stacked when tall, else the loss alone."""
        width, height = event.size
        self.set_class(width < 110 and height >= 34, "-stacked")
        self.set_class(width < 110 and height < 34, "-single")

    # ---- following the run ----------------------------------------------------------

    @refresh
    def run_changed(self, row: RunRow) -> None:
        """The run's row changed (the bridge): its status in the heading; once it
        ended, its files are read one last time (summary, the output's last lines)."""
        if row.id != self.run.id:
            return
        ended = row.status != self.run.status and row.status not in ACTIVE
        self.run = row
        self.query_one("#title", Static).update(self.heading())
        self.show_waiting()
        if ended:
            self.load()
        self.refresh_bindings()

    @refresh
    def run_removed(self, ids: tuple[str, ...]) -> None:
        """Its run left the store (`gridrun rm`, x): what is shown stays, reading stops."""
        if self.run.id in ids:
            self._reader.stop()
            self.app.bridge.unwatch(self.run.id)
            title = self.heading().append("  removed from the store", style="bold yellow")
            self.query_one("#title", Static).update(title)

    @refresh
    def show_waiting(self) -> None:
        """A queued run has no curves yet: say where it is in the queue and what it waits for."""
        box = self.query_one("#waiting", Static)
        queued = self.run.status == "queued"
        box.display = queued
        self.query_one("#plots").display = not queued
        if queued:
            box.update(waiting(self.app.main, self.run.id))

    @work(thread=True, group="detail", exclusive=True, exit_on_error=False)
    def load(self) -> None:
        """Config, summary and the output tail: files, so a worker reads them."""
        detail = self.app.source.detail(self.run.id)
        tail = self.app.source.output_tail(self.run.id, OUTPUT_BYTES)
        self.app.call_from_thread(self.show, detail, tail)

    @refresh
    def show(self, d: RunDetail, tail: str) -> None:
        self.query_one("#config", TextView).show(config_text(d.config))
        summary = Text()
        if d.verdict:
            summary.append_text(fmt.verdict(d.verdict)).append("\n\n")
        if d.where:  # a SLURM job's id, state, node and GPUs
            summary.append(fmt.text(d.where, 400) + "\n\n", style="dim")
        if d.memory is not None:  # the budget it ran under, what it measured
            summary.append(memory_text(d.memory) + "\n\n", style="dim")
        for note in d.notes:
            summary.append(fmt.text(note, 400) + "\n", style="yellow")
        trace = (d.summary or {}).get("traceback") or d.error
        if trace:
            # files' text is shown as it is, never read as markup ("[/x]" in a traceback)
            summary.append("error\n", style="bold red").append(f"{fmt.text(trace, 10**6)}\n\n"
                                                              if not isinstance(trace, str)
                                                              else f"{trace}\n\n")
        summary.append_text(summary_table(d.summary))
        self.query_one("#summary", Static).update(summary)
        if d.verdict != self.verdict:
            self.verdict = d.verdict
            self.query_one("#title", Static).update(self.heading())
        self.query_one("#output", TextView).show(tail)
        self.query_one(Diagnostics).show_summary(d.summary)

    @refresh
    def metrics_arrived(self, run_id: str, records: tuple[dict[str, Any], ...], reset: bool) -> None:
        if run_id != self.run.id:
            return
        if reset:
            self.data = CurveData()
        self.data.add(records)
        self.redraw()

    @refresh
    def redraw(self) -> None:
        # validation metrics other than the loss (accuracy, ...) live on their own scale
        val = self.data.val_names
        others = tuple(n for n in val if n != "val loss")
        title = "loss" + (f" (left), {', '.join(others)} (right)" if others else "")
        x = self.data.x_label(self.wall_clock)
        self.query_one("#loss", Curves).draw(
            title, self.data.pick("train loss", *val, wall=self.wall_clock), log=self.log_scale,
            right=others, smoothing=self.smoothing, xlabel=x)
        self.query_one("#rate", Curves).draw(
            "samples/s (left), lr (right)", self.data.pick("samples_per_s", "lr", wall=self.wall_clock),
            log=self.log_scale, right=("lr",), smoothing=self.smoothing, plain=("lr",), xlabel=x)
        self.query_one(Diagnostics).draw(self.data.series, self.smoothing)

    # ---- keys -----------------------------------------------------------------------

    def action_log(self) -> None:
        self.log_scale = not self.log_scale
        self.redraw()
        self.notify("log scale" if self.log_scale else "linear scale", timeout=2)

    def action_wall_clock(self) -> None:
        self.wall_clock = not self.wall_clock
        self.redraw()
        self.notify("x axis: wall-clock time" if self.wall_clock else "x axis: steps", timeout=2)

    def viewed(self) -> TextView | None:
        """The text view of the tab shown (output or config), if it is one."""
        pane = self.query_one(TabbedContent).active_pane
        views = list(pane.query(TextView)) if pane is not None else []
        return views[0] if views else None

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if (view := self.viewed()) is not None:
            view.focus()  # keys scroll the text at once
        self.refresh_bindings()

    def action_tab(self, by: int) -> None:
        tabs = self.query_one(TabbedContent)
        panes = [pane.id for pane in tabs.query(TabPane)]
        if tabs.active in panes:
            tabs.active = panes[(panes.index(tabs.active) + by) % len(panes)]

    def action_search(self) -> None:
        if self.viewed() is None:
            self.query_one(TabbedContent).active = "output-tab"
        box = self.query_one("#search", Input)
        box.display = True
        box.focus()

    @on(Input.Submitted, "#search")
    def search(self, event: Input.Submitted) -> None:
        view = self.viewed()
        if view is None:
            return
        found = view.find(event.value.strip(), step=1)
        event.input.display = False
        view.focus()
        if found is None and event.value.strip():
            self.notify(f"{event.value.strip()!r} is not in the {self.query_one(TabbedContent).active_pane.id.removesuffix('-tab')}",
                        severity="warning", timeout=3)

    def action_find(self, step: int) -> None:
        view = self.viewed()
        if view is None or not view.needle:
            self.notify("nothing to find yet: / searches", timeout=2)
            return
        if view.find_next(step) is None:
            self.notify(f"{view.needle!r} not found", severity="warning", timeout=2)

    def action_back(self) -> None:
        box = self.query_one("#search", Input)
        if box.display:
            box.display = False
            if (view := self.viewed()) is not None:
                view.focus()
            return
        self.app.pop_screen()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "export_model":  # a finished run's best.pt; greyed out before
            return True if self.run.status in FINISHED else None
        if action in ON_TABS and self.is_mounted \
                and self.query_one(TabbedContent).active not in ON_TABS[action]:
            return False  # off the bar, not merely dim: nothing on this tab to act on
        return not (isinstance(self.focused, Input) and action not in ("back", "app.quit"))

    def action_export_model(self) -> None:
        self.notify(f"exporting {self.run.id} and checking parity …", timeout=4)
        self.export_model()

    @work(thread=True, group="export model", exclusive=True, exit_on_error=False)
    def export_model(self) -> None:
        """`gridrun export-model` in a subprocess: the interface never imports torch."""
        message = self.app.source.export_model(self.run.id)
        self.app.call_from_thread(self.app.notify, message, timeout=15)


OUTPUT_BYTES = 256 * 1024  # the output view holds the last 256 KiB of the run's output


def memory_text(m: RunMemory) -> str:
    """'memory: budget 4.0 GiB · peak 3.1 GiB', with what it needed when it outgrew its
    budget and the budget it was retried with."""
    parts = [f"{what} {n / 2**30:.1f} GiB" for what, n in (
        ("budget", m.budget), ("peak", m.peak), ("needed", m.needed), ("retried with", m.retried))
        if n is not None]
    return "memory: " + " · ".join(parts)


def config_text(config: Any) -> str:
    """`key = value` lines, sorted, values as TOML would read them (text when odd)."""
    if not isinstance(config, dict) or not config:
        return ""
    return "\n".join(f"{fmt.text(k)} = {value!r}" if isinstance(value, str | int | float | bool)
                     else f"{fmt.text(k)} = {fmt.text(value, 400)}"
                     for k, value in sorted(config.items(), key=lambda kv: str(kv[0])))


def waiting(main: Any, run_id: str) -> Text:
    """'queued: position 3 of 7; waits for a free slot (2 running)', or a stopped engine."""
    from gridrun.tui.widgets.columns import queue_order

    table, engine = main.table, main.engine
    queued = sorted((r for r in table.runs.values() if r.status == "queued"),
                    key=lambda r: queue_order(r, table.arrival.get(r.id, 0)))
    ids = [r.id for r in queued]
    where = f"position {ids.index(run_id) + 1} of {len(ids)}" if run_id in ids else "in the queue"
    running = sum(r.status == "running" for r in table.runs.values())
    if engine is not None and not engine.running:
        why = "the engine, which is stopped: E on the runs list starts it"
    elif engine is not None and engine.paused:
        why = "the queue to resume: it is paused (p on the runs list resumes it)"
    elif ids and ids[0] != run_id:
        why = f"a free slot, after the {ids.index(run_id) if run_id in ids else len(ids)} runs ahead of it ({running} running)"
    else:
        why = f"a free slot ({running} running)"
    return Text.assemble(("queued", "bold"), f": {where}; waits for {why}.\n\n",
                         ("Curves, output and summary appear here once it starts.", "dim"))
