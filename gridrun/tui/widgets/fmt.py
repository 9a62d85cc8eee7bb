"""Formatting shared by the widgets: numbers, durations, glyphs, bars."""

from __future__ import annotations

import time

from rich.text import Text

from gridrun.engine.progress import INPUT_BOUND, MEMORY_CREEP
from gridrun.tui.source import RunRow, Verdict

GLYPHS = {"queued": ("·", "dim"), "running": ("▶", "bold cyan"), "completed": ("✓", "green"),
          "failed": ("✗", "bold red"), "diverged": ("∿", "magenta"), "oom": ("!", "bold red"),
          "cancelled": ("⊘", "dim"), "interrupted": ("↺", "yellow")}
SPARKS = "▁▂▃▄▅▆▇█"


def status(s: str) -> Text:
    glyph, style = GLYPHS.get(s, ("?", ""))
    return Text(f"{glyph} {s}", style=style)


def num(v: float | None, digits: int = 4) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v / 1000:.{max(2, digits - 1)}g}k"
    return f"{v:.{digits}g}"


FLAG_MARKS = {INPUT_BOUND: "io", MEMORY_CREEP: "mem↑"}


def flags(names: tuple[str, ...]) -> str:
    """Short marks after a run's samples/s: waits for its data, memory creeping up."""
    return "".join(f" {FLAG_MARKS.get(n, n)}" for n in names)


def duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "-"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}:{s % 60:02d}"
    return f"{s // 3600}h{s % 3600 // 60:02d}"


def bar(fraction: float, width: int = 8) -> str:
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * filled + "░" * (width - filled)


def count(n: int) -> str:
    """Step counts in at most 5 characters: 9999, 37.5k, 1.25M, 2G."""
    if n < 10_000:
        return str(n)
    if n < 999_500:  # 999,999 would round to "1e+03k"
        return f"{n / 1000:.3g}k"
    if n < 999_500_000:
        return f"{n / 1_000_000:.3g}M"
    return f"{n / 1_000_000_000:.3g}G"


PROGRESS_WIDTH = 18  # the runs table's progress column


def progress(r: RunRow) -> str:
    if r.total_steps:
        text = f"{count(r.step)}/{count(r.total_steps)}"
        return f"{bar(r.step / r.total_steps, min(8, PROGRESS_WIDTH - 1 - len(text)))} {text}"
    if r.epochs and r.status == "running":  # a run from before the "start" line
        return f"{bar(r.epoch / r.epochs)} e{r.epoch}/{r.epochs}"
    if r.status == "running" or r.step:
        return f"e{r.epoch} s{r.step}"
    return ""


def elapsed(r: RunRow, now: float) -> float | None:
    if r.started_at is None:
        return None
    return (r.ended_at or now) - r.started_at


def eta(r: RunRow, now: float) -> float | None:
    if r.status != "running":
        return None
    if r.ends_at is not None:  # the run's own pace (progress.fold)
        return max(0.0, r.ends_at - now)
    done = r.step / r.total_steps if r.total_steps else (r.epoch / r.epochs if r.epochs else 0)
    if done <= 0:
        return None
    return (elapsed(r, now) or 0.0) * (1 - done) / done


def sparkline(values: tuple[float, ...] | list[float], width: int, top: float = 100.0) -> str:
    values = list(values)[-width:]
    return "".join(SPARKS[min(7, int(max(0.0, v) / top * 7.999))] for v in values)


def size(b: float | None) -> str:
    if b is None:
        return "n/a"
    return f"{b / 2**30:.1f}G"


def verdict(v: Verdict) -> Text:
    """'verify: bitwise identical over 186 steps (2026-12-03 15:40)', green, or red when it differs."""
    when = f" ({time.strftime('%Y-%m-%d %H:%M', time.localtime(v.when))})" if v.when else ""
    return Text(f"verify: {v.text}{when}", style="green" if v.ok else "bold red")
