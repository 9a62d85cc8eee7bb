"""Formatting shared by the widgets: numbers, durations, glyphs, bars.

Every value the interface shows from the store, a summary or a metrics line
goes through here, and each function accepts any type: what it cannot format
as a number (a string where a number belongs, a list, a huge integer) it shows
as text, clipped; it never raises. `rank` gives any value a sort key that
compares with every other value's.
"""

from __future__ import annotations

import math
import time
from typing import Any

from rich.text import Text

from gridrun.runs.progress import INPUT_BOUND, MEMORY_CREEP
from gridrun.tui.source import RunRow, Verdict

GLYPHS = {"queued": ("·", "dim"), "running": ("▶", "bold cyan"), "completed": ("✓", "green"),
          "failed": ("✗", "bold red"), "diverged": ("∿", "magenta"), "oom": ("!", "bold red"),
          "cancelled": ("⊘", "dim"), "interrupted": ("↺", "yellow"),
          "waiting": ("‖", "yellow"), "stopped": ("∎", "dim")}
SPARKS = "▁▂▃▄▅▆▇█"


TEXT_WIDTH = 40  # a value shown as text is clipped to this many characters


def text(v: Any, width: int = TEXT_WIDTH) -> str:
    """Any value as one line of text: '-' for None, clipped with '…'."""
    if v is None:
        return "-"
    try:
        s = v if isinstance(v, str) else repr(v) if isinstance(v, list | dict | tuple) else str(v)
    except Exception:  # a value whose str() raises: say what it is
        s = f"<{type(v).__name__}>"
    s = " ".join(s.split())
    return s if len(s) <= width else s[:width - 1] + "…"


FLAG_MARKS = {INPUT_BOUND: "io", MEMORY_CREEP: "mem↑"}


def flags(names: Any) -> str:
    """Short marks after a run's samples/s: waits for its data, memory creeping up."""
    if not isinstance(names, tuple | list):
        return ""
    return "".join(f" {FLAG_MARKS.get(n, n) if isinstance(n, str) else text(n, 8)}" for n in names)


def real(v: Any) -> float | None:
    """`v` as a float when it is a number (bool is not), else None; a huge int is ±inf."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def finite(v: Any) -> float | None:
    f = real(v)
    return f if f is not None and math.isfinite(f) else None


def whole(v: Any) -> int | None:
    """`v` as an int when it is a finite number, else None."""
    f = finite(v)
    return None if f is None else int(f)


def rank(v: Any) -> tuple:
    """A sort key for any value: numbers (by value), then text, then None; never a
    comparison between a str and an int."""
    if v is None:
        return (2, 0.0, "")
    f = real(v)
    if f is not None:
        return (0, -math.inf if math.isnan(f) else f, "")
    return (1, 0.0, text(v))


def status(s: Any) -> Text:
    glyph, style = GLYPHS.get(s, ("?", "")) if isinstance(s, str) else ("?", "")
    return Text(f"{glyph} {text(s, 20)}", style=style)


def num(v: Any, digits: int = 4) -> str:
    if v is None:
        return "-"
    f = real(v)
    if f is None:
        return text(v, 12)
    if not math.isfinite(f):
        return "nan" if math.isnan(f) else ("inf" if f > 0 else "-inf")
    if abs(f) >= 1e15:
        return f"{f:.{max(1, digits - 2)}e}"
    if abs(f) >= 1000:
        return f"{f / 1000:.{max(2, digits - 1)}g}k"
    return f"{f:.{digits}g}"


def duration(seconds: Any) -> str:
    f = finite(seconds)
    if f is None:
        return "-" if seconds is None or real(seconds) is not None else text(seconds, 12)
    if f < 0:
        return "-"
    s = int(f)
    if s < 3600:
        return f"{s // 60}:{s % 60:02d}"
    return f"{s // 3600}h{s % 3600 // 60:02d}"


def bar(fraction: float, width: int = 8) -> str:
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * filled + "░" * (width - filled)


def count(n: Any) -> str:
    """Step counts in at most 5 characters: 9999, 37.5k, 1.25M, 2G."""
    if (f := finite(n)) is None:
        return num(n)
    if f >= 999_500_000_000:
        return f"{f:.0e}"
    n = int(f)
    if n < 10_000:
        return str(n)
    if n < 999_500:  # 999,999 would round to "1e+03k"
        return f"{n / 1000:.3g}k"
    if n < 999_500_000:
        return f"{n / 1_000_000:.3g}M"
    return f"{n / 1_000_000_000:.3g}G"


PROGRESS_WIDTH = 15  # the runs table's progress column


def fraction(r: RunRow) -> float | None:
    """How far a run is (0..1), from its steps, else its epochs; None when not known."""
    step, total = finite(r.step) or 0.0, finite(r.total_steps)
    if total:
        return step / total
    epoch, epochs = finite(r.epoch) or 0.0, finite(r.epochs)
    return epoch / epochs if epochs else None


def rung(r: RunRow) -> str:
    """`r1 e3/9`: a search's trial at its rung (0 first), its epochs of its budget."""
    if not r.rungs:
        return ""
    epoch = int(finite(r.epoch) or 0)
    reached = sum(1 for e in r.rungs if e <= epoch)
    return f"r{max(reached - 1, 0)} e{epoch}/{r.rungs[-1]}"


