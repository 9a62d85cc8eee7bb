"""Telemetry against a fake NVML (a patched `pynvml` module) and with no NVML at all."""

import json
import sys
import types

import pytest

from gridrun.engine.telemetry import NA, Sample, Telemetry, show


class NVMLError(Exception):
    pass


def fake_nvml(count=2, broken=(), init_error=False, procs=None):
    """A module with pynvml's real names; functions named in `broken` raise NVMLError.
    `procs`: {GPU index: [(pid, usedGpuMemory or None)]}, the compute processes each GPU
    lists (by default pid 100 + index with 1 GiB on each)."""
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_TEMPERATURE_GPU = 0
    m.NVML_CLOCK_SM = 1
    m.shutdowns = 0

    def fn(name, impl):
        def call(*args):
            if name in broken:
                raise NVMLError(f"{name}: Not Supported")
            return impl(*args)
        setattr(m, name, call)

    def init():
        if init_error:
            raise NVMLError("Driver Not Loaded")

    def shutdown():
        m.shutdowns += 1

    fn("nvmlInit", init)
    fn("nvmlShutdown", shutdown)
    fn("nvmlDeviceGetCount", lambda: count)
    fn("nvmlDeviceGetHandleByIndex", lambda i: f"h{i}")
    fn("nvmlDeviceGetName", lambda h: b"NVIDIA H100" if h == "h0" else "NVIDIA A100")
    fn("nvmlDeviceGetUtilizationRates", lambda h: types.SimpleNamespace(gpu=87, memory=40))
    fn("nvmlDeviceGetMemoryInfo", lambda h: types.SimpleNamespace(used=3 << 30, total=80 << 30,
                                                                    free=77 << 30))
    fn("nvmlDeviceGetPowerUsage", lambda h: 312_500)  # milliwatts
    fn("nvmlDeviceGetTemperature", lambda h, sensor: 64)
    fn("nvmlDeviceGetClockInfo", lambda h, clock: 1980)
    if procs is None:
        procs = {i: [(100 + i, 1 << 30)] for i in range(count)}
    fn("nvmlDeviceGetComputeRunningProcesses",
       lambda h: [types.SimpleNamespace(pid=pid, usedGpuMemory=mem)
                  for pid, mem in procs.get(int(h[1:]), [])])
    fn("nvmlDeviceGetUUID", lambda h: f"GPU-{int(h[1:]):04d}")
    return m


def test_samples_every_field_from_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    t = Telemetry()
    assert t.available and t.gpu_count == 2 and t.error is None
    s = t.sample()
    g0, g1 = s.gpus
    assert (g0.index, g0.name, g1.name) == (0, "NVIDIA H100", "NVIDIA A100")
    assert g0.util_percent == 87.0
    assert (g0.mem_used_bytes, g0.mem_total_bytes) == (3 << 30, 80 << 30)
    assert g0.power_w == pytest.approx(312.5)
    assert (g0.temperature_c, g0.sm_clock_mhz) == (64.0, 1980)
    assert s.system.ram_total_bytes > 0 and s.system.cpu_percent is not None
    assert t.processes() == {100: 0, 101: 1}
    # storable as JSON and back
    d = json.loads(json.dumps(s.to_dict()))
    assert Sample.from_dict(d) == s
    t.close()
    assert sys.modules["pynvml"].shutdowns == 1


def test_a_failing_query_blanks_only_its_field(monkeypatch):
    broken = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature",
              "nvmlDeviceGetComputeRunningProcesses"}
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(count=1, broken=broken))
    t = Telemetry()
    g = t.sample().gpus[0]
    assert g.power_w is None and g.temperature_c is None
    assert g.util_percent == 87.0 and g.sm_clock_mhz == 1980
    assert show(g.power_w, " W") == NA and show(g.util_percent, "%") == "87.0%"
    assert t.processes() == {}


def test_every_query_failing_still_returns_a_sample(monkeypatch):
    names = [n for n in dir(fake_nvml()) if n.startswith("nvmlDeviceGet") and n not in
             ("nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex")]
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(count=1, broken=set(names)))
    s = Telemetry().sample()
    assert s.gpus[0].index == 0
    assert all(v is None for k, v in s.gpus[0].__dict__.items() if k != "index")


def test_driver_missing_falls_back_to_cpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_error=True))
    t = Telemetry()
    assert not t.available and "Driver Not Loaded" in t.error
    s = t.sample()
    assert s.gpus == [] and s.system.ram_used_bytes > 0
    assert t.processes() == {}
    t.close()


def test_no_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(count=0))
    t = Telemetry()
    assert not t.available and t.error == "no NVIDIA GPU"
    assert t.sample().gpus == []


def test_library_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    t = Telemetry()
    assert not t.available and "nvidia-ml-py" in t.error
    s = t.sample()
    assert s.gpus == [] and s.system.ram_total_bytes > 0


def test_no_psutil_either(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "psutil", None)
    s = Telemetry().sample()
    assert s.gpus == [] and s.system.cpu_percent is None and s.system.ram_used_bytes is None
