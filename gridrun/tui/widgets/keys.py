"""The key bar: the screen's keys that fit the width, the most useful first.

One line rendered by one widget (Textual's Footer mounts a widget per key and
rebuilds them all whenever a key greys out, which a cursor move often does).
Keys that don't apply are dim; `?` lists every key. When the keys a screen
must show do not fit with their descriptions, the bar takes their short ones
(`⏎ open` for `⏎ detail`)."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.widget import Widget


class KeyBar(Widget):
    """The screen's shown bindings: `first` names the actions kept when the width
    runs out (most useful first; the rest follow in binding order)."""

    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        height: 1;
        background: $footer-background;
        color: $footer-foreground;
        & > .key-bar--key { color: $footer-key-foreground; background: $footer-key-background;
                            text-style: bold; }
        & > .key-bar--description { color: $footer-description-foreground;
                                    background: $footer-description-background; }
    }
    """
    COMPONENT_CLASSES = frozenset({"key-bar--key", "key-bar--description"})

    def __init__(self, first: tuple[str, ...] = (), *, must: int = 0,
                 short: dict[str, str] | None = None, **kwargs) -> None:
        """`first`: actions by usefulness; the first `must` of them always show, with
        their `short` descriptions (action -> text) if the long ones do not fit."""
        super().__init__(**kwargs)
        self.first, self.must, self.short = first, must, short or {}
        self.keys: tuple[tuple[Binding, str, bool], ...] = ()  # (binding, key shown, enabled)
        self.spans: list[tuple[int, int, Binding, bool]] = []  # what the last render put where
        self.changes = 0  # how often what it shows changed (tests read it)

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self.bindings_changed)
        self.bindings_changed(self.screen)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def bindings_changed(self, screen) -> None:
        seen, keys = set(), []
        for _node, binding, enabled, _tooltip in screen.active_bindings.values():
            if binding.show and binding.action not in seen:  # one key an action, like Footer
                seen.add(binding.action)
                keys.append((binding, self.app.get_key_display(binding), enabled))
        if tuple(keys) != self.keys:
            self.keys = tuple(keys)
            self.changes += 1
            self.refresh()

    def enabled(self, action: str) -> bool | None:
        """Whether the key for `action` is shown enabled (None: not on the bar)."""
        return next((on for b, _, on in self.keys if b.action == action), None)

    def fitting(self, width: int) -> list[tuple[Binding, str, bool, str]]:
        """(binding, key shown, enabled, description) of the keys that fit."""
        kept = self._fit(width, short=False)
        shown = {b.action for b, *_ in kept}
        if all(a in shown for a in self.first[:self.must] if self.enabled(a) is not None):
            return kept
        return self._fit(width, short=True)

    def _fit(self, width: int, short: bool) -> list[tuple[Binding, str, bool, str]]:
        rank = {action: i for i, action in enumerate(self.first)}
        keep, used = {}, 0
        order = sorted(range(len(self.keys)),
                       key=lambda i: (rank.get(self.keys[i][0].action, len(rank)), i))
        for i in order:
            binding, key, _ = self.keys[i]
            text = self.short.get(binding.action, binding.description) if short else binding.description
            w = len(key) + len(text) + 3  # " key description "
            if used + w <= width:
                keep[i] = text
                used += w
        return [(*k, keep[i]) for i, k in enumerate(self.keys) if i in keep]

    def render(self) -> Text:
        key_style = self.get_component_rich_style("key-bar--key")
        text_style = self.get_component_rich_style("key-bar--description")
        dim = Style(dim=True)
        text, self.spans = Text(no_wrap=True, overflow="crop"), []
        for binding, key, enabled, description in self.fitting(self.size.width):
            start = text.cell_len
            text.append(f" {key} ", key_style if enabled else key_style + dim)
            text.append(f"{description} ", text_style if enabled else text_style + dim)
            self.spans.append((start, text.cell_len, binding, enabled))
        return text

    def on_resize(self) -> None:
        self.refresh()

    def on_click(self, event: events.Click) -> None:
        for start, end, binding, enabled in self.spans:
            if start <= event.x < end:
                if enabled:
                    self.app.simulate_key(binding.key.split(",")[0])
                else:
                    self.app.bell()