def progress(r: RunRow) -> str:
    if r.rungs:  # the budget a trial has used, and its rung
        label = rung(r)
        return f"{bar(fraction(r) or 0.0, min(8, PROGRESS_WIDTH - 1 - len(label)))} {label}"
    if finite(r.total_steps):
        label = f"{count(r.step)}/{count(r.total_steps)}"
        return f"{bar(fraction(r) or 0.0, min(8, PROGRESS_WIDTH - 1 - len(label)))} {label}"
    if finite(r.epochs) and r.status == "running":  # a run from before the "start" line
        return f"{bar(fraction(r) or 0.0)} e{count(r.epoch)}/{count(r.epochs)}"
    if r.status == "running" or r.step:
        return f"e{count(r.epoch)} s{count(r.step)}"
    return ""


def slot(r: RunRow) -> str:
    """Where a run runs: its slot as the store keeps it ("gpu1"). A run on several
    devices leads with how many slots it holds at once: "2× gpu0+gpu1" while it runs
    (the members, as the store joins them), "2×" before and after."""
    name, n = text(r.slot or ""), whole(r.devices) or 1
    return name if n <= 1 else f"{n}×" + (f" {name}" if name else "")


def elapsed(r: RunRow, now: float) -> float | None:
    started = finite(r.started_at)
    if started is None:
        return None
    return (finite(r.ended_at) or now) - started


def eta(r: RunRow, now: float) -> float | None:
    if r.status != "running":
        return None
    if (ends := finite(r.ends_at)) is not None:  # the run's own pace (progress.fold)
        return max(0.0, ends - now)
    done = fraction(r) or 0.0
    if done <= 0:
        return None
    return (elapsed(r, now) or 0.0) * (1 - done) / done


def sparkline(values: tuple[float, ...] | list[float], width: int, top: float = 100.0) -> str:
    values = [finite(v) or 0.0 for v in list(values)[-width:]]
    return "".join(SPARKS[min(7, int(max(0.0, v) / top * 7.999))] for v in values)


def size(b: Any) -> str:
    f = finite(b)
    if f is None:
        return "n/a" if b is None else text(b, 12)
    return f"{f / 2**30:.1f}G"


def verdict(v: Verdict) -> Text:
    """'verify: bitwise identical over 186 steps (2026-12-03 15:40)', green, or red when it differs."""
    when = f" ({time.strftime('%Y-%m-%d %H:%M', time.localtime(v.when))})" if v.when else ""
    return Text(f"verify: {v.text}{when}", style="green" if v.ok else "bold red")
