"""Problems found in an experiment file, and where they are.

tomllib gives values, not positions, so `LineIndex` scans the raw text for
table headers and `key =` lines: enough to point at the line a person edits.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


def _escape(ch: str) -> str:
    n = ord(ch)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def printable(text: str) -> str:
    """`text` with control and format characters escaped (\\x1b, \\u202e): a name or a key
    from a file never moves the cursor, recolours the terminal or reverses a line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == "\n" else _escape(ch) for ch in text)


@dataclass(frozen=True)
class Problem:
    file: str
    message: str
    line: int | None = None
    column: int | None = None
    experiment: str | None = None
    key: str | None = None
    suggestion: str | None = None

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        parts = [where + ":"]
        if self.experiment is not None:
            name = self.experiment
            if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                name = f'"{name}"'  # as TOML would need it quoted
            parts.append(f"[experiments.{name}]")
        if self.key is not None:
            parts.append(f"{self.key}:")
        parts.append(self.message)
        text = " ".join(parts)
        if self.suggestion:
            text += f" (did you mean {self.suggestion!r}?)"
        return printable(text)


class SpecError(Exception):
    """Every problem of an experiment file at once."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def nearest(name: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=cutoff)
    return found[0] if found else None


COUNT_WORDS = frozenset({"n", "num", "number", "nb", "of"})  # n_layers, num_layers: layers
WORD_SYNONYMS = {"layer": "depth"}  # a model's depth is its number of layers


def key_words(name: str) -> frozenset[str]:
    """What a key names, as words: its `_`/`-`/`.` tokens lower-cased, singular, without
    count words, synonyms made one (`n_layers`, `num_layer`, `layers` and `depth` alike)."""
    words = set()
    for token in re.split(r"[_\-.\s]+", name.lower()):
        if not token or token in COUNT_WORDS:
            continue
        if len(token) > 3 and token.endswith("s") and not token.endswith("ss"):
            token = token[:-1]
        words.add(WORD_SYNONYMS.get(token, token))
    return frozenset(words)


def nearest_key(name: str, known: Iterable[str]) -> str | None:
    """The one key `name` most likely means, or None rather than a poor guess: the key
    naming the same words (`n_layers`: layers, or depth), else the one key whose words
    `name` holds with more (`hidden_size`: hidden, `dropout_rate`: dropout), else a close
    spelling (difflib at 0.75: `lrr`: lr; not `n_layers`: dropout_layers, at 0.64)."""
    known = [k for k in known if k != name]
    words = key_words(name)
    same = [k for k in known if words and key_words(k) == words]
    if same:
        return same[0] if len(same) == 1 else None  # two as likely: no guess
    inside = [k for k in known if key_words(k) and key_words(k) < words]
    if len(inside) == 1:
        return inside[0]
    return nearest(name, known, cutoff=0.75)


def suggest_metric(name: str, metrics: Iterable[str]) -> str | None:
    """The metric a key's value most likely meant: the same name in another case, the
    one metric it abbreviates (`acc`: accuracy, `ppl`: perplexity), else the nearest
    spelling."""
    metrics = [m for m in metrics if isinstance(m, str)]
    folded = name.strip().lower()
    same = [m for m in metrics if m.lower() == folded]
    if same:
        return same[0]
    starts = [m for m in metrics if folded and m.lower().startswith(folded)]
    if len(starts) == 1:
        return starts[0]
    letters = [m for m in metrics if len(folded) >= 2 and _abbreviates(folded, m.lower())]
    if len(letters) == 1:
        return letters[0]
    return nearest(name, metrics)


def _abbreviates(short: str, long: str) -> bool:
    """Whether `short` is `long` with letters left out, starting with its first (ppl)."""
    if not long.startswith(short[0]):
        return False
    rest = iter(long)
    return all(ch in rest for ch in short)


_HEADER = re.compile(r"^\s*\[(?!\[)\s*([^\]]+?)\s*\]")
_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_KEY = re.compile(rf"""^\s*({_PART}(?:\s*\.\s*{_PART})*)\s*=""")


def _unquote(part: str) -> str:
    """A key as TOML reads it: a basic string's escapes (\\u202e) decoded."""
    if part.startswith('"') and "\\" in part:
        try:
            return str(tomllib.loads(f"k = {part}")["k"])
        except (tomllib.TOMLDecodeError, KeyError):
            pass
    return part[1:-1] if part[:1] in "\"'" and len(part) >= 2 else part


def _split_dotted(text: str) -> tuple[str, ...]:
    parts = re.findall(r"""[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*'""", text)
    return tuple(_unquote(p) for p in parts)


class LineIndex:
    """Lines of table headers and keys in a TOML text, by full dotted path."""

    def __init__(self, text: str):
        self.lines: dict[tuple[str, ...], int] = {}
        table: tuple[str, ...] = ()
        for number, raw in enumerate(text.splitlines(), start=1):
            header = _HEADER.match(raw)
            if header:
                table = _split_dotted(header.group(1))
                # a table written only through its subtables ([experiment.tricks]) is at
                # its first one: a problem with the table itself still gets a line
                for i in range(1, len(table) + 1):
                    self.lines.setdefault(table[:i], number)
                continue
            key = _KEY.match(raw)
            if key:
                path = table + _split_dotted(key.group(1))
                for i in range(len(table) + 1, len(path) + 1):
                    self.lines.setdefault(path[:i], number)

    def find(self, *path: str) -> int | None:
        """The line of `path`, or of its nearest enclosing key or table."""
        for i in range(len(path), 0, -1):
            if path[:i] in self.lines:
                return self.lines[path[:i]]
        return None


_TOML_TYPE = {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
              list: "an array", dict: "a table"}


def toml_type(value: Any) -> str:
    return _TOML_TYPE.get(type(value), type(value).__name__)
