"""`gridrun run` follows its runs until they end.

On a terminal: a live `rich.progress` display, one bar per running run with
what matters first (which run, bar, steps, train loss, best of the tracked
metric, ETA; fields drop from the least important when the terminal is
narrow, see `plan`), and an overall line (ended, running, queued, the queue's
ETA). Elsewhere (a pipe, a log file, CI): one plain line per event, no escape
codes. A line for each run that ends is printed in both.

Every figure comes from the one fold over a run's metrics lines
(`gridrun.runs.progress`): steps, loss, best, pace, ETA.

`gridrun ls`'s lines (`run_lines`) are analysis/runlist.py's, named here too.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from gridrun.analysis.runlist import run_lines  # noqa: F401 (`gridrun ls` imports it from here)
from gridrun.runs import states
from gridrun.runs.records import HIGHER, LOWER
from gridrun.spec.variants import Variants, cut

ARROWS = {HIGHER: "↑", LOWER: "↓"}
SHOWN = ("id", "label", "bar", "steps", "epoch", "loss", "best", "speed", "eta")  # left to right
RIGHT = frozenset({"steps", "loss", "best", "speed", "eta"})
LABEL_MIN, BAR_MIN, BAR_GOOD, BAR_MAX = 10, 8, 16, 30
# the least widths of the fields whose numbers change as a run goes (0.9571, -0.6043, 1:05)
STEADY = {"loss": len("loss 0.0000"), "best": len("best↓ 0.0000"), "eta": len("eta 0:00"),
          "speed": len("999.9k smp/s")}


def num(v: Any) -> str:
    if not isinstance(v, int | float) or isinstance(v, bool):
        return "-"
    return "nan" if math.isnan(v) else f"{v:.4g}"


def rate(v: Any) -> str:
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
        return "-"
    return f"{v:.0f}" if v < 1000 else f"{v / 1000:.1f}k" if v < 1e6 else f"{v / 1e6:.1f}M"


def duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    s = int(seconds)
    return f"{s // 60}:{s % 60:02d}" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}"


@dataclass(frozen=True)
class RunLine:
    """What a running run's line shows: a run row and its folded metrics log."""

    id: str
    experiment: str
    variant: str
    seed: int
    step: int = 0
    total: int | None = None
    epoch: int = 0
    epochs: int | None = None
    loss: float | None = None
    metric: str | None = None
    arrow: str = ""
    best: float | None = None
    eta: float | None = None
    speed: float | None = None

    @classmethod
    def of(cls, run: Any, p: Any, now: float | None = None) -> RunLine:
        epochs = run.config.get("trainer", {}).get("epochs") if isinstance(run.config, dict) else None
        return cls(run.id, run.experiment, run.variant or "", run.seed, p.step, p.total_steps,
                   p.epoch, epochs if isinstance(epochs, int) else None, p.train_loss, p.metric,
                   ARROWS.get(p.direction or "", ""), p.best, p.eta(now), p.samples_per_s)

    def texts(self, named: bool = False) -> dict[str, str]:
        """The fixed-width fields as text; `named`: the best field names its metric."""
        steps = (f"{self.step}/{self.total}" if self.total else
                 f"e{self.epoch}/{self.epochs}" if self.epochs else f"step {self.step}")
        metric = f" {self.metric}" if named and self.metric else ""
        return {"id": self.id, "steps": steps, "epoch": f"epoch {self.epoch}",
                "loss": f"loss {num(self.loss)}", "best": f"best{metric}{self.arrow} {num(self.best)}",
                "speed": f"{rate(self.speed)} smp/s", "eta": f"eta {duration(self.eta)}"}


@dataclass(frozen=True)
class Labels:
    """Which run a line is, in as few cells as tell the file's runs apart: the
    experiment (when there are several), the variant (shortened from the middle,
    never losing a value: spec/variants.py) and the seed."""

    variants: Variants = field(default_factory=Variants)
    experiments: int = 1

    @classmethod
    def of(cls, runs: Iterable[Any]) -> Labels:
        runs = list(runs)
        return cls(Variants.of(r.variant or "" for r in runs), len({r.experiment for r in runs}))

    def text(self, line: RunLine, width: int) -> str:
        """The experiment goes before any value of the variant does."""
        seed = f"s{line.seed}"
        variants = self.variants.forms(line.variant)
        heads = [f"{line.experiment} ", ""] if self.experiments > 1 else [""]
        keyed = [v for v in variants if "=" in v] or variants  # forms that still name a key
        for head in heads:
            for variant in keyed if head else variants:
                text = " ".join(x for x in (head + variant, seed) if x.strip())
                if len(text) <= width:
                    return text
        return cut(" ".join(x for x in (variants[-1], seed) if x), width)

    def wants(self, line: RunLine) -> int:
        return len(self.text(line, 10**6))


