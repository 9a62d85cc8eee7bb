"""GPU and system sampling: one NVML sampler that never raises.

The engine calls `Telemetry.sample()` about once a second and `processes()`
(and `gpu_processes()`: each one's GPU memory and user, engine/foreign.py reads them)
every few seconds, and stores `Sample.to_dict()`. Any missing piece (no
`pynvml`, no driver, no GPU, an NVML call a device does not support) becomes
None for that field, shown as "n/a"; CPU and RAM come from psutil whatever
happens. The pattern is nvitop's `nvmlQuery`: one guarded call per field.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

NA = "n/a"
# NVML's words for a machine without an NVIDIA driver: nothing is wrong, there is no GPU
NO_DRIVER = ("Library Not Found", "Driver Not Loaded")


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str | None = None
    util_percent: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: int | None = None
    uuid: str | None = None  # "GPU-...": the same GPU for every engine, whatever its index
    node: str | None = None  # the Ray node's name, sampled there (engine/backends/ray)


@dataclass(frozen=True)
class SystemSample:
    cpu_percent: float | None = None  # over all cores, since the previous sample
    ram_used_bytes: int | None = None
    ram_total_bytes: int | None = None


@dataclass(frozen=True)
class Sample:
    t: float
    gpus: list[GpuSample] = field(default_factory=list)
    system: SystemSample = field(default_factory=SystemSample)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        return cls(t=d["t"], gpus=[GpuSample(**g) for g in d.get("gpus", [])],
                   system=SystemSample(**d.get("system", {})))


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU: NVML's pid and memory, psutil's user."""

    pid: int
    gpu: int  # NVML's index
    mem_bytes: int | None = None  # NVML's usedGpuMemory; None when it does not say
    user: str = "?"  # psutil's username; "?" when it cannot be read (another PID namespace)
    uuid: str | None = None  # the GPU's ("GPU-..."), to match a slot given by UUID
    # Listed by a Ray node's agent, which tells whose it is on the node (its pids):
    node: str | None = None  # the node's name
    ours: bool | None = None  # this engine's run or below one; None: not told (this machine)
    engine: str | None = None  # the ledger entry of the engine whose run it verifiably is


def show(value: Any, unit: str = "") -> str:
    """A field for people: "n/a" when it could not be read."""
    return NA if value is None else f"{value}{unit}"


def _guard(call: Callable[[], Any]) -> Any:
    # Any failure of one field (NVMLError, a driver that lacks the query, a
    # library that changed shape) must only blank that field.
    try:
        return call()
    except Exception:
        return None


