"""The compare screen's columns at a width: plain functions over a `Table`, no widget.

The columns that name the rows (an ablation's keys and seeds) come first, then the
early-stop metric's (its value, Δ and p: `Table.lead`), then the others in the order
`gridrun compare` gives them, so the metric the runs stop early on shows at 80 columns
without scrolling sideways. When the whole table is wider than the screen, the other
metrics' headers take their short forms first (`loss ↓` for `val loss ↓ at best f1`,
`p` for `Welch p`: the note under the table says what they are); nothing is dropped,
the rest is a sideways scroll away, the names frozen on the left: Right and Left
scroll half a screen of whole columns (`next_offset`), as the runs list does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len

from gridrun.tui.source import Table

PADDING = 2  # a DataTable cell's padding, one cell each side
_KIND = re.compile(r"^(best val|val|final) ")
_AT_BEST = re.compile(r" at best .*$")


@dataclass(frozen=True)
class Arranged:
    """The columns of `Table` in display order (`order[k]`: the table's column shown k-th),
    their headers, the best cells in display positions, and the frozen columns."""

    order: tuple[int, ...]
    labels: tuple[str, ...]
    best: frozenset[tuple[int, int]]
    frozen: int
    short: bool  # whether the headers took their short forms


def short_label(label: str) -> str:
    """A header's short form: `val loss ↓ at best f1` -> `loss ↓`, `Welch p` -> `p`."""
    if label == "Welch p":
        return "p"
    return _KIND.sub("", _AT_BEST.sub("", label))


def order_of(t: Table) -> tuple[int, ...]:
    """The names, the lead columns, then the rest in their own order."""
    n = len(t.columns)
    names = tuple(range(min(t.names, n)))
    lead = tuple(j for j in t.lead if t.names <= j < n)
    return (*names, *lead, *(j for j in range(len(names), n) if j not in lead))


def width_of(labels: tuple[str, ...], t: Table, order: tuple[int, ...]) -> int:
    """The cells a DataTable takes for these columns, padding included."""
    return sum(PADDING + max([cell_len(label), *(cell_len(row[j]) for row in t.rows
                                                  if j < len(row))])
               for label, j in zip(labels, order, strict=True))


def arrange(t: Table, width: int) -> Arranged:
    """The table's columns at `width` cells (see the module's docstring)."""
    order = order_of(t)
    labels = tuple(t.columns[j] for j in order)
    short = width_of(labels, t, order) > width
    if short:
        lead = set(t.lead)
        labels = tuple(label if j in lead and label != "Welch p" else short_label(label)
                       for label, j in zip(labels, order, strict=True))
    where = {j: k for k, j in enumerate(order)}
    best = frozenset((i, where[j]) for i, j in t.best if j in where)
    return Arranged(order, labels, best, min(t.names, len(order)), short)


def next_offset(widths: Sequence[int], x: float, by: int, room: int, end: float) -> float:
    """Where Right (by=1) or Left (-1) scrolls the columns right of the frozen names:
    `widths` are theirs in cells, `x` the offset now, `room` the cells they have on the
    screen and `end` the largest offset. It moves half a screen or more, in whole
    columns (at least one), so that a column starts right after the names: the runs
    list's sideways step, not DataTable's one cell under a row cursor."""
    starts = [sum(widths[:k]) for k in range(len(widths))]
    half = max(1, room // 2)
    if by > 0:
        far = [s for s in starts if s - x >= half]
        return min(far[0], end) if far else end  # within half a screen of the end: the end
    far = [s for s in starts if x - s >= half]
    return far[-1] if far else 0
