"""GPU memory as the interface reads it: the engine's memory book (its store state MEMORY:
engine/packing.py's STATE, which `engine status` prints) per GPU, why the queue waits for
memory, and a run's budget against what it measured.

The values come from the store, which any process may have written: what does not have
the expected shape is left out, never an error. The engine is not imported (nor torch):
the state's name is repeated here, as store_source.FOREIGN is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gridrun.tui.source import GpuMemory, MemoryWait, RunMemory

MEMORY = "gpu_memory"  # the engine's store state: {"mode", "gpus", "waits", "ledger"}


def _number(v: Any) -> float | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return v if ok else None


def _bytes(v: Any) -> float | None:
    """A byte count, or None for anything else (a bool, NaN, a negative number)."""
    n = _number(v)
    return n if n is not None and n >= 0 else None


@dataclass(frozen=True)
class Book:
    """The memory book as the machine panel shows it."""

    # GPU -> memory, by the book's key (an index here, a UUID on Ray) and its name ("node2:gpu0")
    gpus: Mapping[Any, GpuMemory] = field(default_factory=dict)
    wait: MemoryWait | None = None
    ledger: str = ""  # why this engine does not coordinate with other engines


def book(state: Any) -> Book:
    """The book from the engine's MEMORY state (an empty Book for None or garbage).

    Runs packed by memory (`runs_per_gpu = "auto"`) show every GPU's memory; under an
    integer runs_per_gpu the slots say where runs go, so a GPU's memory shows only where
    other engines commit some (what keeps a free slot empty). A GPU is found by its key
    and, where the book gives one, its name ("node2:gpu0": tui/gpus.py looks it up)."""
    if not isinstance(state, dict):
        return Book()
    auto = state.get("mode") == "auto"
    gpus = {}
    for g in state.get("gpus") if isinstance(state.get("gpus"), list) else ():
        if not isinstance(g, dict) or not isinstance(g.get("gpu"), int | str) or \
                isinstance(g.get("gpu"), bool):  # True would read as GPU 1
            continue
        free = _number(g.get("free"))  # below 0 when more is committed than there is
        memory = GpuMemory(ours=_bytes(g.get("ours")), runs=int(_bytes(g.get("runs")) or 0),
                           engines=_bytes(g.get("others")), others=_bytes(g.get("foreign")),
                           free=None if free is None else max(0, free))
        if auto or memory.engines:
            gpus[g["gpu"]] = memory
            if isinstance(g.get("name"), str) and g["name"]:
                gpus[g["name"]] = memory
    ledger = state.get("ledger")
    return Book(gpus, _wait(state.get("waits")), ledger if isinstance(ledger, str) else "")


def _wait(w: Any) -> MemoryWait | None:
    if not isinstance(w, dict):
        return None
    run_id = w.get("run_id") if isinstance(w.get("run_id"), str) else "?"
    if isinstance(w.get("busy"), str):
        return MemoryWait(run_id, busy=w["busy"])
    return MemoryWait(run_id, need=_bytes(w.get("need")), free=_bytes(w.get("free")),
                      engines=_bytes(w.get("others")))


def run_memory(placement: Any, adjustments: Iterable[Any], summary: Any) -> RunMemory | None:
    """A run's budget (enforced: its placement's, else its summary's), its measured peak
    (CUDA's reserved peak when there is one), what it needed when it outgrew its budget
    and the budget a retry gave it; None when neither a budget nor a peak is known."""
    p = placement if isinstance(placement, Mapping) else {}
    s = summary if isinstance(summary, Mapping) else {}

    def first(*values: Any) -> float | None:
        return next((v for v in map(_bytes, values) if v), None)  # 0 is "not measured"

    budget = first(p.get("budget_bytes"), s.get("memory_budget_bytes"))
    peak = first(s.get("peak_reserved_bytes"), s.get("peak_memory_bytes"))
    if budget is None and peak is None:
        return None
    retried = [b[1] for a in adjustments if isinstance(a, Mapping) and a.get("kind") == "budget"
               and isinstance(b := a.get("budget_bytes"), list | tuple) and len(b) == 2
               and first(b[1])]
    return RunMemory(budget, peak, first(s.get("memory_needed_bytes")),
                     max(retried) if retried else None)