class Telemetry:
    """Samples every visible NVIDIA GPU (when NVML works) and the host's CPU and RAM."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []
        self.error: str | None = None  # why there is no GPU data, for a status line
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._nvml = pynvml
            if not self._handles:
                self.error = "no NVIDIA GPU"
        except ImportError:
            self.error = "pynvml is not installed (pip install nvidia-ml-py)"
        except Exception as exc:  # NVMLError: no driver, no permission, ...
            self.error = f"NVML unavailable: {exc}"
            self._handles = []
        self._psutil: Any = None
        try:
            import psutil

            psutil.cpu_percent(interval=None)  # the first call only starts the measurement
            self._psutil = psutil
        except Exception:
            pass

    @property
    def available(self) -> bool:
        """True when GPU figures can be read."""
        return self._nvml is not None and bool(self._handles)

    @property
    def failing(self) -> str | None:
        """Why NVML answers nothing on a machine that has it (no permission, a driver that
        does not match its library, every call failing), in NVML's words; None where it
        works, or where there is no NVIDIA driver or pynvml at all."""
        if self.error is None or self.error == "no NVIDIA GPU" or "not installed" in self.error:
            return None
        return None if any(words in self.error for words in NO_DRIVER) else self.error

    @property
    def gpu_count(self) -> int:
        return len(self._handles) if self._nvml is not None else 0

    def sample(self) -> Sample:
        try:
            gpus = [self._gpu(i, h) for i, h in enumerate(self._handles)] if self._nvml else []
        except Exception:
            gpus = []
        return Sample(t=time.time(), gpus=gpus, system=self._system())

    def _gpu(self, index: int, h: Any) -> GpuSample:
        nv = self._nvml
        name = _guard(lambda: nv.nvmlDeviceGetName(h))
        if isinstance(name, bytes):  # older bindings return bytes
            name = name.decode(errors="replace")
        util = _guard(lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu))
        mem = _guard(lambda: nv.nvmlDeviceGetMemoryInfo(h))
        power_mw = _guard(lambda: nv.nvmlDeviceGetPowerUsage(h))
        temp = _guard(lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))
        clock = _guard(lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))
        uuid = _guard(lambda: nv.nvmlDeviceGetUUID(h))
        uuid = uuid.decode(errors="replace") if isinstance(uuid, bytes) else uuid
        return GpuSample(
            index=index, name=name, util_percent=util,
            mem_used_bytes=_guard(lambda: int(mem.used)) if mem is not None else None,
            mem_total_bytes=_guard(lambda: int(mem.total)) if mem is not None else None,
            power_w=power_mw / 1000.0 if isinstance(power_mw, int | float) else None,
            temperature_c=temp, sm_clock_mhz=clock, uuid=uuid if isinstance(uuid, str) else None,
        )

    def _system(self) -> SystemSample:
        ps = self._psutil
        if ps is None:
            return SystemSample()
        cpu = _guard(lambda: float(ps.cpu_percent(interval=None)))
        vm = _guard(ps.virtual_memory)
        if vm is None:
            return SystemSample(cpu_percent=cpu)
        return SystemSample(cpu_percent=cpu, ram_used_bytes=_guard(lambda: int(vm.total - vm.available)),
                            ram_total_bytes=_guard(lambda: int(vm.total)))

    def processes(self) -> dict[int, int]:
        """{pid: GPU index} of the compute processes on every GPU ({} without NVML)."""
        return {pid: index for index, _, pid, _ in self._listed()}

    def gpu_processes(self) -> list[GpuProcess]:
        """The compute processes on every GPU, each with its GPU memory and user ([]
        without NVML); a process on two GPUs is listed on each."""
        out = []
        uuids: dict[int, Any] = {}
        for index, h, pid, p in self._listed():
            if index not in uuids:
                uuid = _guard(lambda h=h: self._nvml.nvmlDeviceGetUUID(h))
                uuids[index] = uuid.decode(errors="replace") if isinstance(uuid, bytes) else uuid
            mem = _guard(lambda p=p: int(p.usedGpuMemory))  # None: NVML_VALUE_NOT_AVAILABLE
            out.append(GpuProcess(pid, index, mem if mem is not None and 0 <= mem < 1 << 63 else None,
                                  self._user(pid), uuids[index] if isinstance(uuids[index], str) else None))
        return out

    def _listed(self) -> list[tuple[int, Any, int, Any]]:
        """(GPU index, handle, pid, NVML's record) of each compute process."""
        out: list[tuple[int, Any, int, Any]] = []
        if self._nvml is None:
            return out
        for index, h in enumerate(self._handles):
            procs = _guard(lambda h=h: list(self._nvml.nvmlDeviceGetComputeRunningProcesses(h)))
            for p in procs or []:
                pid = _guard(lambda p=p: int(p.pid))
                if pid is not None:
                    out.append((index, h, pid, p))
        return out

    def _user(self, pid: int) -> str:
        ps = self._psutil
        name = _guard(lambda: ps.Process(pid).username()) if ps is not None else None
        return name if isinstance(name, str) and name else "?"

    def close(self) -> None:
        if self._nvml is not None:
            _guard(self._nvml.nvmlShutdown)
            self._nvml = None
            self._handles = []
