"""Where a process stands among its run's devices (`World`), and how the ranks meet.

The loop's modules read the `World`; starting and watching the ranks is ranks.py's.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridrun.runs.states import EXIT_RANK_DIED

COLLECTIVE_TIMEOUT_S = 600.0  # a rank alive but stuck; a dead one is seen within a second
# what gloo and NCCL say when a peer's process is gone
PEER_GONE = ("gloo", "NCCL", "Connection closed by peer", "Connection reset by peer")


@dataclass(frozen=True)
class World:
    """Where this process stands in its run: rank `rank` of `size`, summing gradients
    the `reduce` way ("ddp" or "invariant"). One device: rank 0 of 1."""

    rank: int = 0
    size: int = 1
    reduce: str = "ddp"
    group: Any = field(default=None, compare=False)  # the torch.distributed group, when size > 1

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def invariant(self) -> bool:
        return self.reduce == "invariant"


SINGLE = World()


def join(rank: int, size: int, reduce: str, rendezvous: Path, cuda: bool) -> World:
    """This process's place in the run's process group (gloo on the CPU, NCCL on GPUs)."""
    import torch.distributed as dist

    if size == 1:
        return World(reduce=reduce)
    store = dist.FileStore(str(rendezvous), size)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    return World(rank=rank, size=size, reduce=reduce, group=dist.group.WORLD)


def leave(world: World) -> None:
    if world.size > 1:
        import torch.distributed as dist

        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def which_died() -> str | None:
    """Rank 0's account of the rank that died, "rank 1 of 2 died (signal 9)": ranks.Gang
    puts its own in place of this one, which knows nothing."""
    return None


# called with the one line before this process ends for a dead rank (`gridrun train`
# records its foreground run's end there: nothing after os._exit would)
before_exit: list[Callable[[str], None]] = []


def rank_died(who: str) -> None:
    """The run stops here, as a process that died: never a failure of its own."""
    line = f"{who}: the run stops and resumes from its last checkpoint"
    print(line, file=sys.stderr, flush=True)
    for hook in before_exit:
        with contextlib.suppress(Exception):
            hook(line)
    os._exit(EXIT_RANK_DIED)


def collective_failed(world: World, exc: BaseException) -> None:
    """A collective raised (a peer's socket closed, a timeout): a rank is gone. Nothing
    is written: the last checkpoint stays the run's."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    print(f"rank {world.rank}: a collective failed: {type(exc).__name__}: {first}",
          file=sys.stderr, flush=True)
    rank_died(which_died() or "another rank is gone")


def peer_gone(exc: BaseException) -> bool:
    """Whether `exc` is a collective that failed (another rank is gone)."""
    import torch.distributed as dist

    return isinstance(exc, dist.DistError) or any(s in str(exc) for s in PEER_GONE)
