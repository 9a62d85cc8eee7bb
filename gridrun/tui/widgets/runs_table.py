"""The runs table: one run a line, each line rendered once and kept.

A widget of Textual's Line API (`ScrollView` + `render_line`). Every row's
line is cached by run id; a changed run drops only its own line and refreshes
only that line on the screen (if it is visible at all), so a tick with 100
live runs among 10,000 costs what those rows cost, not what the table costs.
DataTable, by contrast, throws its whole render cache away on any cell update.

Columns are chosen by priority to fit the width: status, experiment, variant,
seed, progress, loss and best stay at 80 columns; id, elapsed, eta, samples/s,
slot and prio come back as the terminal widens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gridrun.tui.source import RunRow
from gridrun.tui.widgets import fmt

COLUMNS = ("mark", "status", "id", "experiment", "variant", "seed", "progress", "loss", "best",
           "samples/s", "slot", "elapsed", "eta", "prio")
INDEX = {key: i for i, key in enumerate(COLUMNS)}
LABELS = {"mark": " ", "samples/s": "smp/s"}
# Least widths; the names grow toward their longest value (up to MAX_WIDTH) when there is room.
WIDTHS = {"mark": 1, "status": 11, "id": 10, "experiment": 10, "variant": 12, "seed": 4,
          "progress": fmt.PROGRESS_WIDTH, "loss": 6, "best": 6, "samples/s": 6, "slot": 5,
          "elapsed": 7, "eta": 7, "prio": 4}
# Which columns a narrower terminal keeps: CORE always, then the others in this order.
CORE = ("mark", "status", "experiment", "variant", "seed", "progress", "loss", "best")
PRIORITY = (*CORE, "id", "elapsed", "eta", "samples/s", "slot", "prio")
GROWS = ("experiment", "variant")
RIGHT = frozenset({"seed", "loss", "best", "samples/s", "elapsed", "eta", "prio"})
MAX_WIDTH = 32
GAP = 1  # blank cells between two columns
# What each column sorts by (a tuple, so missing values sort last).
SORT_KEYS: dict[str, Callable[[RunRow, float], tuple]] = {
    "status": lambda r, now: (r.status,),
    "id": lambda r, now: (r.id,),
    "experiment": lambda r, now: (r.experiment, r.variant, r.seed),
    "variant": lambda r, now: (r.variant, r.seed),
    "seed": lambda r, now: (r.seed,),
    "progress": lambda r, now: (r.step / r.total_steps if r.total_steps else r.step,),
    "loss": lambda r, now: (r.train_loss is None, r.train_loss or 0.0),
    "best": lambda r, now: (r.best is None, r.best or 0.0),
    "samples/s": lambda r, now: (r.samples_per_s is None, -(r.samples_per_s or 0.0)),
    "slot": lambda r, now: (r.slot or "~",),
    "elapsed": lambda r, now: (-(fmt.elapsed(r, now) or 0.0),),
    "eta": lambda r, now: (fmt.eta(r, now) is None, fmt.eta(r, now) or 0.0),
    "prio": lambda r, now: (-r.priority, r.queued_at),
}
SORTABLE = tuple(SORT_KEYS)
STATUS_STYLES = {s: Style.parse(style) for s, (_, style) in fmt.GLYPHS.items()}
PLAIN = Style()  # never None: line filters (NO_COLOR's monochrome) read every segment's style


def cells(r: RunRow, now: float, marked: bool) -> tuple[str, ...]:
    return ("●" if marked else " ", fmt.status(r.status).plain, r.id, r.experiment,
            r.variant or "-", str(r.seed), fmt.progress(r), fmt.num(r.train_loss), fmt.num(r.best),
            fmt.num(r.samples_per_s, 3) + fmt.flags(r.flags), r.slot or "", fmt.duration(fmt.elapsed(r, now)),
            fmt.duration(fmt.eta(r, now)), str(r.priority) if r.priority else "")


def matches(r: RunRow, needle: str) -> bool:
    if not needle:
        return True
    hay = f"{r.id} {r.experiment} {r.variant} {r.status} seed={r.seed} {r.slot or ''}".lower()
    return all(word in hay for word in needle.lower().split())


def fit(width: int, want: dict[str, int]) -> dict[str, int]:
    """Column -> width for a line of `width` cells, in display order.

    The core columns always; then id; then the names grow toward `want` (their
    longest value); then the other columns in priority order while they fit;
    what is left widens the names up to MAX_WIDTH."""
    widths = {key: WIDTHS[key] for key in CORE}
    used = sum(widths.values()) + GAP * (len(widths) - 1)

    def add(key: str) -> None:
        nonlocal used
        if used + GAP + WIDTHS[key] <= width:
            widths[key] = WIDTHS[key]
            used += GAP + WIDTHS[key]

    def grow(limit: Callable[[str], int]) -> None:
        nonlocal used
        for key in GROWS:
            extra = max(0, min(limit(key) - widths[key], width - used))
            widths[key] += extra
            used += extra

    add("id")
    grow(lambda key: min(MAX_WIDTH, want.get(key, 0)))
    for key in PRIORITY[len(CORE) + 1:]:
        add(key)
    grow(lambda key: MAX_WIDTH if want.get(key, 0) > widths[key] else 0)
    return {key: widths[key] for key in COLUMNS if key in widths}


def clip(text: str, width: int, right: bool = False) -> str:
    if cell_len(text) > width:
        return set_cell_size(text, width - 1) + "…" if width > 1 else text[:width]
    pad = " " * (width - cell_len(text))
    return pad + text if right else text + pad


class RunsTable(ScrollView, can_focus=True):
    """The runs, one a line; `apply` merges changed rows, `tick` moves the clocks."""

    BINDINGS: ClassVar = [
        Binding("down,j", "cursor_down", "down", show=False),
        Binding("up,k", "cursor_up", "up", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("home", "first", "first", show=False),
        Binding("end", "last", "last", show=False),
    ]
    COMPONENT_CLASSES: ClassVar = {"runs-table--header", "runs-table--cursor"}
    DEFAULT_CSS = """
    RunsTable {
        background: $surface;
        color: $foreground;
        overflow-x: hidden;
        & > .runs-table--header { text-style: bold; background: $panel; color: $foreground; }
        & > .runs-table--cursor { background: $block-cursor-blurred-background; }
        &:focus > .runs-table--cursor {
            background: $block-cursor-background;
            color: $block-cursor-foreground;
            text-style: $block-cursor-text-style;
        }
    }
    """

    class CursorMoved(Message):
        """The run under the cursor may have changed."""

    def __init__(self, clock: Callable[[], float], **kwargs) -> None:
        super().__init__(**kwargs)
        self.clock = clock
        self.runs: dict[str, RunRow] = {}
        self.arrival: dict[str, int] = {}  # first read in queue order, then new runs: ties' order
        self.marked: set[str] = set()
        self.shown: dict[str, tuple[str, ...]] = {}  # id -> the cells of a row in the table
        self.order: list[str] = []  # the rows, top to bottom
        self.position: dict[str, int] = {}  # id -> its index in order
        self.needle = ""
        self.sort_column: str | None = None
        self.reverse = False
        self.grouped = False
        self.cursor_row = 0
        self.want = {key: 0 for key in GROWS}  # the names' longest values
        self.columns: dict[str, int] = {}
        self._fitted: tuple[int, dict[str, int]] | None = None  # (width, want) of self.columns
        self._lines: LRUCache[str, Strip] = LRUCache(2048)  # id -> its line, without the cursor
        self.lines_rendered = 0  # rows rendered (not from the cache): tests read it

    # ---- what the rest of the app reads ------------------------------------------

    @property
    def row_count(self) -> int:
        return len(self.order)

    @property
    def current(self) -> RunRow | None:
        return self.runs.get(self.order[self.cursor_row]) if self.order else None

    @property
    def selection(self) -> list[str]:
        """The marked runs, or else the one under the cursor."""
        if self.marked:
            return [i for i in self.runs if i in self.marked]
        cur = self.current
        return [cur.id] if cur else []

    # ---- changes ------------------------------------------------------------------

    def apply(self, rows: Iterable[RunRow]) -> None:
        """Merge changed rows: repaint the lines that changed, add new rows."""
        now, added, removed = self.clock(), [], False
        for r in rows:
            self.runs[r.id] = r
            self.arrival.setdefault(r.id, len(self.arrival))
            if not matches(r, self.needle):
                if self.shown.pop(r.id, None) is not None:
                    removed = True
                continue
            new = cells(r, now, r.id in self.marked)
            if r.id not in self.shown:
                added.append(r.id)
            self._set(r.id, new)
        if removed:
            self.order = [i for i in self.order if i in self.shown]
        if added and not (self.sort_column or self.grouped):
            self.order.extend(added)
        if added and (self.sort_column or self.grouped):
            self.resort()
        elif added or removed:
            self._reindex()

    def _set(self, run_id: str, new: tuple[str, ...]) -> None:
        old = self.shown.get(run_id)
        if old == new:
            return
        self.shown[run_id] = new
        self._lines.discard(run_id)
        for key in GROWS:
            if cell_len(new[INDEX[key]]) > self.want[key]:
                self.want[key] = cell_len(new[INDEX[key]])
        if old is not None and (row := self.position.get(run_id)) is not None:
            self.refresh_line(row + 1)  # +1: the header

    def tick(self) -> None:
        """Elapsed and ETA move with the clock: refresh them for running runs only."""
        now = self.clock()
        for run_id in self.shown:
            r = self.runs[run_id]
            if r.status == "running":
                self._set(run_id, cells(r, now, run_id in self.marked))

    def _reindex(self) -> None:
        self.position = {run_id: i for i, run_id in enumerate(self.order)}
        self.cursor_row = max(0, min(self.cursor_row, len(self.order) - 1))
        self.virtual_size = Size(self.size.width, len(self.order) + 1)
        self.refresh()
        self.post_message(self.CursorMoved())

    def toggle_mark(self) -> None:
        cur = self.current
        if cur is None:
            return
        self.marked ^= {cur.id}
        self.apply([cur])
        if self.cursor_row < self.row_count - 1:
            self.move_cursor(row=self.cursor_row + 1)

    def set_filter(self, needle: str) -> None:
        current = self.current
        self.needle = needle
        self.shown, self.order = {}, []
        self._lines.clear()
        self.apply(list(self.runs.values()))
        if not self.sort_column and not self.grouped:
            self.order.sort(key=lambda i: self.arrival[i])
            self._reindex()
        if current is not None and current.id in self.position:
            self.move_cursor(row=self.position[current.id])

    def cycle_sort(self, reverse: bool = False) -> str:
        if reverse:
            self.reverse = not self.reverse
        else:
            order = (None, *SORTABLE)
            self.sort_column = order[(order.index(self.sort_column) + 1) % len(order)]
        self.resort()
        return self.sort_column or "queue order"

    def resort(self) -> None:
        now, col = self.clock(), self.sort_column

        def key(run_id: str) -> tuple:
            r = self.runs[run_id]
            own = SORT_KEYS[col](r, now) if col else (-r.priority, r.queued_at, self.arrival[r.id])
            return own

        current = self.current
        self.order = sorted(self.shown, key=key, reverse=self.reverse)
        if self.grouped:  # groups stay in name order whichever way the rows go
            self.order.sort(key=lambda i: self.runs[i].experiment)
        self._reindex()
        if current is not None and current.id in self.position:
            self.move_cursor(row=self.position[current.id])

    # ---- the cursor ---------------------------------------------------------------

    def move_cursor(self, *, row: int) -> None:
        if not self.order:
            return
        row = max(0, min(row, len(self.order) - 1))
        old, self.cursor_row = self.cursor_row, row
        self.refresh_line(old + 1)
        self.refresh_line(row + 1)
        rows = max(1, self.scrollable_content_region.height - 1)  # below the header
        top = self.scroll_offset.y
        if row < top:
            self.scroll_to(y=row, animate=False)
        elif row >= top + rows:
            self.scroll_to(y=row - rows + 1, animate=False)
        if old != row:
            self.post_message(self.CursorMoved())

    def action_cursor_down(self) -> None:
        self.move_cursor(row=self.cursor_row + 1)

    def action_cursor_up(self) -> None:
        self.move_cursor(row=self.cursor_row - 1)

    def action_page(self, pages: int) -> None:
        self.move_cursor(row=self.cursor_row + pages * max(1, self.scrollable_content_region.height - 1))

    def action_first(self) -> None:
        self.move_cursor(row=0)

    def action_last(self) -> None:
        self.move_cursor(row=len(self.order) - 1)

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        if offset.y == 0:
            self._header_clicked(offset.x)
        else:
            self.move_cursor(row=self.scroll_offset.y + offset.y - 1)

    def _header_clicked(self, x: int) -> None:
        left = 0
        for key, width in self.columns.items():
            if left <= x < left + width and key in SORT_KEYS:
                self.reverse = (self.sort_column == key) and not self.reverse
                self.sort_column = key
                self.resort()
                return
            left += width + GAP

    # ---- painting -----------------------------------------------------------------

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._lines.clear()  # a theme change: every line's colours

    def _fit(self) -> None:
        width = self.scrollable_content_region.width
        if self._fitted != (width, self.want):
            self._fitted = (width, dict(self.want))
            layout = fit(width, self.want)
            if layout != self.columns:
                self.columns = layout
                self._lines.clear()

    def render_line(self, y: int) -> Strip:
        self._fit()
        width = self.scrollable_content_region.width
        if y == 0:
            return self._header(width)
        row = self.scroll_offset.y + y - 1
        if row >= len(self.order):
            return Strip.blank(width, PLAIN)
        run_id = self.order[row]
        line = self._lines.get(run_id)
        if line is None or line.cell_length != width:
            line = self._row(run_id, width)
            self._lines.set(run_id, line)
        if row == self.cursor_row:
            line = line.apply_style(self.get_component_rich_style("runs-table--cursor"))
        return line

    def _row(self, run_id: str, width: int) -> Strip:
        self.lines_rendered += 1
        values, r = self.shown[run_id], self.runs[run_id]
        segments, gap = [], Segment(" " * GAP, PLAIN)
        for key, w in self.columns.items():
            text = clip(values[INDEX[key]], w, key in RIGHT)
            style = STATUS_STYLES.get(r.status, PLAIN) if key == "status" else PLAIN
            segments += (Segment(text, style), gap)
        return Strip(segments).adjust_cell_length(width, PLAIN)

    def _header(self, width: int) -> Strip:
        style, segments = self.get_component_rich_style("runs-table--header"), []
        for key, w in self.columns.items():
            label = LABELS.get(key, key)
            if key == self.sort_column:
                label = clip(label, max(1, w - 2)).rstrip() + (" ▼" if self.reverse else " ▲")
            segments += (Segment(clip(label, w, key in RIGHT), style), Segment(" " * GAP, style))
        return Strip(segments).adjust_cell_length(width, style)
