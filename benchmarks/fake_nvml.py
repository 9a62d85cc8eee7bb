"""A stand-in NVML for gpu_pack.py's dry run (no CUDA): copied as `pynvml.py` into its
temporary folder, first on PYTHONPATH for every `gridrun` command, so the engine's
telemetry and slots see one GPU. Only the calls gridrun makes are here.

- One GPU, "GPU-fake-0000" ("stand-in GPU"), of GRIDRUN_BENCH_FAKE_GIB GiB (8).
- Its compute processes: every live run under GRIDRUN_BENCH_FAKE_DIR (a run's process
  holds `ROOT/EXPERIMENT/RUN/.gridrun-lock` and writes its pid and start time there),
  each using its resident memory (a run given a stand-in GPU trains on the CPU,
  GRIDRUN_FAKE_GPUS=1); and the "other process" of the file `hog` there ("PID BYTES").
- Memory used: the sum of those. Utilisation, power, temperature, clocks: not supported.
"""

import json
import os
from glob import glob
from pathlib import Path
from types import SimpleNamespace

import psutil

NVML_TEMPERATURE_GPU, NVML_CLOCK_SM = 0, 1
UUID = "GPU-fake-0000"


class NVMLError(Exception):
    pass


def _unsupported(*_):
    raise NVMLError("Not Supported")


def _total() -> int:
    return int(float(os.environ.get("GRIDRUN_BENCH_FAKE_GIB", "8")) * 2**30)


def _live(pid: int, start_time: float | None = None) -> psutil.Process | None:
    try:
        p = psutil.Process(pid)
        if ((start_time and abs(p.create_time() - start_time) > 0.5)
                or p.status() == psutil.STATUS_ZOMBIE):
            return None
        return p
    except (psutil.Error, ValueError, TypeError):
        return None


def _processes() -> list[SimpleNamespace]:
    folder, out = os.environ.get("GRIDRUN_BENCH_FAKE_DIR"), []
    if not folder:
        return out
    for lock in glob(os.path.join(folder, "*", "*", "*", ".gridrun-lock")):
        try:
            held = json.loads(Path(lock).read_text() or "{}")
            p = _live(int(held["pid"]), held.get("start_time"))
            if p is not None:
                out.append(SimpleNamespace(pid=p.pid, usedGpuMemory=p.memory_info().rss))
        except (OSError, ValueError, KeyError, TypeError, psutil.Error):
            pass  # a run starting or ending
    try:
        pid, used = Path(folder, "hog").read_text().split()
        if _live(int(pid)):
            out.append(SimpleNamespace(pid=int(pid), usedGpuMemory=int(used)))
    except (OSError, ValueError):
        pass
    return out


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlSystemGetDriverVersion():
    return "stand-in"


def nvmlDeviceGetCount():
    return 1


def nvmlDeviceGetHandleByIndex(index):
    if index != 0:
        raise NVMLError("Invalid Argument")
    return 0


def nvmlDeviceGetName(handle):
    return "stand-in GPU"


def nvmlDeviceGetUUID(handle):
    return UUID


def nvmlDeviceGetComputeRunningProcesses(handle):
    return _processes()


def nvmlDeviceGetMemoryInfo(handle):
    total = _total()
    used = min(total, sum(p.usedGpuMemory for p in _processes()))
    return SimpleNamespace(total=total, used=used, free=total - used)


nvmlDeviceGetUtilizationRates = nvmlDeviceGetPowerUsage = _unsupported
nvmlDeviceGetTemperature = nvmlDeviceGetClockInfo = _unsupported
