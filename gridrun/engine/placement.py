"""Which queued runs start now, and on which slots: a pure function of the queue (in
its order), the engine's slots, those in use and the CPU threads held; the scheduler
carries the plan out.

- A run on `devices` = n takes n slots at once (a gang: `base.gang`), on n distinct
  GPUs (with runs_per_gpu > 1, gpu0.0 and gpu0.1 are one GPU), and is launched once
  on the one slot that stands for them; on CPU slots it holds n times its threads
  against the usable cores (`slots.fits`).
- Queue order is kept: the first run that cannot start now (too few free slots, or
  its threads do not fit) holds every later one back, and the slots that free up are
  kept for it.
- A run that can never start on these slots (more devices than slots, or than
  distinct GPUs) holds nothing back: it is refused with one line saying what to do.
- The slots of a GPU others take (`avoid`, engine/foreign.py) are offered to no run;
  runs already there go on.
- With each GPU's room known (engine/packing.py), a run also needs its budget free on
  each GPU it takes, and goes where it fits best (the least room that holds it); one
  whose shape was never measured (`runs_per_gpu = "auto"`) takes a GPU nobody commits
  anything on, and all of it.

On Ray a run's n slots are n GPUs of one node (a node's slots name it), as on one
machine: its ranks meet on that node (backends/ray/gangs.py reserves their CPUs there).
Where a slot is a job (SLURM) the scheduler asks for one slot a run: the job asks SLURM
for the run's devices.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gridrun.engine.backends.base import Slot, gang
from gridrun.engine.backends.slots import fits
from gridrun.engine.packing import Room, commit, gib
from gridrun.train import threads

WORKERS_AUTO = 2  # the cores a packed GPU run's num_workers = "auto" is counted for


@dataclass(frozen=True)
class Want:
    """What one queued run asks for."""

    run_id: str
    devices: int = 1  # slots it takes at once
    threads: int = 0  # CPU threads each of its processes holds against the cores (0: none)
    budget: int | float | None = 0  # what it commits per GPU (packing.Book.budget); 0: nothing


@dataclass
class Plan:
    starts: list[tuple[str, Slot]] = field(default_factory=list)  # in queue order
    refused: list[tuple[str, str]] = field(default_factory=list)  # run id, the line it fails with
    cap: dict[str, Any] | None = None  # the first run's threads do not fit (scheduler.CPU_CAP)
    short: dict[str, Any] | None = None  # too few free slots for the first run (SLOTS_WAIT)
    taken: dict[str, Any] | None = None  # the first run would start on GPUs others take (FOREIGN)
    memory: dict[str, Any] | None = None  # no GPU has room for the first run (packing.STATE)
    commits: dict[str, int] = field(default_factory=dict)  # run id -> bytes it commits per GPU


def gpu_of(slot: Slot) -> Any:
    """Which GPU a plain slot is on (None on a CPU slot): runs_per_gpu slots share one."""
    return None if slot.gpu is None else (slot.device or slot.gpu)


def never(devices: int, slots: Sequence[Slot]) -> str | None:
    """Why a run on `devices` can never start on `slots` (one line: what to do), or None."""
    if devices <= 1:
        return None
    if any(s.node is not None for s in slots):
        return _never_on_nodes(devices, slots)
    gpus = list(dict.fromkeys(g for s in slots if (g := gpu_of(s)) is not None))
    if gpus and devices > len(gpus):
        shared = f", {len(slots)} slots" if len(slots) > len(gpus) else ""
        return (f"devices = {devices} needs {devices} distinct GPUs and this engine has "
                f"{len(gpus)} (GPUs {', '.join(map(str, gpus))}{shared}): lower devices or give "
                "the engine more GPUs ([engine] gpus)")
    if not gpus and devices > len(slots):
        return (f"devices = {devices} needs {devices} slots and this engine has {len(slots)} "
                f"(cpu_slots = {len(slots)}): lower devices or raise cpu_slots")
    return None


def _never_on_nodes(devices: int, slots: Sequence[Slot]) -> str | None:
    """`never` on a Ray cluster: a run's devices are all on one node, so the largest
    node (by distinct GPUs, else slots) decides."""
    nodes: dict[Any, list[Slot]] = {}
    for slot in slots:
        nodes.setdefault(slot.node, []).append(slot)
    units = {node: free_units(held) for node, held in nodes.items()}
    largest = max(units, key=lambda node: units[node])
    if devices <= units[largest]:
        return None
    gpus = any(gpu_of(s) is not None for s in slots)
    unit, more = ("distinct GPUs", "GPUs") if gpus else ("slots", "CPUs")
    name = nodes[largest][0].name.partition(":")[0]
    return (f"devices = {devices} needs {devices} {unit} on one Ray node (its ranks share a "
            f"machine) and the largest of the {len(nodes)} nodes, {name}, has "
            f"{units[largest]}: lower devices to at most {units[largest]}, or add a node "
            f"with {devices} {more} to the cluster")


def pick(free: Sequence[Slot], devices: int, fit: Mapping[Any, int] | None = None
         ) -> list[Slot] | None:
    """`devices` of the free slots, each on a GPU of its own, all on one machine (a Ray
    node's slots name it); None if too few. In slot order, or with `fit` (GPU -> the
    room it would leave) only on those GPUs, the tightest first."""
    if fit is not None:
        free = sorted((s for s in free if gpu_of(s) in fit), key=lambda s: fit[gpu_of(s)])
    for node in dict.fromkeys(s.node for s in free):
        if (chosen := _pick_on([s for s in free if s.node == node], devices)) is not None:
            return chosen
    return None


def _pick_on(free: Sequence[Slot], devices: int) -> list[Slot] | None:
    chosen: list[Slot] = []
    gpus = set()
    for slot in free:
        gpu = gpu_of(slot)
        if gpu is not None and gpu in gpus:
            continue
        gpus.add(gpu)
        chosen.append(slot)
        if len(chosen) == devices:
            return chosen
    return None


def free_units(free: Sequence[Slot]) -> int:
    """How many devices the free slots offer at once: slots, or distinct GPUs."""
    gpus = {gpu_of(s) for s in free}
    return len(free) if gpus <= {None} else len(gpus - {None})


def too_big(want: Want, rooms: Mapping[Any, Room] | None) -> str | None:
    """Why a run's budget can never fit on these GPUs (one line), or None."""
    if not rooms or not isinstance(want.budget, int) or isinstance(want.budget, bool):
        return None
    largest = max(r.total for r in rooms.values())
    if want.budget <= largest:
        return None
    return (f"its memory budget, {gib(want.budget)}, is more than any of this engine's GPUs has "
            f"({gib(largest)}): lower gpu_memory, or run it where the GPUs are larger")


