"""Problems found in an experiment file, and where they are.

tomllib gives values, not positions, so `LineIndex` scans the raw text for
table headers and `key =` lines: enough to point at the line a person edits.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gridrun.engine.spec import Key


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
        return text


class SpecError(Exception):
    """Every problem of an experiment file at once."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def nearest(name: str, candidates: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


_HEADER = re.compile(r"^\s*\[(?!\[)\s*([^\]]+?)\s*\]")
_KEY = re.compile(r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""")


def _split_dotted(text: str) -> tuple[str, ...]:
    parts = re.findall(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""", text)
    return tuple(p.strip("\"'") for p in parts)


class LineIndex:
    """Lines of table headers and keys in a TOML text, by full dotted path."""

    def __init__(self, text: str):
        self.lines: dict[tuple[str, ...], int] = {}
        table: tuple[str, ...] = ()
        for number, raw in enumerate(text.splitlines(), start=1):
            header = _HEADER.match(raw)
            if header:
                table = _split_dotted(header.group(1))
                self.lines.setdefault(table, number)
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


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and not isinstance(v, bool)


def _range_text(key: Key) -> str:
    bits = []
    if key.min is not None:
        bits.append(f">= {key.min:g}")
    if key.above is not None:
        bits.append(f"> {key.above:g}")
    if key.max is not None:
        bits.append(f"<= {key.max:g}")
    if key.below is not None:
        bits.append(f"< {key.below:g}")
    return " and ".join(bits)


def _in_range(key: Key, v: float) -> bool:
    return ((key.min is None or v >= key.min) and (key.above is None or v > key.above)
            and (key.max is None or v <= key.max) and (key.below is None or v < key.below))


def check_trainer_value(key: Key, value: Any) -> tuple[Any, str | None]:
    """(the value coerced to the key's type, None) or (None, what was expected)."""
    got = f"got {value!r}" if not isinstance(value, dict | list) else f"got {toml_type(value)}"
    if key.choices:
        if isinstance(value, str) and value in key.choices:
            return value, None
        choices = " | ".join(f'"{c}"' for c in key.choices)
        suggestion = nearest(value, key.choices) if isinstance(value, str) else None
        hint = f" (did you mean {suggestion!r}?)" if suggestion else ""
        return None, f"expected one of {choices}, {got}{hint}"
    if key.type == "integer":
        if not _is_int(value):
            return None, f"expected an integer {_range_text(key)}, {got}".replace("  ", " ")
        if not _in_range(key, value):
            return None, f"expected an integer {_range_text(key)}, {got}"
        return value, None
    if key.type == "float":
        if not _is_number(value) or not math.isfinite(value):
            return None, f"expected a finite float {_range_text(key)}, {got}".replace("  ", " ")
        if not _in_range(key, value):
            return None, f"expected a float {_range_text(key)}, {got}"
        return float(value), None
    if key.type == "float or integer":  # warmup: a fraction of all steps, or a step count
        if _is_int(value):
            return (value, None) if value >= 0 else (None, f"expected a step count >= 0, {got}")
        if isinstance(value, float) and math.isfinite(value):
            if 0 <= value < 1:
                return value, None
            return None, f"expected a fraction in [0, 1) or an integer step count, {got}"
        return None, f"expected a float in [0, 1) or an integer step count, {got}"
    if key.type == "boolean":
        return (value, None) if isinstance(value, bool) else (None, f"expected a boolean (true or false), {got}")
    if key.type == "string":
        return (value, None) if isinstance(value, str) else (None, f"expected a string, {got}")
    if key.type == 'boolean or "auto"':
        if isinstance(value, bool) or value == "auto":
            return value, None
        return None, f'expected a boolean or "auto", {got}'
    if key.type == "array of 2 floats":
        if (isinstance(value, list) and len(value) == 2 and all(_is_number(b) for b in value)
                and all(0 <= b < 1 for b in value)):
            return [float(b) for b in value], None
        return None, f"expected an array of 2 floats, each in [0, 1), {got}"
    raise AssertionError(f"unhandled key type {key.type}")


def check_task_value(name: str, default: Any, value: Any) -> tuple[Any, str | None]:
    """Task keys are checked against the type of the factory's default, when it has one."""
    got = f"got {value!r}" if not isinstance(value, dict) else "got a table"
    if default is None or default is _NO_DEFAULT:
        return value, None
    if isinstance(default, bool):
        ok = isinstance(value, bool)
        expected = "a boolean"
    elif _is_int(default):
        ok = _is_int(value)
        expected = "an integer"
    elif isinstance(default, float):
        if _is_number(value):
            return float(value), None
        ok, expected = False, "a float"
    elif isinstance(default, str):
        ok, expected = isinstance(value, str), "a string"
    else:
        return value, None
    if ok:
        return value, None
    return None, f"expected {expected} (the task's default is {default!r}), {got}"


class _NoDefault:
    def __repr__(self) -> str:
        return "<required>"


_NO_DEFAULT = _NoDefault()
NO_DEFAULT = _NO_DEFAULT
