"""The engine's samples, each on its own clock: telemetry (GPUs, CPU, memory) for the
store, and the processes on the GPUs, whose run each is and which GPUs others take
(engine/foreign.py). The sampling half of `Engine` (scheduler.py); a sample never stops
the engine, bar a full disk (the engine then waits for space)."""

from __future__ import annotations

import logging
import time
from typing import Any

from gridrun.engine import placement
from gridrun.engine.foreign import Watch, gpu_lines
from gridrun.engine.sharing import Sharing
from gridrun.runs import space

log = logging.getLogger("gridrun.engine")
NVML = "nvml_failing"  # store state: {"error"} while NVML is there but answers nothing, or None


class Sampling:
    """What the sampling half needs of the engine."""

    telemetry: Any
    telemetry_every: float
    processes_every: float
    _next_sample: float
    _next_processes: float
    others: Watch
    sharing: Any
    _said: dict[str, Any]
    active: dict[str, Any]
    slots: list[Any]
    store: Any
    backend: Any
    runs_per_gpu: Any

    @property
    def backend_sees_nodes(self) -> bool:
        return getattr(self.backend, "telemetry", None) is not None

    def adopt_cluster(self) -> None:
        """A backend that sees its nodes' GPUs itself (Ray: an agent on each node) gives
        the engine its telemetry, and its ledger (each node's own) for packing: the good
        neighbour and packing then work on every node as on this machine."""
        telemetry = getattr(self.backend, "telemetry", None)
        if telemetry is None:
            return
        self.telemetry = telemetry
        ledger = getattr(self.backend, "ledger", None)
        if self.sharing is None and ledger is not None:
            self.sharing = Sharing.for_engine(self.runs_per_gpu, self.slots, True, ledger)

    def sample_telemetry(self) -> None:
        if self.telemetry is None:
            return
        now = time.monotonic()
        if now < self._next_sample:
            return
        self._next_sample = now + self.telemetry_every
        try:
            self._sample(now)
        except Exception as e:  # telemetry never stops the engine (a full disk: the wait)
            if space.is_no_space(e):
                raise

    def _sample(self, now: float) -> None:
        sample = self.telemetry.sample()
        sample = sample.to_dict() if hasattr(sample, "to_dict") else dict(sample)
        self.say_nvml()
        if self.sharing:
            self.sharing.book.sizes(sample.get("gpus") or [])
        self.sample_processes(now)
        sample["processes"] = self.others.listed
        self.store.record_telemetry(sample, t=sample.get("t"))

    def say_nvml(self) -> None:
        """NVML is there but answers nothing: no GPU is seen (the engine's slots are then
        the CPU's) and no GPU's memory is known; said once in the log, and in `engine
        status` while it lasts."""
        why = getattr(self.telemetry, "failing", None)
        state = {"error": why} if isinstance(why, str) else None
        if state is not None and self._said.get(NVML) != state:
            log.warning("%s", nvml_lines(state)[0])
        self._say(NVML, state)  # type: ignore[attr-defined]  # the engine's

    def sample_processes(self, now: float) -> None:
        """Every `processes_every` s: the processes on the GPUs, whose run each is, and
        the GPUs others take (engine/foreign.py; logged when that changes)."""
        if self.telemetry is None or now < self._next_processes:
            return
        self._next_processes = now + self.processes_every
        runs = {a.handle.pid: a.run_id for a in self.active.values()}
        held = {p.gpu for a in self.active.values() if a.slot for p in a.slot.parts}
        keys = {g for s in self.slots if (g := placement.gpu_of(s)) is not None}
        # other engines' runs, verified here (a Ray node's agent verifies its own)
        friends = self.sharing.verify if self.sharing and not self.backend_sees_nodes else ()
        try:
            if self.others.sample(self.telemetry, runs, keys, held, friends):
                for line in gpu_lines(self.others.state()) or ["no GPU is taken by others"]:
                    log.info("%s", line)
        except Exception:  # telemetry never stops the engine
            log.debug("could not sample the GPUs' processes", exc_info=True)


def nvml_lines(state: Any) -> list[str]:
    """`engine status`'s line for NVML.STATE (none for anything else)."""
    if not isinstance(state, dict) or not isinstance(state.get("error"), str):
        return []
    return [f"gpus: NVML is installed but fails ({state['error']}): no GPU is seen or measured, so "
            "runs use the CPU; `nvidia-smi` says whether the driver works (after a driver update "
            "the machine may need a reboot)"]
