"""A run's devices, as every view reads them: how many it trains on (`devices`), how
they sum a step's gradients (`reduce`), and which GPUs its slot holds.

A run's resolved trainer keys hold `devices` and `reduce` (spec/keys.py); a run
queued before they existed lacks them and trained on one device, summed the one
way there was. The engine names the slot a run holds (engine/backends/base.py:
`Slot.name`, `gang`): "cpu0", "gpu1", "gpu1.0" (a share of GPU 1), and for a run on
several devices its members joined by "+": "cpu0+cpu1", "gpu0+gpu1",
"gpu0.0+gpu1.1"; on a Ray cluster each member leads with its node: "node2:gpu1",
"node2:gpu1.0", "node2:gpu0+node2:gpu1". The views read that name back here, never
importing the engine.
Pure functions: no torch, no store.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gridrun.spec.keys import REDUCE_DEFAULT, TRAINER_KEYS

DEVICES_DEFAULT = TRAINER_KEYS["devices"].default  # 1: every run before `devices`
# the keys that say how a run was spread over devices, and what a run without them did
DEFAULTS: dict[str, Any] = {"devices": DEVICES_DEFAULT, "reduce": REDUCE_DEFAULT}
GANG = "+"  # joins the members of a run's slot
_GPU = re.compile(r"gpu(\d+)(?:\.\d+)?")  # "gpu1" or "gpu1.0": GPU 1
_NODE_GPU = re.compile(r"(?:([^:+]+):)?gpu(\d+)(?:\.\d+)?")  # and "node2:gpu1": node2's GPU 1


def devices_of(trainer: Any) -> int:
    """How many devices a run trains on, from its trainer keys (`run.config["trainer"]`,
    or a frame's flat row); 1 for a run without the key, or with a value that is not
    a count (any JSON may have been stored)."""
    value = trainer.get("devices", DEVICES_DEFAULT) if isinstance(trainer, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return DEVICES_DEFAULT
    return value


def reduce_of(trainer: Any) -> str:
    """How a run sums a step's gradients over its devices ("ddp" or "invariant")."""
    value = trainer.get("reduce", REDUCE_DEFAULT) if isinstance(trainer, Mapping) else None
    return value if isinstance(value, str) and value else REDUCE_DEFAULT


def trainer_of(config: Any) -> Mapping[str, Any]:
    """A store row's config's trainer keys ({} when it has none)."""
    trainer = config.get("trainer") if isinstance(config, Mapping) else None
    return trainer if isinstance(trainer, Mapping) else {}


def members(slot: str | None) -> tuple[str, ...]:
    """The plain slots a slot's name holds: ("gpu0", "gpu1") for "gpu0+gpu1", ("cpu0",)
    for "cpu0"; () for no slot."""
    if not isinstance(slot, str) or not slot:
        return ()
    return tuple(m for m in slot.split(GANG) if m)


def slot_gpus(slot: str | None) -> tuple[int, ...]:
    """The GPUs a slot's name holds, in its order, each once: (0, 1) for "gpu0+gpu1" or
    "gpu0.0+gpu1.1"; () for a CPU slot, a foreground run or a name that is not one."""
    out: dict[int, None] = {}
    for member in members(slot):
        if (m := _GPU.fullmatch(member)) is not None:
            out[int(m.group(1))] = None
    return tuple(out)


def slot_gpu_names(slot: str | None) -> tuple[str, ...]:
    """The GPUs a slot's name holds, named as people read them, in its order, each once:
    ("gpu0", "gpu1") for "gpu0.0+gpu1.1"; ("node2:gpu0", "node2:gpu1") for a Ray gang
    ("node2:gpu0+node2:gpu1"), where every node has a GPU 0 and an index alone names
    none; () for a CPU slot, a foreground run or a name that is not one."""
    out: dict[str, None] = {}
    for member in members(slot):
        if (m := _NODE_GPU.fullmatch(member)) is not None:
            node, index = m.group(1), int(m.group(2))
            out[f"{node}:gpu{index}" if node else f"gpu{index}"] = None
    return tuple(out)
