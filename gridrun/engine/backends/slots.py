"""How many runs fit where: slots from the `[engine]` table and the GPUs NVML sees."""

from __future__ import annotations

from typing import Any

from gridrun.engine.backends.base import Slot


def gpu_count() -> int:
    """GPUs NVML sees (0 without an NVIDIA driver); never initialises CUDA here."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


def slots_for(config: Any, gpus_available: int | None = None) -> list[Slot]:
    """Slots from an EngineConfig: each GPU times runs_per_gpu, or cpu_slots without GPUs."""
    gpus = config.gpus
    if gpus == "auto":
        gpus = range(gpu_count() if gpus_available is None else gpus_available)
    gpus, per = list(gpus), max(1, int(config.runs_per_gpu))
    if gpus:
        return [Slot(f"gpu{g}" if per == 1 else f"gpu{g}.{k}", g) for g in gpus for k in range(per)]
    return [Slot(f"cpu{i}") for i in range(max(1, int(config.cpu_slots)))]
