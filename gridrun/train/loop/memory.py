"""A run's memory budget: the engine's share of a GPU it packs several runs on.

The engine passes the budget (bytes, for the whole process's GPU memory, the CUDA
context included) in `GRIDRUN_MEMORY_BUDGET`; the run enforces it itself, so a run
that outgrows it fails alone, with one line, and never its neighbours. On CUDA the
caching allocator is capped (`set_per_process_memory_fraction`) before the model
is on the device, and an out-of-memory that cap caused is told from a full GPU by
what it asked for; on the CPU (GPUs declared stand-ins, as in tests) the process's
resident memory is checked at each log point. A budget never changes what is
computed: only where tensors live, and whether the run may go on.

No torch at import: the engine imports `CONTEXT` to size its budgets.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

ENV = "GRIDRUN_MEMORY_BUDGET"
CONTEXT = 512 << 20  # what the CUDA context takes beside the caching allocator
GIB = 1 << 30
CAUSED = 0.98  # an OOM asking for at least this share of the budget was the budget's doing

# "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of ..."
_TRIED = re.compile(r"Tried to allocate (\d+(?:\.\d+)?) ?(bytes|B|KiB|MiB|GiB|TiB)\b")
_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def budget_from_env(environ: Mapping[str, str] = os.environ) -> int | None:
    """The budget in bytes the engine set, or None (absent, empty, not a positive integer)."""
    text = (environ.get(ENV) or "").strip()
    if not text.isascii() or not text.isdigit():
        return None
    return int(text) or None


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def requested_bytes(message: str) -> int | None:
    """What a CUDA out-of-memory message says it tried to allocate, or None."""
    found = _TRIED.search(message)
    return round(float(found.group(1)) * _UNITS[found.group(2)]) if found else None


class OverBudget(RuntimeError):
    """The run outgrew its budget: `needed` and `budget` in bytes."""

    def __init__(self, needed: int, budget: int):
        super().__init__(needed, budget)
        self.needed, self.budget = int(needed), int(budget)

    def __str__(self) -> str:
        return (f"over its memory budget: it needed {gib(self.needed)} and its budget is "
                f"{gib(self.budget)}; the engine retries it once with the need it measured")


class MemoryBudget:
    """One run's budget on its device; without one (`budget` None) every call does nothing."""

    def __init__(self, budget: int | None = None, device: Any = None):
        self.budget, self.device = budget, device
        self._process: Any = None

    @classmethod
    def from_env(cls, device: Any, environ: Mapping[str, str] = os.environ) -> MemoryBudget:
        return cls(budget_from_env(environ), device)

    @property
    def cuda(self) -> bool:
        return self.device is not None and self.device.type == "cuda"

    def apply(self, log: Callable[[str], None]) -> None:
        """Before the model is on the device: cap CUDA's allocator, and say so in one line."""
        if self.budget is None:
            return
        if not self.cuda:
            import psutil

            self._process = psutil.Process()
            log(f"memory budget: {gib(self.budget)} (on the CPU: checked against the process's "
                f"resident memory at each log point)")
            return
        import torch

        total = torch.cuda.get_device_properties(self.device).total_memory
        fraction = min(1.0, max(0.01, (self.budget - CONTEXT) / total))
        torch.cuda.set_per_process_memory_fraction(fraction, self.device)
        log(f"memory budget: {gib(self.budget)} (CUDA: {gib(fraction * total)} for tensors, "
            f"fraction {fraction:.3f} of {gib(total)})")

    def footprint(self) -> int:
        """The process's memory as the budget counts it: CUDA's reserved memory and its
        context, or on the CPU the resident memory now."""
        if self.cuda:
            import torch

            return int(torch.cuda.memory_reserved(self.device)) + CONTEXT
        if self._process is None:
            import psutil

            self._process = psutil.Process()
        return int(self._process.memory_info().rss)

    def check(self) -> None:
        """At a log point (host values only, no device sync): raise OverBudget when over."""
        if self.budget is not None and (used := self.footprint()) > self.budget:
            raise OverBudget(used, self.budget)

    def from_oom(self, exc: BaseException) -> OverBudget | None:
        """The OverBudget a CUDA out-of-memory stands for when the budget's cap caused it
        (what was reserved and what it asked for reach the budget); None for a GPU that
        is really full (the plain OOM path: the engine halves the batch)."""
        import torch

        if self.budget is None or not self.cuda or not isinstance(exc, torch.OutOfMemoryError):
            return None
        asked = requested_bytes(str(exc))
        if asked is None:
            return None
        # the peak, not what is reserved now: the allocator lets its cache go and tries
        # again before it raises, so what is reserved then may be far under the cap
        reserved = max(torch.cuda.memory_reserved(self.device),
                       torch.cuda.max_memory_reserved(self.device))
        needed = int(reserved) + asked + CONTEXT
        return OverBudget(needed, self.budget) if needed >= self.budget * CAUSED else None

    def over(self, exc: BaseException) -> OverBudget | None:
        """`exc` as the budget's failure (itself, or the OOM it caused), else None."""
        return exc if isinstance(exc, OverBudget) else self.from_oom(exc)
