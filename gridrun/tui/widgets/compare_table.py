"""The compare screen's table: a DataTable whose Right and Left scroll by columns.

Its cursor picks rows, and under a row cursor DataTable's Right scrolls one cell:
seventeen columns of a dozen cells took two hundred presses to read.
"""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding
from textual.widgets import DataTable

from gridrun.tui.widgets.compare_columns import next_offset


class CompareTable(DataTable):
    BINDINGS: ClassVar = [
        Binding("right", "scroll_columns(1)", "columns right", show=False),
        Binding("left", "scroll_columns(-1)", "columns left", show=False),
        # DataTable's own, named here so that `?` lists them: the first and last columns
        Binding("home", "scroll_home", "first columns", show=False),
        Binding("end", "scroll_end", "last columns", show=False),
    ]

    def action_scroll_columns(self, by: int) -> None:
        """Half a screen of whole columns right (by=1) or left (-1); the frozen names stay."""
        widths = [column.get_render_width(self) for column in self.ordered_columns]
        names = sum(widths[:self.fixed_columns])
        room = self.scrollable_content_region.width - names
        x = next_offset(widths[self.fixed_columns:], self.scroll_x, by, room, self.max_scroll_x)
        self.scroll_to(x=x, animate=False)  # at once, as the runs list moves
