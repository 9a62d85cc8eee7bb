"""The machine a run trains on: the device it may use, and what it is made of.

`pick_device` is where a run given a GPU either gets it or fails: a slot that
sets CUDA_VISIBLE_DEVICES to GPUs torch cannot use (a CPU build of torch, a
driver that does not start) ends the run with `EnvironmentProblem`, never a
run that quietly trains on the CPU. `describe` is what `summary.json` records
and `gridrun doctor` prints: torch, CUDA, cuDNN and driver versions, the GPUs,
CUDA_VISIBLE_DEVICES, the determinism settings, and the CPU facts that decide
its bits (`cpu_facts`: threads, the kernels' instruction set, BLAS and oneDNN).
`REPRODUCE` names the fields that must match for a replay to give the same
bits. NVML is asked through nvidia-ml-py and never raises out of here.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
from typing import Any

import torch

from gridrun.train.threads import usable_cores

NO_GPU = ("", "-1", "none", "NoDevFiles")  # CUDA_VISIBLE_DEVICES values that hide every GPU
# Set to 1 where the GPUs a scheduler hands out are stand-ins (a test cluster's fake
# GRES or Ray's num_gpus on a CPU machine): runs train on the CPU and say so.
STAND_INS = "GRIDRUN_FAKE_GPUS"


# The fields of the environment record that decide a run's bits: the same cell with
# these the same gives the same numbers (the README's guarantee). `cpu` is there
# because MKL picks its kernels by processor model as well as by instruction set.
REPRODUCE = ("torch", "threads", "cpu_capability", "cpu", "blas", "onednn", "cuda", "cudnn", "gpu")


class EnvironmentProblem(RuntimeError):
    """The run was given a GPU it cannot use; str() says what was seen."""


def nvml() -> dict[str, Any]:
    """What the driver reports: {"driver": version, "gpus": [name, ...]} or {"error": why}."""
    try:
        import pynvml
    except ImportError:
        return {"error": "nvidia-ml-py is not installed"}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError: no driver, no device files, no permission
        return {"error": f"NVML unavailable: {exc}"}
    try:
        def text(v: Any) -> str:
            return v.decode(errors="replace") if isinstance(v, bytes) else str(v)

        count = pynvml.nvmlDeviceGetCount()
        gpus = [text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(count)]
        return {"driver": text(pynvml.nvmlSystemGetDriverVersion()), "gpus": gpus}
    except Exception as exc:
        return {"error": f"NVML query failed: {exc}"}
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def gpus_given() -> str | None:
    """The GPUs this process was told to use (CUDA_VISIBLE_DEVICES), None when none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or visible.strip() in NO_GPU:
        return None
    return visible.strip()


def stand_ins() -> bool:
    """Whether the GPUs this process was given are declared stand-ins (GRIDRUN_FAKE_GPUS=1)."""
    return os.environ.get(STAND_INS) == "1"


def pick_device() -> torch.device:
    """cuda when torch can use it; the CPU when no GPU was given (or the ones given are
    declared stand-ins, GRIDRUN_FAKE_GPUS=1); else EnvironmentProblem.

    Without CUDA_VISIBLE_DEVICES a machine whose driver sees GPUs torch cannot
    use fails too: a CPU run there is a broken install, not a choice.
    """
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return torch.device("cuda")
    given = gpus_given()
    if given is not None and stand_ins():
        return torch.device("cpu")
    seen = nvml() if given is not None or "CUDA_VISIBLE_DEVICES" not in os.environ else {}
    nvml_gpus = seen.get("gpus") or []
    if given is None and not nvml_gpus:
        return torch.device("cpu")
    build = f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none: a CPU build'})"
    saw = (f"NVML sees {len(nvml_gpus)} GPU(s)" if "gpus" in seen
           else f"NVML: {seen.get('error', 'not asked')}")
    count = torch.cuda.device_count() if torch.version.cuda else 0
    raise EnvironmentProblem(
        ("environment: given GPU(s) by CUDA_VISIBLE_DEVICES=" + repr(given) if given is not None
         else "environment: the driver has GPUs")
        + f"; {saw} but torch.cuda.device_count() is {count} with {build}: a run fails here "
        "rather than train on the CPU instead; `gridrun doctor` checks the machine")


def cpu_model() -> str | None:
    """The processor's model name (/proc/cpuinfo), else what platform knows."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("model name"):
                return line.partition(":")[2].strip() or None
    return platform.processor() or platform.machine() or None


def cpu_facts() -> dict[str, Any]:
    """The CPU side of a run's bits: the threads it computes with, the cores it may
    use, the instruction set torch's kernels dispatch to, the processor, and the
    BLAS and oneDNN builds (from torch's own build record)."""
    build = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", build)
    mkl = re.search(r"Math Kernel Library Version ([\w.]+)", build)
    onednn = re.search(r"MKL-DNN v([\w.]+)", build)
    blas_text = blas.group(1) if blas else None
    if blas_text == "mkl" and mkl:
        blas_text = f"mkl {mkl.group(1)}"
    return {
        "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
        "cores": usable_cores(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": cpu_model(), "blas": blas_text,
        "onednn": (onednn.group(1) if onednn else None) if torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled else None,
    }


def describe(device: torch.device, determinism: dict[str, Any] | None = None) -> dict[str, Any]:
    """Versions, the GPU, the determinism settings and the CPU facts, for summary.json."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    out: dict[str, Any] = {
        "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": cudnn,
        "driver": None, "gpu": None, "gpu_memory_bytes": None,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "determinism": determinism, **cpu_facts(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(gpu=props.name, gpu_memory_bytes=int(props.total_memory),
                   driver=nvml().get("driver"))
    return out
