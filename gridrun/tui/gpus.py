"""The machine panel's GPUs, each told apart by what it is, never by its index alone.

On one machine a GPU is its index (`gpu0`). On a Ray cluster every node has a GPU 0, so
a GPU is its node and index (`node2:gpu0`) or its UUID. The telemetry sample, the running
runs' slots, the engine's FOREIGN state and its memory book each name a GPU their own way:

- the sample's `gpus`: {"index", "uuid", "node"} (engine/telemetry.py; "node" None here);
- its `processes`: {"pid", "gpu", "run_id"}, "gpu" the index here, the UUID on Ray;
- a slot: "gpu1", "node2:gpu1" (analysis/devices.slot_gpu_names reads it);
- FOREIGN's `gpus`: {"gpu": index, "uuid", "node"} (engine/foreign.py);
- the memory book's `gpus`: {"gpu": its key, "name"} (tui/memory.py reads it).

Here they meet on the sample's GPUs: by UUID first (two servers of one hostname each
have a `host:gpu0`), else by the name the panel shows (`GpuRow.label`), and by index on
one machine only. Everything comes from the store, which any process may have written:
what does not have the expected shape is left out, never an error. Nothing of the
engine is imported.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from gridrun.tui.memory import Book
from gridrun.tui.source import GpuRow

HISTORY = 60  # samples of utilisation kept per GPU: a minute


def node_of(g: Mapping[str, Any]) -> str | None:
    """The Ray node a GPU entry is on, or None (one machine, or not a name)."""
    node = g.get("node")
    return node if isinstance(node, str) and node else None


def name(node: str | None, index: Any) -> str:
    """A GPU for people, as engine/foreign.gpu_name writes it: "gpu0", "node2:gpu0"."""
    return f"{node}:gpu{index}" if node else f"gpu{index}"


def uuid_of(g: Mapping[str, Any]) -> str | None:
    """A GPU entry's UUID ("GPU-..."), or None."""
    uuid = g.get("uuid")
    return uuid if isinstance(uuid, str) and uuid else None


def keys(g: Mapping[str, Any]) -> tuple[Any, ...]:
    """Every way the engine's states may name the sample's GPU `g`, the surest first: its
    UUID, its name and, on one machine only, its index."""
    node, index, uuid = node_of(g), g.get("index"), uuid_of(g)
    out: list[Any] = ([uuid] if uuid else []) + [name(node, index)]
    if node is None and isinstance(index, int) and not isinstance(index, bool):
        out.append(index)
    return tuple(out)


Taken = dict[Any, tuple[str | None, tuple[bool, tuple[str, ...]]]]


def taken(state: Any) -> Taken:
    """GPU (its UUID and its name) -> (its UUID, (shared, "alice (pid 4242, 20.0 GiB)" per
    process))
    for the GPUs other users' processes take, from the engine's FOREIGN state ({} for
    None or garbage)."""
    if not isinstance(state, dict) or not isinstance(state.get("gpus"), list):
        return {}
    out: Taken = {}
    for g in state["gpus"]:
        if isinstance(g, dict) and isinstance(g.get("processes"), list):
            said = (state.get("policy") == "share", tuple(
                f"{p.get('user') or '?'} " + (f"(pid {p['pid']}, " if isinstance(
                    p.get("pid"), int) else "(") + (f"{m / 2**30:.1f} GiB)" if isinstance(
                    m := p.get("mem_bytes"), int | float) else "memory n/a)")
                for p in g["processes"] if isinstance(p, dict)))
            for key in (uuid_of(g), name(node_of(g), g.get("gpu"))):
                if key is not None:
                    out.setdefault(key, (uuid_of(g), said))
    return out


def taken_of(table: Taken, g: Mapping[str, Any]) -> tuple[bool, tuple[str, ...]]:
    """What `table` (`taken`) says of the sample's GPU `g`: found by its UUID, else by its
    name where no UUID tells the two apart; (False, ()) when nobody else takes it."""
    uuid = uuid_of(g)
    for key in keys(g):
        if key in table and (uuid is None or table[key][0] in (None, uuid)):
            return table[key][1]
    return False, ()


def first(table: Mapping[Any, Any], g: Mapping[str, Any]) -> Any:
    """What `table` says of the sample's GPU `g` under the first of its `keys` it holds."""
    return next((table[k] for k in keys(g) if k in table), None)


def rows(sample: Mapping[str, Any], holders: Mapping[str, tuple[str, ...]], others: Taken, memory: Book,
         history: dict[str, deque[float]], new: bool) -> tuple[GpuRow, ...]:
    """The panel's rows for a telemetry sample: each GPU's runs (those whose process the
    engine saw on it, then those whose slot holds it: `holders`, by name), who else takes
    it (`others`: `taken`), its memory (`memory`) and its minute of utilisation (`history`,
    by UUID, else name; one more value when the sample is `new`)."""
    seen: dict[Any, dict[str, None]] = {}  # how a process names its GPU -> run ids
    for p in sample.get("processes") or []:
        if isinstance(p, dict) and p.get("run_id") is not None and \
                isinstance(gpu := p.get("gpu"), str | int):
            seen.setdefault(gpu, {})[p["run_id"]] = None
    out = []
    for g in sample.get("gpus") or []:
        if not isinstance(g, dict):
            continue
        node, label = node_of(g), name(node_of(g), g.get("index"))
        hist = history.setdefault(uuid_of(g) or label, deque(maxlen=HISTORY))
        if new:
            hist.append(g.get("util_percent") or 0.0)
        runs: dict[str, None] = {}
        for key in keys(g):
            runs.update(seen.get(key, {}))
        runs.update(dict.fromkeys(holders.get(label, ())))
        shared, procs = taken_of(others, g)
        out.append(GpuRow(index=g.get("index", 0), name=g.get("name") or "GPU",
                          util=g.get("util_percent"), mem_used=g.get("mem_used_bytes"),
                          mem_total=g.get("mem_total_bytes"), power=g.get("power_w"),
                          temp=g.get("temperature_c"), runs=tuple(runs), history=tuple(hist),
                          others=procs, shared=shared, memory=first(memory.gpus, g), node=node))
    return tuple(out)
