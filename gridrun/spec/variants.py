"""A run's variant label (`hidden=32 lr=0.003`, `sgd`) shortened to fit a width.

Views that list runs side by side (the interface's variant column, `gridrun
run`'s progress lines) must still tell the rows apart when the room is short:
cutting `hidden=32 lr=0.003` to `hidden=32 l…` makes two learning rates look
the same. So a label is shortened from the middle, never losing a value:

1. `key=value` pairs that every row shares are dropped (`Variants.shared`);
2. the keys are cut to their first three letters, then two, then one, never
   shorter than what keeps them apart (`hid=32 lr=0.003`, `h=32 lr=0.003`);
3. then the keys go (`32 0.003`);
4. only then is the label cut at its end, with `…`.

Pure string functions; no imports from the rest of gridrun.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


def pairs(label: str) -> list[tuple[str | None, str]]:
    """`hidden=32 sgd` -> [("hidden", "32"), (None, "sgd")]."""
    out: list[tuple[str | None, str]] = []
    for word in label.split():
        key, eq, value = word.partition("=")
        out.append((key, value) if eq and key else (None, word))
    return out


def _join(items: list[tuple[str | None, str]], keep: int | None) -> str:
    """The pairs with each key cut to `keep` characters (None: whole; 0: no key)."""
    words = []
    for key, value in items:
        if key is None or keep == 0:
            words.append(value)
        else:
            words.append(f"{key[:keep] if keep else key}={value}")
    return " ".join(words)


def _distinct_prefix(keys: list[str]) -> int:
    """The shortest prefix length that keeps `keys` apart (1 for one key)."""
    unique = set(keys)
    for n in range(1, max(map(len, unique), default=1) + 1):
        if len({k[:n] for k in unique}) == len(unique):
            return n
    return max(map(len, unique), default=1)


def forms(label: str, drop: frozenset[str] = frozenset()) -> list[str]:
    """`label` from whole to shortest without losing a value: the words in `drop`
    left out, then the keys cut to ever shorter prefixes (never so short that two
    keys look alike), then without keys."""
    items = [(k, v) for k, v in pairs(label) if k is None or f"{k}={v}" not in drop]
    out = [_join(items, None)]
    keys = [k for k, _ in items if k is not None]
    if keys:
        out += [_form(items, keep) for keep in KEEPS]
    return list(dict.fromkeys(out))


KEEPS = (3, 2, 1, 0)  # the keys' prefixes tried after the whole keys (0: no keys)


def form(label: str, keep: int | None, drop: frozenset[str] = frozenset()) -> str:
    """One of `forms(label, drop)`: keys whole (`keep` None), cut to `keep`
    characters (never below what keeps them apart), or left out (0)."""
    return _form([(k, v) for k, v in pairs(label) if k is None or f"{k}={v}" not in drop], keep)


def _form(items: list[tuple[str | None, str]], keep: int | None) -> str:
    if keep:
        keys = [k for k, _ in items if k is not None]
        keep = max(keep, _distinct_prefix(keys)) if keys else keep
    return _join(items, keep)


def cut(text: str, width: int) -> str:
    """The last resort: `text` cut at its end, with `…`."""
    if len(text) <= width:
        return text
    return text[:width - 1] + "…" if width > 1 else text[:width]


def shorten(label: str, width: int, drop: frozenset[str] = frozenset()) -> str:
    """`label` in at most `width` cells (see the module's docstring); `drop` are
    the `key=value` words to leave out (what every row shares)."""
    candidates = forms(label, drop)
    return next((f for f in candidates if len(f) <= width), cut(candidates[-1], width))


@dataclass(frozen=True)
class Variants:
    """What the labels of the rows on show have in common."""

    shared: frozenset[str] = frozenset()  # `key=value` words every labelled row has

    @classmethod
    def of(cls, labels: Iterable[str]) -> Variants:
        """From the rows' labels: a `key=value` word is shared when every row
        whose label has that key has this value and there are two rows or more
        (one row shows its whole label: there is nothing to tell it from)."""
        values: dict[str, set[str]] = {}
        seen: dict[str, int] = {}
        rows = 0
        for label in labels:
            rows += 1
            for key, value in pairs(label):
                if key is not None:
                    values.setdefault(key, set()).add(value)
                    seen[key] = seen.get(key, 0) + 1
        if rows < 2:
            return cls()
        return cls(frozenset(f"{k}={next(iter(v))}" for k, v in values.items()
                             if len(v) == 1 and seen[k] == rows))

    def shorten(self, label: str, width: int) -> str:
        return shorten(label, width, self.shared)

    def forms(self, label: str) -> list[str]:
        return forms(label, self.shared)

    def levels(self, labels: Iterable[str]) -> list[tuple[int | None, int]]:
        """(keep, the widest of `labels` in that form) from whole to keyless: a
        column takes the first that fits, so its rows share one form."""
        parsed = [[(k, v) for k, v in pairs(label) if k is None or f"{k}={v}" not in self.shared]
                  for label in dict.fromkeys(labels)]
        keyed = any(k for items in parsed for k, _ in items)
        keeps: list[int | None] = [None, *KEEPS] if keyed else [None]
        return [(keep, max((len(_form(items, keep)) for items in parsed), default=0))
                for keep in keeps]

    def longest(self, labels: Iterable[str]) -> int:
        """The width the widest label needs whole (shared words left out)."""
        return max((len(shorten(label, 10**6, self.shared)) for label in labels), default=0)
