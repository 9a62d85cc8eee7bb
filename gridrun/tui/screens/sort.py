"""`s`: a small menu of the columns to sort by, each with its own key (`s` then `l`
sorts by train loss); enter takes the highlighted one, esc leaves the order alone."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

# column -> (its key in the menu, what the menu calls it); None is the queue's own order
CHOICES: dict[str | None, tuple[str, str]] = {
    None: ("q", "queue order (priority, then first queued)"),
    "status": ("s", "status"), "id": ("i", "id"), "experiment": ("e", "experiment"),
    "variant": ("v", "variant"), "seed": ("d", "seed"), "progress": ("p", "progress"),
    "loss": ("l", "train loss"), "best": ("b", "best validation value"),
    "samples/s": ("m", "samples/s"), "slot": ("o", "slot"), "elapsed": ("t", "elapsed time"),
    "eta": ("a", "eta"), "prio": ("r", "priority"),
}


class SortMenu(ModalScreen[str | None | bool]):
    """Dismissed with the column (None: queue order), or False when left alone."""

    CSS_PATH = "dialogs.tcss"
    BINDINGS: ClassVar = [Binding("escape", "dismiss(False)", "cancel")]

    def __init__(self, columns: tuple[str, ...], current: str | None) -> None:
        super().__init__()
        self.columns = [c for c in (None, *columns) if c in CHOICES]
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog menu"):
            yield Label("sort by (its key, or enter; S reverses)")
            options = []
            for column in self.columns:
                key, name = CHOICES[column]
                mark = " ▲" if column == self.current and column else ""
                options.append(Option(Text.assemble((f" {key} ", "bold"), f" {name}{mark}"),
                                      id=column or "-"))
            menu = OptionList(*options, id="sort-menu")
            menu.highlighted = self.columns.index(self.current) if self.current in self.columns else 0
            yield menu

    @on(OptionList.OptionSelected)
    def chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(None if event.option.id == "-" else event.option.id)

    def on_key(self, event: events.Key) -> None:
        for column in self.columns:
            if CHOICES[column][0] == event.character:
                event.stop()
                self.dismiss(column)
                return


class ChoiceMenu(ModalScreen[str | None]):
    """A short list to pick one from (the overlay's metrics): enter picks, esc leaves it."""

    CSS_PATH = "dialogs.tcss"
    BINDINGS: ClassVar = [Binding("escape", "dismiss(None)", "cancel")]

    def __init__(self, title: str, choices: list[str], current: str | None = None) -> None:
        super().__init__()
        self.heading, self.choices, self.current = title, choices, current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog menu"):
            yield Label(self.heading)
            menu = OptionList(*(Option(c, id=str(i)) for i, c in enumerate(self.choices)),
                              id="choice-menu")
            menu.highlighted = self.choices.index(self.current) if self.current in self.choices else 0
            yield menu

    @on(OptionList.OptionSelected)
    def chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.choices[int(event.option.id)])
