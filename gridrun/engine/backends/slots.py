"""How many runs fit where: slots from the `[engine]` table and the GPUs this
process may use: the ones it inherited (a SLURM allocation's), else every one NVML sees;
and how many CPU runs the cores hold (`fits`): `cpu_slots` is an upper bound, the
runs' threads decide (at most usable cores / threads at once). Every count is first held
to its bound (`within_bounds`): a config that got past the spec's never builds a billion."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gridrun.engine.backends.base import Slot
from gridrun.spec.engine_table import bounded
from gridrun.train.threads import usable_cores

log = logging.getLogger("gridrun.engine")

# what CUDA accepts in CUDA_VISIBLE_DEVICES: indices, or GPU-/MIG- UUIDs; it stops at
# the first entry that is neither (SLURM's old "NoDevFiles", "-1": no GPU)
_DEVICE = re.compile(r"^(\d+|(GPU|MIG)-[0-9A-Za-z-]+)$")


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


def inherited_gpus(env: Mapping[str, str] | None = None) -> list[str] | None:
    """The GPUs this process was given, as CUDA_VISIBLE_DEVICES entries, or None when
    nobody restricted it. Inside a SLURM allocation that is the allocation's GPUs:
    CUDA_VISIBLE_DEVICES as SLURM set it, else SLURM_JOB_GPUS (the node's indices)."""
    env = os.environ if env is None else env
    given = env.get("CUDA_VISIBLE_DEVICES")
    if given is None:
        given = env.get("SLURM_JOB_GPUS")
        if not given:
            return None
    out = []
    for entry in (e.strip() for e in given.split(",")):
        if not _DEVICE.match(entry):
            break
        out.append(entry)
    return out


def within_bounds(config: Any) -> Any:
    """`config` with each count the spec bounds held to its bound, each change logged: the
    store may hold a config saved before the bounds, or one written there by hand."""
    config, notes = bounded(config)
    for note in notes:
        log.warning("%s", note)
    return config


def slots_for(config: Any, gpus_available: int | None = None,
              env: Mapping[str, str] | None = None) -> list[Slot]:
    """Slots from an EngineConfig: each GPU times runs_per_gpu, or cpu_slots without GPUs.
    `gpus = "auto"` means the inherited GPUs when there are (each run gets one of those
    ids, never another), else all `gpus_available` (NVML's count); a GPU where another
    user's process computes gets no new run while it does (engine/foreign.py)."""
    config = within_bounds(config)
    # "auto": packed by memory (engine/packing.py); the slots only bound how many at once
    per = max(1, usable_cores()) if config.runs_per_gpu == "auto" else max(1, int(config.runs_per_gpu))
    gpus: list[tuple[int, str | None]]
    if config.gpus != "auto":
        gpus = [(g, None) for g in config.gpus]
    elif gpus_available is None and (inherited := inherited_gpus(env)) is not None:
        gpus = [(int(d), None) if d.isdigit() else (i, d) for i, d in enumerate(inherited)]
    else:
        gpus = [(g, None) for g in range(gpu_count() if gpus_available is None else gpus_available)]
    if gpus:
        return [Slot(f"gpu{g}" if per == 1 else f"gpu{g}.{k}", g, device)
                for g, device in gpus for k in range(per)]
    return [Slot(f"cpu{i}") for i in range(max(1, int(config.cpu_slots)))]


def slot_names(slots: list[Slot], shown: int = 8) -> str:
    """The slots for a log line: every name when few, else the first and the last."""
    names = [s.name for s in slots]
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown - 1])}, ..., {names[-1]} ({len(names)} slots)"


def fits(holding: Iterable[int], need: int, cores: int) -> bool:
    """Whether a CPU run computing with `need` threads may start beside runs holding
    `holding` threads on `cores` usable cores: never more threads than cores, so never
    oversubscribed; a run asking for more than the machine has runs alone."""
    used = sum(holding)
    return used == 0 or used + need <= cores


def thread_cap_note(cap: Mapping[str, Any]) -> str:
    """`engine status`'s line for a queue the runs' threads hold back (the scheduler's
    CPU_CAP state: cores, cpu_slots, threads the next run needs, threads in use)."""
    cores, slots, need = cap.get("cores"), cap.get("cpu_slots"), cap.get("threads")
    at_once = max(1, cores // need) if isinstance(cores, int) and isinstance(need, int) and need else 1
    text = (f"cpu: the next run takes {need} thread{'s' * (need != 1)} and {cap.get('holding')} of "
            f"{cores} usable cores are taken")
    others = [h for h in cap.get("others") or [] if isinstance(h, dict)]
    if others:  # other engines' entries in the GPU ledger: who, not advice it cannot follow
        from gridrun.engine.entries import who

        return (text + ", by other gridrun engines too: " + ", ".join(
            f"{who(h)} holds {h.get('threads')}" for h in others) + "; it and the runs after "
            "it wait until they end")
    text += f": threads cap CPU runs at {at_once} at once"
    if isinstance(slots, int) and at_once < slots:
        text += (f" (cpu_slots = {slots} is an upper bound; the default threads = \"auto\", one a "
                 f"run, runs {slots} at once)")
    return text