def fitting(want: Want, rooms: Mapping[Any, Room] | None) -> tuple[dict[Any, int] | None,
                                                                   dict[Any, int]]:
    """({GPU: the room left once `want` is there} for the GPUs it fits, {GPU: bytes it
    would commit}); (None, {}) without rooms to go by or a budget to place."""
    if rooms is None or want.budget == 0:
        return None, {}
    fit, bytes_ = {}, {}
    for gpu, room in rooms.items():
        if (n := commit(want.budget, room)) is not None:
            fit[gpu], bytes_[gpu] = room.free - n, n
    return fit, bytes_


def plan(queue: Iterable[Want], slots: Sequence[Slot], used: Iterable[str],
         holding: Iterable[int], cores: int, avoid: Collection[Any] = (),
         rooms: Mapping[Any, Room] | None = None) -> Plan:
    """The runs of `queue` (in queue order) that start now on the free slots, those
    refused for good, and why the first one left waits (its slots, its threads, GPUs
    others take, or memory). `avoid`: the GPUs (`gpu_of` a slot) no new run starts on;
    `rooms`: each GPU's memory room (None: slots alone decide)."""
    rooms = dict(rooms) if rooms is not None else None
    used = set(used)
    unused = [s for s in slots if s.name not in used]
    free = [s for s in unused if gpu_of(s) is None or gpu_of(s) not in avoid]
    holding = list(holding)
    out = Plan()
    for want in queue:
        why = never(want.devices, slots) or too_big(want, rooms)
        if why:
            out.refused.append((want.run_id, why))
            continue
        fit, bytes_ = fitting(want, rooms)
        chosen = pick(free, want.devices, fit)
        if chosen is None and fit is not None and pick(free, want.devices) is not None:
            out.memory = {"run_id": want.run_id, "need": want.budget if isinstance(
                want.budget, int) else None, "free": max(
                (r.free for g, r in (rooms or {}).items() if g not in avoid), default=0)}
            break
        if chosen is None:
            if free:  # slots are free, but not enough for it: they are kept for it
                gpus = any(gpu_of(s) is not None for s in slots)
                out.short = {"run_id": want.run_id, "devices": want.devices,
                             "free": free_units(free), "unit": "GPUs" if gpus else "slots"}
            if len(unused) > len(free) and pick(unused, want.devices) is not None:
                out.taken = {"run_id": want.run_id, "gpus": list(dict.fromkeys(
                    s.name.partition(".")[0] for s in unused if s not in free))}
            break
        need = want.devices * want.threads
        if need and not fits(holding, need, cores):
            out.cap = {"run_id": want.run_id, "threads": need, "holding": sum(holding),
                       "cores": cores, "cpu_slots": len(slots)}
            break
        out.starts.append((want.run_id, gang(chosen)))
        for gpu in {gpu_of(s) for s in chosen} & set(bytes_):
            room = rooms[gpu]  # what this run commits is no longer there for the next
            rooms[gpu] = room.less(bytes_[gpu])
            out.commits[want.run_id] = min(bytes_[gpu], out.commits.get(want.run_id, bytes_[gpu]))
        free = [s for s in free if s not in chosen]
        unused = [s for s in unused if s not in chosen]
        holding.append(need)
    return out


