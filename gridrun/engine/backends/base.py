"""The small interface between the scheduler and wherever runs execute.

The scheduler owns the queue, priorities, retries and the store; a backend
only starts one run on one slot, reports when it ends, stops it, and after an
engine restart tells whether a run it started before is still going. The
worker writes metrics.jsonl and summary.json into the run folder itself; a
backend whose runs execute elsewhere (Ray) streams those lines back and
writes them into the same folder, so readers cannot tell the difference.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the GPU memory a run may use, in bytes (engine/packing.py gives it, the run enforces it)
from gridrun.train.loop.memory import ENV as MEMORY_BUDGET

# A worker that finds its run already running (the run lock held by another
# process) exits with this code without touching anything (EX_TEMPFAIL).
EXIT_ALREADY_RUNNING = 75


@dataclass(frozen=True)
class Slot:
    """Where one run executes: a GPU (`gpu` is its index) or a CPU slot; or, for a run on
    `devices` > 1, a gang (`gang`): one slot standing for its members, all held at once."""

    name: str  # "cpu0", "gpu1", or "gpu1.0", "gpu1.1" with several runs per GPU; "gpu0+gpu1"
    gpu: int | None = None  # a gang's: its first member's
    device: str | None = None  # a GPU-/MIG- UUID the engine inherited, passed on as it is
    members: tuple[Slot, ...] = ()  # a gang's slots, each a plain slot
    budget: int | None = field(default=None, compare=False)  # bytes of GPU memory, per GPU
    node: str | None = None  # the Ray node it is on (its id), None on this machine

    @property
    def env(self) -> dict[str, str]:
        """What the run's process is given: its GPUs, and its memory budget when it has one."""
        out = {"CUDA_VISIBLE_DEVICES": self.cuda_visible_devices}
        if self.budget:
            out[MEMORY_BUDGET] = str(int(self.budget))
        return out

    @property
    def parts(self) -> tuple[Slot, ...]:
        """The plain slots this one holds: its members, or itself."""
        return self.members or (self,)

    @property
    def cuda_visible_devices(self) -> str:
        # empty, not unset: an unset variable would let the run see every GPU
        if self.gpu is None:
            return ""
        if self.members:  # rank r of the run uses cuda:r
            return ",".join(m.cuda_visible_devices for m in self.members)
        if self.node is not None and not (self.device or "").startswith(("GPU-", "MIG-")):
            return str(self.gpu)  # a Ray node's GPU known by its index only: the key is ours
        return self.device or str(self.gpu)


def gang(slots: Sequence[Slot]) -> Slot:
    """One slot for a run on several: launched once on it, named after its members
    ("cpu0+cpu1", a name the store keeps and a restarted engine reads back), and its
    CUDA_VISIBLE_DEVICES lists every member's GPU ("0,1"). One slot stays itself."""
    if len(slots) == 1:
        return slots[0]
    return Slot("+".join(s.name for s in slots), slots[0].gpu, members=tuple(slots),
                node=slots[0].node)


class Refused(Exception):
    """A backend can never run this run (a run on more devices than a Ray node has CPUs
    for its ranks): the run fails with this one line instead of a launch."""


@dataclass(frozen=True)
class Handle:
    """A launched run. `pid` and `start_time` identify its process across
    engine restarts (a pid alone can be reused)."""

    run_id: str
    run_dir: Path
    pid: int
    start_time: float
    slot: Slot | None = None
    extra: Any = field(default=None, compare=False)  # backend-specific


@dataclass(frozen=True)
class Exited:
    """A run's process ended. `code` is the worker's exit code (states.EXIT_CODES),
    a negative signal number, or None when nobody could see it (an adopted
    process): then the run folder's exit record or summary tells."""

    handle: Handle
    code: int | None


class Backend(abc.ABC):
    """Where runs execute. All methods are called from the engine's one thread."""

    name = "abstract"

    def start(self) -> None:  # noqa: B027 - optional
        """Get ready (e.g. start a fork server). Called once before any launch."""

    @abc.abstractmethod
    def launch(self, run_id: str, run_dir: Path, slot: Slot, *, fresh: bool = False) -> Handle:
        """Start the worker on RUN_DIR (config.toml is already there) on `slot`."""

    @abc.abstractmethod
    def poll(self, timeout: float) -> list[Exited]:
        """Wait up to `timeout` seconds for runs to end; return those that did.
        Also forces the kill of cancelled runs whose grace period has passed."""

    @abc.abstractmethod
    def cancel(self, handle: Handle, grace: float = 30.0) -> None:
        """Ask the run to stop (it checkpoints and exits 5); kill it after `grace`."""

    @abc.abstractmethod
    def reattach(self, run_id: str, run_dir: Path, pid: int | None,
                 start_time: float | None, slot: Slot | None = None) -> Handle | None:
        """After an engine restart: a handle to the run's process if it still
        runs (then `poll` reports its end), else None."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release resources. Runs keep going: they outlive the engine."""