# what a run's line holds, most important first; a narrow terminal drops from the end
ESSENTIAL = ("label", "steps", "loss", "best", "eta", "bar")
OPTIONAL = ("speed", "id", "epoch")  # where there is room once the label is whole


def plan(width: int, lines: list[RunLine], labels: Labels) -> tuple[dict[str, int], bool]:
    """The fields shown at `width` and their widths (in SHOWN order), and whether
    the best field names its metric. ESSENTIAL fields go from the end until the
    line fits; what is left goes to the label (up to its whole width), the bar
    (up to BAR_GOOD), the metric's name, the OPTIONAL fields, then the bar again."""
    fixed = {k: max((len(line.texts()[k]) for line in lines), default=0)
             for k in (*ESSENTIAL, *OPTIONAL) if k not in ("label", "bar")}
    for key, least_width in STEADY.items():  # numbers that change width keep the layout still
        fixed[key] = max(fixed[key], least_width)
    totals = [line.total or 0 for line in lines]
    fixed["steps"] = max(fixed["steps"], 2 * len(str(max(totals, default=0))) + 1)
    least = {"label": LABEL_MIN, "bar": BAR_MIN, **fixed}
    shown = list(ESSENTIAL)
    while len(shown) > 1 and sum(least[k] for k in shown) + len(shown) - 1 > width:
        shown.pop()
    widths = {k: least[k] for k in shown}
    left = width - sum(widths.values()) - len(widths) + 1

    def grow(key: str, upto: int) -> None:
        nonlocal left
        more = max(0, min(left, upto - widths[key]))
        widths[key] += more
        left -= more

    grow("label", max((labels.wants(line) for line in lines), default=0))
    named = False
    if "bar" in widths:
        grow("bar", BAR_GOOD)
        extra = max((len(line.texts(True)["best"]) for line in lines), default=0) - widths["best"]
        if extra <= left:
            widths["best"], left, named = widths["best"] + extra, left - extra, True
        for key in OPTIONAL:
            if fixed[key] + 1 <= left:
                widths[key], left = fixed[key], left - fixed[key] - 1
        grow("bar", BAR_MAX)
    return {k: widths[k] for k in SHOWN if k in widths}, named


class RunBars(Progress):
    """`rich.progress` with a row per running run laid out by `plan`, then the
    overall line. Each task's `line` field is the run's RunLine."""

    def __init__(self, console: Console, labels: Labels) -> None:
        self.labels = labels
        self.overall = Text()
        super().__init__(console=console, transient=True, refresh_per_second=4)

    def show(self, line: RunLine) -> None:
        task = next((t.id for t in self.tasks if t.fields["line"].id == line.id), None)
        total = line.total or line.epochs
        done = line.step if line.total else line.epoch
        if task is None:
            self.add_task(line.id, total=total, completed=done, line=line)
        else:
            self.update(task, total=total, completed=done, line=line)

    def drop(self, run_id: str) -> None:
        for t in self.tasks:
            if t.fields["line"].id == run_id:
                self.remove_task(t.id)

    def get_renderables(self) -> Iterable[Any]:
        lines = [t.fields["line"] for t in self.tasks]
        if lines:
            yield table(lines, self.console.width, self.labels)
        yield self.overall


def table(lines: list[RunLine], width: int, labels: Labels) -> Table:
    widths, named = plan(width, lines, labels)
    grid = Table.grid(padding=(0, 1))
    for key, w in widths.items():
        grid.add_column(width=w, no_wrap=True, justify="right" if key in RIGHT else "left")
    for line in lines:
        texts = line.texts(named)
        cells: list[Any] = []
        for key, w in widths.items():
            if key == "label":
                cells.append(Text(labels.text(line, w)))
            elif key == "bar":
                total = line.total or line.epochs
                done = line.step if line.total else line.epoch
                cells.append(ProgressBar(total=total, completed=done or 0, width=w))
            else:
                cells.append(Text(texts[key], style="dim" if key == "id" else ""))
        grid.add_row(*cells)
    return grid