GANGS = ("local", "ray")  # the backends whose runs take a slot a device (a gang)


def devices_wanted(config: Any, backend: str) -> int:
    """The slots a run takes at once: its `devices` where a slot is a GPU or a CPU (the
    `backend`'s name is in GANGS: this machine, a Ray node); one where a slot is a job
    (SLURM's job asks SLURM for the devices)."""
    if backend not in GANGS:
        return 1
    try:
        return max(1, int(((config or {}).get("trainer") or {}).get("devices", 1)))
    except (TypeError, ValueError):
        return 1


def threads_held(config: Any, slot: Slot | None, cores: int, packed: bool = False) -> int:
    """The CPU threads a run holds on `slot` of this machine: its resolved `threads` on a
    CPU slot, once per member of a gang, else 0 (a GPU slot). `packed` (GPU runs packed
    by memory): on a GPU slot too, its threads and its DataLoader workers (WORKERS_AUTO
    for "auto", which it measures only once started)."""
    gpu = slot is not None and slot.gpu is not None
    if slot is None or (gpu and not packed):
        return 0
    trainer = (config or {}).get("trainer") or {}
    try:
        each = threads.resolve(trainer.get("threads", threads.AUTO), gpu=gpu, cores=cores)
    except (TypeError, ValueError):
        each = cores
    if gpu:
        workers = trainer.get("num_workers", 0)
        each += WORKERS_AUTO if workers == "auto" else workers if isinstance(workers, int) else 0
    return each * len(slot.parts)


def recovered(slots: Sequence[Slot], used: Iterable[str], stored: str | None,
              devices: int) -> Slot | None:
    """The slot a run adopted after an engine restart holds: the one the store names
    ("gpu0+gpu1") when all of it is free, else what `pick` gives, else as many free slots
    as there are (its process runs anyway: every slot it holds is counted), else None."""
    used = set(used)
    free = {s.name: s for s in slots if s.name not in used}
    names = (stored or "").split("+")
    if len(names) == devices and all(n in free for n in names):
        return gang([free[n] for n in names])
    chosen = pick(list(free.values()), devices) or list(free.values())[:devices]
    return gang(chosen) if chosen else None


def slots_wait_note(wait: Mapping[str, Any]) -> str:
    """`engine status`'s line for a queue held for its first run's devices (the
    scheduler's SLOTS_WAIT state: run id, devices, free slots or GPUs)."""
    n, unit = wait.get("devices"), wait.get("unit", "slots")
    return (f"slots: waiting for {n} free {unit} for {wait.get('run_id')} (devices = {n}): "
            f"{wait.get('free')} free; the runs queued after it wait too")
