"""The runs table: one row per run; only changed cells are redrawn."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable

from gridrun.tui.source import RunRow
from gridrun.tui.widgets import fmt

COLUMNS = ("mark", "status", "id", "experiment", "variant", "seed", "progress", "loss", "best",
           "samples/s", "slot", "elapsed", "eta", "prio")
LABELS = {"mark": " ", "samples/s": "smp/s"}
# Fixed widths: an auto-width column re-measures every cell of the column on
# each update, which costs seconds with 10,000 rows. The names grow to fit.
WIDTHS = {"mark": 1, "status": 11, "id": 10, "experiment": 10, "variant": 12, "seed": 4,
          "progress": fmt.PROGRESS_WIDTH, "loss": 6, "best": 6, "samples/s": 6, "slot": 5, "elapsed": 7, "eta": 7,
          "prio": 4}
GROWS = {"experiment": 3, "variant": 4}  # column: index in cells()
MAX_WIDTH = 32
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


def cells(r: RunRow, now: float, marked: bool) -> tuple:
    return ("●" if marked else " ", fmt.status(r.status), r.id, r.experiment, r.variant or "-",
            str(r.seed), fmt.progress(r), fmt.num(r.train_loss), fmt.num(r.best),
            fmt.num(r.samples_per_s, 3), r.slot or "", fmt.duration(fmt.elapsed(r, now)),
            fmt.duration(fmt.eta(r, now)), str(r.priority) if r.priority else "")


def matches(r: RunRow, needle: str) -> bool:
    if not needle:
        return True
    hay = f"{r.id} {r.experiment} {r.variant} {r.status} seed={r.seed} {r.slot or ''}".lower()
    return all(word in hay for word in needle.lower().split())


class RunsTable(DataTable):
    BINDINGS: ClassVar = [Binding("j", "cursor_down", "down", show=False),
                Binding("k", "cursor_up", "up", show=False)]

    def __init__(self, clock: Callable[[], float], **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self.clock = clock
        self.runs: dict[str, RunRow] = {}
        self.arrival: dict[str, int] = {}  # first read in queue order, then new runs: ties' order
        self.marked: set[str] = set()
        self.shown: dict[str, tuple] = {}  # id -> the cells on screen
        self.needle = ""
        self.sort_column: str | None = None
        self.reverse = False
        self.grouped = False

    def on_mount(self) -> None:
        for key in COLUMNS:
            self.add_column(LABELS.get(key, key), key=key, width=WIDTHS[key])

    def _update_dimensions(self, new_rows: Iterable) -> None:
        # DataTable measures every cell of every new row to fit auto-width
        # columns: two seconds for 10,000 rows. Here no column is auto-width and
        # every row is one line without a label, so only the size is recomputed.
        super()._update_dimensions(())

    @property
    def current(self) -> RunRow | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        return self.runs.get(key)

    @property
    def selection(self) -> list[str]:
        """The marked runs, or else the one under the cursor."""
        if self.marked:
            return [i for i in self.runs if i in self.marked]
        cur = self.current
        return [cur.id] if cur else []

    def apply(self, rows: Iterable[RunRow]) -> None:
        """Merge changed rows: update changed cells, add new rows."""
        rows = list(rows)
        now, added = self.clock(), False
        for r in rows:
            self.runs[r.id] = r
            self.arrival.setdefault(r.id, len(self.arrival))
            if not matches(r, self.needle):
                if r.id in self.shown:
                    self.remove_row(r.id)
                    del self.shown[r.id]
                continue
            new = cells(r, now, r.id in self.marked)
            old = self.shown.get(r.id)
            if old is None:
                self.add_row(*new, key=r.id)
                added = True
            else:
                self._update(r.id, old, new)
            self.shown[r.id] = new
        self._grow(rows)
        if added and (self.sort_column or self.grouped):
            self.resort()

    def _grow(self, rows: Iterable[RunRow]) -> None:
        for key, index in GROWS.items():
            column = self.columns[key]
            want = min(MAX_WIDTH, max((len(self.shown[r.id][index]) for r in rows
                                       if r.id in self.shown), default=0))
            if want > column.width:
                column.width = want
                self._require_update_dimensions = True
                self.refresh()

    def _update(self, run_id: str, old: tuple, new: tuple) -> None:
        for key, a, b in zip(COLUMNS, old, new, strict=True):
            if a != b:
                self.update_cell(run_id, key, b)

    def tick(self) -> None:
        """Elapsed and ETA move with the clock: refresh them for running runs only."""
        now = self.clock()
        for run_id, old in self.shown.items():
            r = self.runs[run_id]
            if r.status == "running":
                new = cells(r, now, run_id in self.marked)
                self._update(run_id, old, new)
                self.shown[run_id] = new

    def toggle_mark(self) -> None:
        cur = self.current
        if cur is None:
            return
        self.marked ^= {cur.id}
        self.apply([cur])
        if self.cursor_row < self.row_count - 1:
            self.move_cursor(row=self.cursor_row + 1)

    def set_filter(self, needle: str) -> None:
        self.needle = needle
        self.clear()
        self.shown = {}
        self.apply(list(self.runs.values()))
        if not self.sort_column and not self.grouped:
            return
        self.resort()

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

        def key(cells_row) -> tuple:
            r = self.runs[cells_row[0]]
            group = (r.experiment,) if self.grouped else ()
            own = SORT_KEYS[col](r, now) if col else (-r.priority, r.queued_at, self.arrival[r.id])
            return (*group, *own)

        # DataTable.sort hands the key the named columns' values; sort on the id.
        self.sort("id", key=lambda values: key((values,)), reverse=self.reverse)
        for col_key in COLUMNS:
            column = self.columns[col_key]
            label = LABELS.get(col_key, col_key)
            arrow = (" ▼" if self.reverse else " ▲") if col_key == col else ""
            column.label = Text(label + arrow)
        self.refresh()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        key = event.column_key.value
        if key in SORT_KEYS:
            self.reverse = (self.sort_column == key) and not self.reverse
            self.sort_column = key
            self.resort()
