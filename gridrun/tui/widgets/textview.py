"""A scrollable text view for a run's output and config: Textual's `Log`, which
follows the tail unless you scroll up, with keys to move and a search.

`show(text)` replaces the text when it changed (the output tail grows); the
view stays at the end if it was there, else where the reader left it.
`find(needle)` and `find_next(±1)` move to the next line that contains the
needle (case-insensitive), wrapping around, and highlight it.
"""

from __future__ import annotations

from typing import ClassVar

from rich.style import Style
from textual.binding import Binding
from textual.strip import Strip
from textual.widgets import Log


class TextView(Log):
    BINDINGS: ClassVar = [
        Binding("down,j", "scroll_down", "down", show=False),
        Binding("up,k", "scroll_up", "up", show=False),
        Binding("pagedown,space", "page_down", "page down", show=False),
        Binding("pageup", "page_up", "page up", show=False),
        Binding("home,g", "scroll_home", "top", show=False),
        Binding("end,G", "scroll_end", "end", show=False),
    ]
    COMPONENT_CLASSES: ClassVar = {"text-view--match"}
    DEFAULT_CSS = """
    TextView {
        background: $surface;
        & > .text-view--match { background: $warning 40%; text-style: bold; }
    }
    """

    def __init__(self, empty: str = "", **kwargs) -> None:
        super().__init__(highlight=False, **kwargs)
        self.empty, self.text, self.needle = empty, None, ""
        self.match: int | None = None  # the line the last search found

    @property
    def following(self) -> bool:
        return self.is_vertical_scroll_end or self.max_scroll_y == 0

    def show(self, text: str) -> None:
        text = text or self.empty
        if text == self.text:
            return
        follow, y = self.following, self.scroll_offset.y
        self.text = text
        self.clear()
        self.write(text.rstrip("\n"), scroll_end=False)
        if follow:
            self.call_after_refresh(self.scroll_end, animate=False)
        else:
            self.call_after_refresh(self.scroll_to, y=y, animate=False)

    def find(self, needle: str, start: int | None = None, step: int = 1) -> int | None:
        """The next line from `start` (the last match, else the top line) holding
        `needle`; scrolls there and highlights it. None (and no move) if none does."""
        self.needle = needle.lower()
        lines = self.lines
        if not self.needle or not lines:
            self.match = None
            self.refresh()
            return None
        here = self.match if self.match is not None else self.scroll_offset.y - step
        here = here if start is None else start
        for k in range(1, len(lines) + 1):
            i = (here + step * k) % len(lines)
            if self.needle in lines[i].lower():
                self.match = i
                self.scroll_to(y=max(0, i - self.size.height // 3), animate=False)
                self.refresh()
                return i
        self.match = None
        self.refresh()
        return None

    def find_next(self, step: int = 1) -> int | None:
        return self.find(self.needle, step=step) if self.needle else None

    def render_line(self, y: int) -> Strip:
        strip = super().render_line(y)
        if self.match is not None and self.scroll_offset.y + y == self.match:
            style: Style = self.get_component_rich_style("text-view--match")
            strip = strip.apply_style(style)
        return strip
