"""A run's summary as a table people read: times as dates and durations, bytes
as MiB/GiB, rates with their units, metric dicts as `name value` pairs. Any
value of an unexpected type is shown as text (fmt.text), never raised on."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.text import Text

from gridrun.tui.widgets import fmt

HIDDEN = ("traceback",)  # shown above the table, in full
UNITS = {"samples_per_s": "samples/s", "tokens_per_s": "tokens/s"}
ARROWS = {"higher": "↑", "lower": "↓"}


def when(v: Any) -> str:
    t = fmt.finite(v)
    if t is None or t <= 0:
        return fmt.text(v)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def span(v: Any) -> str:
    s = fmt.finite(v)
    if s is None or s < 0:
        return fmt.text(v)
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(round(s), 60)
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


def nbytes(v: Any) -> str:
    b = fmt.finite(v)
    if b is None:
        return fmt.text(v)
    if b >= 2**30:
        return f"{b / 2**30:.2f} GiB"
    return f"{b / 2**20:.1f} MiB"


def pairs(v: Any, depth: int = 0) -> str:
    """`name value` pairs; an object inside (environment's determinism) in braces."""
    if not isinstance(v, Mapping):
        return fmt.text(v)

    def one(x: Any) -> str:
        if isinstance(x, str):
            return ARROWS.get(x) or fmt.text(x, 60)
        if type(x) is int:
            return f"{x:,}"  # a count (parameters): exact
        if isinstance(x, Mapping) and depth < 2:
            return "{" + pairs(x, depth + 1) + "}"
        return fmt.num(x) if fmt.real(x) is not None or x is None else fmt.text(x, 60)
    return "  ".join(f"{fmt.text(k, 24)} {one(x)}" for k, x in v.items())


def value(key: str, v: Any) -> str:
    if key.endswith("_at"):
        return when(v)
    if key.endswith("_bytes"):
        return nbytes(v)
    if key in UNITS:
        rate = fmt.finite(v)
        if rate is None:
            return fmt.text(v)
        return f"{rate:,.0f} {UNITS[key]}" if rate >= 100 else f"{fmt.num(rate)} {UNITS[key]}"
    if key.endswith("_s") or key.endswith("_seconds"):
        return span(v)
    if isinstance(v, Mapping):
        return pairs(v)
    if isinstance(v, list | tuple):
        return "\n".join(fmt.text(x, 200) for x in v)
    if isinstance(v, float):
        return fmt.num(v, 6)
    return fmt.text(v, 200)


NAMES = {"samples_per_s": "throughput", "tokens_per_s": "tokens"}


def name(key: str) -> str:
    """The field's name without the unit its value now shows: `peak memory`, `wall time`."""
    if key in NAMES:
        return NAMES[key]
    for suffix in ("_bytes", "_s"):
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    return fmt.text(key.replace("_", " "))


def rows(summary: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(name, shown value) for each field the run set (None, [] and {} say nothing)."""
    out = []
    for key, v in (summary or {}).items():
        if key in HIDDEN or v is None or v == "" or (isinstance(v, list | tuple | dict) and not v):
            continue
        out.append((name(str(key)), value(str(key), v)))
    return out


def table(summary: Mapping[str, Any] | None) -> Text:
    """Two aligned columns: the field's name (bold) and its value (wrapped lines indented)."""
    shown = rows(summary)
    if not shown:
        return Text("(no summary yet: it is written when the run ends)", style="dim")
    width = max(len(name) for name, _ in shown)
    out = Text()
    for name, shown_value in shown:
        lines = shown_value.split("\n")
        out.append(f"{name:<{width}}  ", style="bold")
        out.append(lines[0] + "\n")
        for more in lines[1:]:
            out.append(" " * (width + 2) + more + "\n")
    out.rstrip()
    return out
