"""How many CPU threads a run computes with: decided before anything computes,
recorded with the run, kept when it resumes.

On the CPU the thread count decides how a matmul or a convolution splits its
sums, so it decides the bits of the result: the same cell with 1 thread and
with 2 ends with other weights. `threads = "auto"` is therefore a number that
depends on nothing around the run: one thread for each CPU process, on any
machine, in a 1-slot or an 8-slot engine, alone or as one of a run's several
devices (so `reduce = "invariant"` gives the same bits on any device count
under the defaults), and never an ambient OMP_NUM_THREADS. One thread a
process is also what fills a machine best with a grid's small runs side by
side (benchmarks/bench_threads.py); a single big CPU run sets `threads = N`.
GPU runs get a fixed small count (their heavy work is on the device; the CPU
side is the loop, collation and copies): min(GPU_THREADS, usable cores), the
usable cores shared between the ranks of a "ddp" run. A resumed run computes
with the threads its checkpoint was trained with (train/loop/attempts.py). The
engine resolves the same way to never start more CPU runs than the cores hold
(engine/scheduler.py).

No torch at import: the engine and the commands resolve without it.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from gridrun.spec.keys import GPU_THREADS  # "auto" for a GPU run: min(this, usable cores)

AUTO = "auto"
CPU_AUTO = 1  # "auto" on the CPU: one thread a process, whatever the machine or device count
ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # what child processes (DataLoader workers) read


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a container's or a
    SLURM allocation's share), not the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


def resolve(value: Any, *, gpu: bool, cores: int | None = None) -> int:
    """The threads a process of a run with `threads = value` computes with: the number
    itself, or for "auto" 1 (a CPU run) or min(GPU_THREADS, usable cores) (a GPU run).
    `cores` stands in for this machine's usable cores (a "ddp" rank's share of them)."""
    if value is None or value == AUTO:
        return min(GPU_THREADS, cores or usable_cores()) if gpu else CPU_AUTO
    return max(1, int(value))


def apply(n: int) -> dict[str, Any]:
    """Compute with `n` threads from now on in this process (torch's intra-op
    threads, and its inter-op threads while that is still allowed), and give child
    processes the matching OMP_NUM_THREADS and MKL_NUM_THREADS. Returns what was
    set before, for `restore`."""
    import torch

    before = {"threads": torch.get_num_threads(), "env": {k: os.environ.get(k) for k in ENV}}
    for key in ENV:
        os.environ[key] = str(n)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    # allowed once per process, before any inter-op work (a forked run's first act);
    # inter-op threads run independent ops side by side: they never change results
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(n)
    return before


def restore(before: dict[str, Any]) -> None:
    """Undo `apply` (a replay inside another command: `gridrun verify`)."""
    import torch

    torch.set_num_threads(before["threads"])
    for key, value in before["env"].items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
