"""The runs table: one run a line, each line rendered once and kept.

A widget of Textual's Line API (`ScrollView` + `render_line`). Every row's
line is cached by run id; a changed run drops only its own line and refreshes
only that line on the screen (if it is visible at all), so a tick with 100
live runs among 10,000 costs what those rows cost, not what the table costs.
DataTable, by contrast, throws its whole render cache away on any cell update.

Which columns show at a width, what they hold and sort by: columns.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gridrun.spec.variants import Variants, form
from gridrun.tui.source import RunRow
from gridrun.tui.widgets import fmt
from gridrun.tui.widgets.columns import (
    GAP,
    GROUP,
    GROWS,
    INDEX,
    MAX_WIDTH,
    PLAIN,
    RIGHT,
    SCROLLS,
    SORT_KEYS,
    SORTABLE,
    STATUS_STYLES,
    Tracked,
    cells,
    clip,
    fit,
    header,
    hidden_right,
    matches,
    next_skip,
    queue_order,
    status_counts,
    wants,
)


class RunsTable(ScrollView, can_focus=True):
    """The runs, one a line; `apply` merges changed rows, `tick` moves the clocks."""

    BINDINGS: ClassVar = [
        Binding("down,j", "cursor_down", "down", show=False),
        Binding("up,k", "cursor_up", "up", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("home", "first", "first", show=False),
        Binding("end", "last", "last", show=False),
        Binding("right", "scroll_columns(1)", "columns right", show=False),
        Binding("left", "scroll_columns(-1)", "columns left", show=False),
    ]
    COMPONENT_CLASSES: ClassVar = {"runs-table--header", "runs-table--cursor", "runs-table--group"}
    DEFAULT_CSS = """
    RunsTable {
        background: $surface;
        color: $foreground;
        overflow-x: hidden;
        & > .runs-table--header { text-style: bold; background: $panel; color: $foreground; }
        & > .runs-table--cursor { background: $block-cursor-blurred-background; }
        & > .runs-table--group { background: $boost; color: $text-accent; }
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
        self._fitted: tuple | None = None  # (width, want, skip) of self.columns
        self.skip = 0  # scrolled sideways: the columns after FROZEN not shown (see fit)
        self.tracked = Tracked()  # the early-stop metrics the rows track (the best column's name)
        self._lines: LRUCache[str, Strip] = LRUCache(2048)  # id -> its line, without the cursor
        self.variants = Variants()  # what the variants on show share (left out of each cell)
        self.variant_levels: list[tuple[int | None, int]] = [(None, 0)]  # see Variants.levels
        self.variant_keep: int | None = None  # the form the variant column shows
        self._variants_stale = True
        self.lines_rendered = 0  # rows rendered (not from the cache): tests read it

    # ---- what the rest of the app reads ------------------------------------------

    @property
    def row_count(self) -> int:
        return len(self.order)

    @property
    def run_order(self) -> list[str]:
        """The runs' ids top to bottom (without group header rows)."""
        return [i for i in self.order if not i.startswith(GROUP)]

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
        now, added, removed, moved = self.clock(), [], False, False
        by_priority = self.sort_column in (None, "prio")
        for r in rows:
            old = self.runs.get(r.id)
            self.runs[r.id] = r
            if old is None or old.best_name != r.best_name:
                self._count_best(old, r)
            self.arrival.setdefault(r.id, len(self.arrival))
            if old is not None and self.grouped and old.status != r.status:
                self._group_changed(r.experiment)
            if not matches(r, self.needle):
                if self.shown.pop(r.id, None) is not None:
                    removed = self._variants_stale = True
                continue
            # in queue order, a priority change moves the row where the engine will take it
            moved |= old is not None and by_priority and old.priority != r.priority
            new = cells(r, now, r.id in self.marked)
            if r.id not in self.shown:
                added.append(r.id)
                if self.grouped:
                    self._group_changed(r.experiment)
            self._set(r.id, new)
        # queue order too is an order: new rows go where it puts them, and a priority
        # change moves its row there; group header rows count what their groups show
        if added or moved or (removed and self.grouped):
            self.resort()
        elif removed:
            self.order = [i for i in self.order if i in self.shown]
            self._reindex()

    def _group_changed(self, experiment: str) -> None:
        key = GROUP + fmt.text(experiment)
        self._lines.discard(key)
        if (row := self.position.get(key)) is not None:
            self.refresh_line(row + 1)

    def remove(self, ids: Iterable[str]) -> None:
        """Runs taken out of the store: their rows go, the cursor stays on its run."""
        gone = {i for i in ids if i in self.runs}
        if not gone:
            return
        current = self.current
        self._variants_stale = True
        for run_id in gone:
            self._count_best(self.runs.pop(run_id, None), None)
            self.shown.pop(run_id, None)
            self._lines.discard(run_id)
        self.marked -= gone
        row = self.cursor_row
        self.order = [i for i in self.order if i not in gone]
        if self.grouped:
            self.resort()
        self._reindex()
        keep = current.id if current is not None and current.id not in gone else None
        self.move_cursor(row=self.position[keep] if keep else min(row, len(self.order) - 1))

    def _set(self, run_id: str, new: tuple[str, ...]) -> None:
        old = self.shown.get(run_id)
        if old == new:
            return
        self.shown[run_id] = new
        self._lines.discard(run_id)
        variant = INDEX["variant"]
        self._variants_stale |= old is None or old[variant] != new[variant]
        for key, want in wants(self.runs[run_id], new).items():  # the variant's: _refresh_variants
            self.want[key] = max(self.want.get(key, 0), want)
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
        self.shown, self.order, self._variants_stale = {}, [], True
        self._lines.clear()
        self.apply(list(self.runs.values()))
        if not self.order:  # nothing matched: apply added nothing, so did not reindex
            self._reindex()
        if current is not None and current.id in self.position:
            self.move_cursor(row=self.position[current.id])

    def sortable_columns(self) -> tuple[str, ...]:
        return SORTABLE

    def sort_by(self, column: str | None, reverse: bool | None = None) -> str:
        """Sort by `column` (None: queue order) and show the top of the sort."""
        self.sort_column = column
        if reverse is not None:
            self.reverse = reverse
        self.resort()
        self.move_cursor(row=0)
        self.scroll_to(y=0, animate=False)
        self.show_column(column)
        return column or "queue order"

    def resort(self) -> None:
        now, col = self.clock(), self.sort_column

        def key(run_id: str) -> tuple:
            r = self.runs[run_id]
            return SORT_KEYS[col](r, now) if col else queue_order(r, self.arrival[r.id])

        current = self.current
        self.order = sorted(self.shown, key=key, reverse=self.reverse)
        if self.grouped:  # groups stay in name order whichever way the rows go, under a header
            groups: dict[str, list[str]] = {}
            for run_id in self.order:
                groups.setdefault(fmt.text(self.runs[run_id].experiment), []).append(run_id)
            self.order = [i for name in sorted(groups) for i in (GROUP + name, *groups[name])]
            self._lines.clear()
        self._reindex()
        if current is not None and current.id in self.position:
            self.move_cursor(row=self.position[current.id])

    # ---- the cursor ---------------------------------------------------------------

    def move_cursor(self, *, row: int, step: int = 1) -> None:
        if not self.order:
            return
        row = max(0, min(row, len(self.order) - 1))
        if self.order[row].startswith(GROUP):  # group headers are not runs: step over them
            nxt = row + step if 0 <= row + step < len(self.order) else row - step
            row = nxt if 0 <= nxt < len(self.order) else row
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
        self.move_cursor(row=self.cursor_row - 1, step=-1)

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

    def _refresh_variants(self) -> None:
        """What the shown rows' variants share (dropped from every cell, see
        spec/variants.py), and the width the longest then needs."""
        self._variants_stale = False
        labels = [cells[INDEX["variant"]] for cells in self.shown.values()]
        self.variants = Variants.of(labels)
        self.variant_levels = self.variants.levels(labels)
        self.want["variant"] = self.variant_levels[0][1]
        self._fitted = None  # the column's form may change with the same width
        self._lines.clear()

    def _fit(self) -> None:
        if self._variants_stale:
            self._refresh_variants()
        width = self.scrollable_content_region.width
        if self._fitted != (width, self.want, self.skip):
            self._fitted = (width, dict(self.want), self.skip)
            layout = fit(width, self.want, self.skip)
            room = layout.get("variant", 0)  # the first form all the variants fit in
            keep = next((k for k, w in self.variant_levels if w <= room), 0)
            if layout != self.columns or keep != self.variant_keep:
                self.columns, self.variant_keep = layout, keep
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
            line = self._group(run_id[1:], width) if run_id.startswith(GROUP) else self._row(run_id, width)
            self._lines.discard(run_id)  # LRUCache.set keeps a key's old value
            self._lines.set(run_id, line)
        if row == self.cursor_row:
            line = line.apply_style(self.get_component_rich_style("runs-table--cursor"))
        return line

    def _row(self, run_id: str, width: int) -> Strip:
        self.lines_rendered += 1
        values, r = self.shown[run_id], self.runs[run_id]
        segments, gap = [], Segment(" " * GAP, PLAIN)
        for key, w in self.columns.items():
            value = values[INDEX[key]]
            if key == "variant":  # shortened from the middle: every value stays (not `hidden=32 l…`)
                value = form(value, self.variant_keep, self.variants.shared) or "-"
            text = clip(value, w, key in RIGHT)
            style = STATUS_STYLES.get(r.status, PLAIN) if key == "status" else PLAIN
            segments += (Segment(text, style), gap)
        return Strip(segments).adjust_cell_length(width, PLAIN)

    def best_label(self, width: int) -> str:
        """The best column's header in `width` cells (columns.Tracked.label)."""
        return self.tracked.label(width - (2 if self.sort_column == "best" else 0))  # sort arrow

    def _count_best(self, old: RunRow | None, new: RunRow | None) -> None:
        self.tracked.change(old, new)
        want = cell_len(self.tracked.label(MAX_WIDTH)) + 2  # and the sort arrow
        if want != self.want.get("best"):  # the header's best column changes its name
            self.want["best"] = want
            self.refresh_line(0)

    # ---- sideways ----------------------------------------------------------------

    def action_scroll_columns(self, by: int) -> None:
        """Half a screen of columns right (by=1) or left (-1); status and id stay."""
        if by < 0 or hidden_right(self.columns):
            self.scroll_columns_to(next_skip(self.columns, self.skip, by,
                                             self.scrollable_content_region.width))

    def scroll_columns_to(self, skip: int) -> None:
        if skip != self.skip:
            self.skip = max(0, min(skip, len(SCROLLS) - 1))
            self._lines.clear()
            self.refresh()

    def hidden_right(self) -> bool:
        return hidden_right(self.columns)

    def show_column(self, key: str | None) -> None:
        """Scroll sideways so that `key` (the sorted column) is on the screen."""
        self._fit()
        if key is None or key in self.columns:
            return
        self.scroll_columns_to(max(1, SCROLLS.index(key)) if key in SCROLLS else 1)

    def _group(self, experiment: str, width: int) -> Strip:
        """A group's header row: its name, how many runs it shows, and their states."""
        runs = [self.runs[i] for i in self.shown if fmt.text(self.runs[i].experiment) == experiment]
        style = self.get_component_rich_style("runs-table--group")
        segments = [Segment(f"▾ {experiment}", style + Style(bold=True)),
                    Segment(f"  {len(runs)} run{'s' * (len(runs) != 1)} ", style)]
        segments += [Segment(f" {glyph}{n}", style + STATUS_STYLES.get(status, PLAIN))
                     for status, glyph, n in status_counts(runs)]
        return Strip(segments).adjust_cell_length(width, style)

    def _header(self, width: int) -> Strip:
        style, segments = self.get_component_rich_style("runs-table--header"), []
        for key, w in self.columns.items():
            arrow = 2 if key == self.sort_column else 0
            label = self.best_label(w) if key == "best" else header(key, w - arrow)
            if arrow:  # the arrow always shows; the name gives way
                label = label[:max(1, w - 2)].rstrip() + (" ▼" if self.reverse else " ▲")
            segments += (Segment(clip(label, w, key in RIGHT), style), Segment(" " * GAP, style))
        return Strip(segments).adjust_cell_length(width, style)
