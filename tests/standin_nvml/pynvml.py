"""A stand-in NVML for processes the tests do not run themselves (a Ray node's agent):
pynvml's names, answered from the JSON file GRIDRUN_STANDIN_NVML names, read at every
call, so a test changes what a node's GPUs hold by rewriting the file:

    {"gpus": [{"uuid": "GPU-node2-0", "total": 85899345920}, ...],
     "procs": {"0": [[pid, bytes], ...]}}

A GPU's used memory is what its processes hold. Put first on a node's PYTHONPATH."""

import json
import os
import types


class NVMLError(Exception):
    pass


NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1


def _state():
    with open(os.environ["GRIDRUN_STANDIN_NVML"]) as f:
        return json.load(f)


def _gpu(h):
    return _state()["gpus"][int(h[1:])]


def _procs(h):
    return [(int(pid), mem) for pid, mem in _state().get("procs", {}).get(h[1:], [])]


def nvmlInit():
    _state()


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return len(_state()["gpus"])


def nvmlDeviceGetHandleByIndex(i):
    return f"h{i}"


def nvmlDeviceGetName(h):
    return _gpu(h).get("name", "stand-in")


def nvmlDeviceGetUUID(h):
    return _gpu(h)["uuid"]


def nvmlDeviceGetUtilizationRates(h):
    return types.SimpleNamespace(gpu=50 if _procs(h) else 0, memory=0)


def nvmlDeviceGetMemoryInfo(h):
    total = int(_gpu(h)["total"])
    used = sum(mem or 0 for _, mem in _procs(h))
    return types.SimpleNamespace(used=used, total=total, free=total - used)


def nvmlDeviceGetPowerUsage(h):
    return 100_000


def nvmlDeviceGetTemperature(h, sensor):
    return 40


def nvmlDeviceGetClockInfo(h, clock):
    return 1500


def nvmlDeviceGetComputeRunningProcesses(h):
    return [types.SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in _procs(h)]