def queue_eta(running: list[float | None], queued: int, per_run: float | None) -> float | None:
    """When the last of these runs ends, if each queued one takes `per_run` on the
    first slot free (a slot per running run): the queue's ETA."""
    slots = [eta for eta in running if eta is not None]
    if len(slots) != len(running) or not slots or (queued and per_run is None):
        return None
    for _ in range(queued):
        i = slots.index(min(slots))
        slots[i] += per_run
    return max(slots)


def overall(runs: list[Any], etas: dict[str, float | None], per_run: float | None,
            paused: bool) -> tuple[str, str]:
    """The counts (`3/18 ended · 2 running · 13 queued`) and the queue's ETA (or "")."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.status] = counts.get(r.status, 0) + 1
    ended = sum(counts.get(s, 0) for s in states.FINISHED)
    text = (f"{ended}/{len(runs)} ended · {counts.get(states.RUNNING, 0)} running · "
            f"{counts.get(states.QUEUED, 0)} queued"
            + "".join(f" · {counts[s]} {s}" for s in states.FINISHED
                      if s != states.COMPLETED and counts.get(s)))
    if paused:
        text += " · paused (gridrun resume)"
    running = [etas.get(r.id) for r in runs if r.status == states.RUNNING]
    left = queue_eta(running, counts.get(states.QUEUED, 0), per_run)
    return text, f" · all done in ~{duration(left)}" if left is not None and ended < len(runs) else ""


def ended_line(run: Any, line: RunLine, labels: Labels | None = None,
               width: int | None = None) -> str:
    """One line for a run that ended: its status and id, which run, its result
    (or its error) and how long it took. With `labels` and `width` (a terminal),
    the run is named as its bar named it, to fit the width."""
    took = (run.ended_at - run.started_at) if run.ended_at and run.started_at else None
    if run.status == states.COMPLETED:
        texts = line.texts(named=labels is None)
        rest = f"{texts['loss']}  {texts['best']}"
    else:
        rest = ((run.error or run.note or "").strip().splitlines() or [""])[0][:120]
    rest += f"  ({took:.1f} s)" if took is not None else ""
    head = f"{run.status:<9}  {run.id}  "
    if labels is None or width is None:
        who = " ".join(x for x in (run.experiment, run.variant) if x) + f" seed {run.seed}"
    else:
        who = labels.text(line, max(LABEL_MIN, width - len(head) - len(rest) - 2))
    return cut(f"{head}{who}  {rest}", width) if width else f"{head}{who}  {rest}"


def started_line(run: Any) -> str:
    return (f"{'started':<9}  {run.id}  {' '.join(x for x in (run.experiment, run.variant) if x)}"
            f" seed {run.seed}" + (f" on {run.slot}" if run.slot else ""))


class Reader:
    """Each run's metrics log read from where the last read stopped, folded into
    its Progress (one fold per run, as every view does)."""

    def __init__(self, root: Path) -> None:
        self.root, self.offsets, self.folded = root, {}, {}

    def progress(self, run: Any) -> Any:
        from gridrun.runs import layout, progress, runlog

        trainer = run.config.get("trainer", {}) if isinstance(run.config, dict) else {}
        records, self.offsets[run.id] = runlog.read_from(run.run_dir(self.root) / layout.METRICS,
                                                         self.offsets.get(run.id, 0))
        p = self.folded.get(run.id) or progress.Progress.known(
            early_stop_metric=trainer.get("early_stop_metric"))
        p = self.folded[run.id] = progress.fold(records, previous=p)
        return p


class Feed:
    """The followed runs folded over the store's change feed (`changes_since`,
    `removed_since`): each read says which started and which ended since the last. A run
    that started and ended between two reads comes once, ended: `started` comes first.
    So does one that started at `since` or later and ended before the first read (the
    engine was up, the runs small, the follower slow to start): `since` is when the
    follower's command queued them, so an earlier attempt's end is never told again."""

    def __init__(self, ids: Iterable[str], since: float | None = None) -> None:
        self.ids, self.runs, self.seq, self.removed_seq = set(ids), {}, 0, 0
        self.since = since

    def read(self, store: Any) -> tuple[list[Any], list[tuple[str, Any]]]:
        gone, self.removed_seq = store.removed_since(self.removed_seq)
        for run_id in gone:
            self.runs.pop(run_id, None)
        changed, self.seq = store.changes_since(self.seq)  # the first read: queue order
        events = []
        for r in (r for r in changed if r.id in self.ids):
            before, self.runs[r.id] = self.runs.get(r.id), r
            ended_unseen = (before is None and self.since is not None and r.started_at
                            and r.started_at >= self.since and r.status in states.FINISHED)
            if r.started_at and (r.status == states.RUNNING or ended_unseen if before is None
                                 else r.status in (states.RUNNING, *states.FINISHED)
                                 and r.started_at != before.started_at):
                events.append(("started", r))  # a new start (a retry's too)
            if ended_unseen or (before is not None and r.status in states.FINISHED and (
                    (before.status, before.ended_at) != (r.status, r.ended_at))):
                events.append(("ended", r))
        return list(self.runs.values()), events


def follow(root: Path, ids: list[str], *, live: bool, interval: float = 0.5,
           since: float | None = None) -> bool:
    """Until every run in `ids` has ended; True if all completed. `since`: when they were
    queued (a run that started since and ended before the first read is told). Ctrl-C
    raises KeyboardInterrupt."""
    from gridrun.commands.common import open_store
    from gridrun.engine import daemon

    reader, feed = Reader(root), Feed(ids, since)
    previous, next_engine_check = None, 0.0
    with open_store(root) as store:  # damage found while following: one line, exit 2
        runs, events = feed.read(store)
        bars = RunBars(Console(), Labels.of(runs)) if live else None
        out = bars.console if bars is not None else Console(no_color=True, force_terminal=False)

        def say(text: str) -> None:  # above the bars; plain text, never markup
            out.print(text, markup=False, highlight=False, soft_wrap=True)

        with bars or contextlib.nullcontext():
            while True:
                now = time.time()
                for event, r in events:  # in the order they were written
                    if event == "started":
                        if bars is None:  # a bar says it on a terminal
                            say(started_line(r))
                        continue
                    if bars is not None:
                        bars.drop(r.id)
                    line = RunLine.of(r, reader.progress(r), now)
                    say(ended_line(r, line) if bars is None else
                        ended_line(r, line, bars.labels, bars.console.width))
                etas: dict[str, float | None] = {}
                for r in (r for r in runs if r.status == states.RUNNING):
                    line = RunLine.of(r, reader.progress(r), now)
                    etas[r.id] = line.eta
                    if bars is not None:
                        bars.show(line)
                done = [r.ended_at - r.started_at for r in runs if r.status == states.COMPLETED
                        and r.ended_at and r.started_at]
                per_run = sum(done) / len(done) if done else _pace(runs, reader)
                counts, eta = overall(runs, etas, per_run, store.paused)
                if bars is not None:
                    bars.overall = Text(counts + eta)
                elif counts != previous:
                    say(counts)
                    previous = counts
                if all(r.status in states.FINISHED for r in runs):
                    if bars is not None:
                        bars.stop()
                        say(counts)
                    # a search's trial stopped at a rung ended as it should
                    return all(r.status in (states.COMPLETED, states.STOPPED) for r in runs)
                if time.monotonic() >= next_engine_check:
                    next_engine_check = time.monotonic() + 2.0
                    if not daemon.status(root).running:
                        if bars is not None:
                            bars.stop()
                        Console(stderr=True, highlight=False).print(
                            "the engine is not running; the runs wait in the queue. Start it "
                            f"with `gridrun engine start --root {root}`.")
                        return False
                time.sleep(interval)
                runs, events = feed.read(store)


def _pace(runs: list[Any], reader: Reader) -> float | None:
    """A run's expected length from the running ones' pace, before any has completed."""
    whole = [p.total_steps * p.s_per_step for r in runs if r.status == states.RUNNING
             and (p := reader.folded.get(r.id)) and p.total_steps and p.s_per_step]
    return sum(whole) / len(whole) if whole else None
