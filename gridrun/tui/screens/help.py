"""`?`: every key of every screen, read from their BINDINGS."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


def key_table(screens: dict[str, list[Binding]], notes: tuple[str, ...] = ()) -> str:
    lines = []
    for name, bindings in screens.items():
        lines.append(f"[b]{name}[/]")
        for b in bindings:
            keys = b.key_display or b.key.replace(",", " / ")
            what = (b.description or b.action) + (f" ({b.tooltip})" if b.tooltip else "")
            lines.append(f"  {keys:<18} {what}".replace("[", "\\["))  # `[` is a key, not markup
        lines.append("")
    lines.extend(notes)
    lines.append("j / k move down and up in tables; the mouse works too.")
    return "\n".join(lines)


class HelpScreen(ModalScreen[None]):
    CSS_PATH = "dialogs.tcss"
    BINDINGS: ClassVar = [Binding("escape,question_mark,q", "dismiss(None)", "close")]

    def compose(self) -> ComposeResult:
        from gridrun.tui.screens.compare import CompareScreen
        from gridrun.tui.screens.detail import DetailScreen
        from gridrun.tui.screens.main import MainScreen
        from gridrun.tui.screens.overlay import OverlayScreen
        from gridrun.tui.screens.sort import CHOICES
        from gridrun.tui.widgets.columns import LEGEND
        from gridrun.tui.widgets.compare_table import CompareTable
        from gridrun.tui.widgets.runs_table import RunsTable
        from gridrun.tui.widgets.textview import TextView
        sort_keys = "  ".join(f"{key} {name.split(' (')[0]}" for key, name in CHOICES.values())
        text = key_table({"runs": [*MainScreen.BINDINGS, *RunsTable.BINDINGS],
                          "run detail": DetailScreen.BINDINGS,
                          "output and config (in the run detail)": TextView.BINDINGS,
                          "overlay": OverlayScreen.BINDINGS, "compare": [*CompareScreen.BINDINGS, *CompareTable.BINDINGS]},
                         notes=(f"[b]sort menu[/] (s, then a key): {sort_keys}", "", LEGEND, "",
                                "The view (filter, sort, grouping, marks, cursor) is kept per "
                                "root in tui-state.json and restored on open.", ""))
        with VerticalScroll(classes="dialog wide"):
            yield Static(text, id="help")
