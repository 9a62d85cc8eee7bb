"""Runs packed on a GPU by their memory, and the GPU memory every gridrun engine on the
machine has committed (engine/ledger.py).

- A run's **shape** is its config without its seed, its experiment's name and the keys
  that never change the memory a run takes (learning rate, schedule, run length, ...):
  runs of one shape take the same memory, so one measurement serves them all.
- A run's **budget** (bytes, the CUDA context included) is, in this order: its
  `gpu_memory` key; the need it measured when it outgrew its budget (retried once,
  `retry_budget`); the largest need measured by a run of its shape (`need_of`), plus
  MARGIN. Under `runs_per_gpu = "auto"` a run of an unknown shape has none and starts
  alone on a GPU, committing all of it; under an integer `runs_per_gpu` = n each run
  commits a 1/n share of its GPU (never enforced: that is what n always meant).
- A GPU's **room** is its memory less what this engine's runs commit, what other
  engines commit (the ledger, each entry at most the GPU's size) and every byte other
  people's processes use; and never more than what NVML says is free, less HEADROOM:
  NVML is the truth, an entry only adds. `placement.plan` places by it, best fit first.
  A share of a GPU (an integer runs_per_gpu) is kept apart from other engines' shares
  only (`Room.booked`): beside others' processes it is what `foreign` says.

The run enforces its own budget (train/loop/memory.py, GRIDRUN_MEMORY_BUDGET): one that
outgrows it fails alone and the engine retries it once with the need it measured.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gridrun.engine.entries import who
from gridrun.engine.foreign import gpu_keys
from gridrun.spec.keys import TRAINER_KEYS
from gridrun.train.loop.memory import CONTEXT  # the run's: its budget less this caps the allocator

MARGIN = 0.10  # over a measured need: allocator fragmentation, a longer batch
RETRY = 0.50  # over the need a run measured when it outgrew its budget
ROUND = 64 << 20  # budgets are whole multiples of this
HEADROOM = 256 << 20  # kept free of what NVML reports: growth between samples, a new context
GIB = 1 << 30
# trainer keys that change what a run computes but never how much memory it takes
MEMORY_NEUTRAL = frozenset({
    "epochs", "max_steps", "lr", "nesterov", "betas", "weight_decay", "schedule", "warmup",
    "min_lr", "step_size", "gamma", "clip_grad", "eval_every", "log_every",
    "early_stop_patience", "early_stop_metric", "vary", "seed_init", "seed_order",
    "seed_augment", "seed_model", "shuffle", "dropout_layers"})
STATE = "gpu_memory"  # store state: the memory book for `engine status` and the interface


def shape(config: Mapping[str, Any]) -> str:
    """The run's shape: a hash of what decides its memory (task, task keys, the trainer
    keys but the MEMORY_NEUTRAL ones and those outside the run id, bar activation
    checkpointing, which does change memory)."""
    trainer = {k: v for k, v in (config.get("trainer") or {}).items()
               if k not in MEMORY_NEUTRAL and (k == "checkpoint_modules" or k not in TRAINER_KEYS
                                               or TRAINER_KEYS[k].affects_results)}
    blob = json.dumps({"task": config.get("task"), "task_args": config.get("task_args") or {},
                       "trainer": trainer}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def rounded(n: float) -> int:
    return int(math.ceil(n / ROUND) * ROUND)


def measured(summary: Mapping[str, Any] | None) -> int | None:
    """The memory a run took, from its summary: on a GPU the larger of the allocator's
    reserved and allocated peaks plus the context, or what it needed when it outgrew its
    budget; on the CPU (stand-in GPUs) its peak resident memory. None before a first step."""
    s = summary or {}
    over = s.get("memory_needed_bytes")
    if not (isinstance(s.get("step"), int) and s["step"] >= 1) and not over:
        return None  # it never trained a step: what it took says nothing of its need
    nums = [v for k in ("peak_reserved_bytes", "peak_memory_bytes")
            if isinstance(v := s.get(k), int | float) and v > 0]
    cuda = str(s.get("device") or "").startswith("cuda")
    need = max(nums) + (CONTEXT if cuda else 0) if nums else None
    if isinstance(over, int | float) and over > 0:
        need = max(need or 0, int(over))
    return int(need) if need else None


def user_budget(config: Mapping[str, Any]) -> int | None:
    """The run's `gpu_memory` key in bytes, or None ("auto")."""
    value = (config.get("trainer") or {}).get("gpu_memory", "auto")
    return rounded(value * GIB) if isinstance(value, int | float) and value > 0 else None


def retry_budget(needed: int) -> int:
    """The budget of a run retried after it outgrew its own, from what it needed then."""
    return rounded(needed * (1 + RETRY))


@dataclass(frozen=True)
class Room:
    """One GPU's memory as placement sees it (bytes)."""

    total: int
    free: int  # total less every commitment and others' processes; at most NVML's free
    empty: bool  # no run of this engine nor of another engine is committed there
    booked: int | None = None  # total less the commitments only (a share's room); None: free

    def less(self, n: int) -> Room:
        """The room once a run committing `n` bytes is placed there."""
        return Room(self.total, self.free - n, False, None if self.booked is None else self.booked - n)


class Book:
    """What this engine knows of GPU memory: each shape's measured need, the GPUs'
    sizes, its runs' commitments; `room` folds in other engines' and people's use."""

    def __init__(self, runs_per_gpu: int | str = 1):
        self.auto = runs_per_gpu == "auto"
        self.share = 1.0 if self.auto else 1.0 / max(1, int(runs_per_gpu))
        self.needs: dict[str, int] = {}  # shape -> the largest need measured
        self.totals: dict[Any, int] = {}  # GPU (placement.gpu_of) -> bytes
        self.keys: dict[Any, str] = {}  # GPU -> its ledger key (UUID, else "index:N")
        self.used: dict[Any, int] = {}  # GPU -> the memory NVML says is used there

    def learn(self, config: Mapping[str, Any] | None, summary: Mapping[str, Any] | None) -> None:
        """A run ended: what it measured serves every run of its shape."""
        need = measured(summary)
        if config and need:
            key = shape(config)
            self.needs[key] = max(need, self.needs.get(key, 0))

    def need_of(self, config: Mapping[str, Any]) -> int | None:
        return self.needs.get(shape(config))

    def budget(self, config: Mapping[str, Any], adjustments: Iterable[Mapping[str, Any]] = ()
               ) -> int | float | None:
        """What the run commits on each GPU it takes: bytes; a share of the GPU (a
        float, integer runs_per_gpu); None: unknown, it starts alone (auto)."""
        retried = [a["budget_bytes"][1] for a in adjustments
                   if a.get("kind") == "budget" and isinstance(a.get("budget_bytes"), list)]
        if retried:  # it outgrew its budget once: what it measured then, whatever else says
            return self.capped(int(max(retried)))
        if (mine := user_budget(config)) is not None:
            return mine  # the user's word: refused if no GPU is that large (placement.too_big)
        if not self.auto:
            return self.share
        need = self.need_of(config)
        return self.capped(rounded(need * (1 + MARGIN))) if need else None

    def largest(self) -> int | None:
        return max(self.totals.values(), default=None)

    def capped(self, n: int) -> int:
        """A budget the engine worked out, at most the largest GPU: a shape that fills a
        GPU then runs alone on one, held to all of it."""
        return min(n, self.largest() or n)

    def whole(self, budget: Any) -> bool:
        """Whether `budget` is (nearly) all of the largest GPU: a run over it needs a
        smaller batch, not a larger budget."""
        big = self.largest()
        return bool(big and isinstance(budget, int | float) and budget >= big - HEADROOM - ROUND)

    def sizes(self, gpus: Iterable[Mapping[str, Any]]) -> None:
        """The GPUs' sizes, used memory and ledger keys from a telemetry sample's `gpus`."""
        for g in gpus:
            index, total, used = g.get("index"), g.get("mem_total_bytes"), g.get("mem_used_bytes")
            if isinstance(index, int) and isinstance(total, int) and total > 0:
                for key in gpu_keys(index, g.get("uuid"), g.get("node")):
                    self.totals[key] = total
                    self.keys[key] = g.get("uuid") or (f"{g['node']}:gpu{index}" if g.get("node")
                                                       else f"index:{index}")
                    if isinstance(used, int) and used >= 0:
                        self.used[key] = used
                    else:  # not reported: commitments and processes alone bound the room
                        self.used.pop(key, None)

    def rooms(self, ours: Mapping[Any, int], others: Mapping[str, int],
              foreign: Mapping[Any, int], gpus: Iterable[Any],
              runs: Mapping[str, tuple[int, int]] | None = None) -> dict[Any, Room] | None:
        """Each GPU's room: `ours` (GPU -> bytes our runs commit), `others` (ledger key ->
        bytes other engines commit, each entry already capped at the GPU's size),
        `foreign` (GPU -> every byte others' processes use), `runs` (ledger key -> what
        the runs of every committer, us included, are listed using within what they
        commit, and beyond it). None when a GPU's size is unknown: slots alone decide.

        Occupied is what is committed plus whatever else is used: every listed foreign
        byte and the runs' use beyond their commitments, or, where NVML reports the GPU's
        used memory, all of that less the runs' use within their commitments (counted
        once), and HEADROOM. So no room is more than NVML says is free, and a commitment
        not yet in use is never mistaken for free memory beside memory NVML lists nowhere."""
        out = {}
        for gpu in gpus:
            total = self.totals.get(gpu)
            if total is None:
                return None
            # a claim beyond the GPU says nothing more than "all of it"
            mine, theirs = ours.get(gpu, 0), min(total, others.get(self.keys[gpu], 0))
            covered, excess = (runs or {}).get(self.keys[gpu], (0, 0))
            booked = total - mine - theirs
            uncommitted = foreign.get(gpu, 0) + excess
            if gpu in self.used:  # whatever any entry says, what NVML reports used is used
                uncommitted = max(uncommitted, self.used[gpu] - covered + HEADROOM)
            out[gpu] = Room(total, booked - uncommitted, mine == 0 and theirs == 0, booked)
        return out


def commit(budget: int | float | None, room: Room) -> int | None:
    """The bytes a run commits on a GPU with `room`, or None when it does not fit."""
    if budget is None:  # unknown shape: alone, and all of the GPU
        return room.free if room.empty and room.free > 0 else None
    if isinstance(budget, int):
        if budget <= room.free:
            return budget
        # (nearly) a whole GPU: alone there, held to what NVML leaves free (never waiting
        # for room a GPU the driver uses a little of can never have)
        whole = room.empty and budget >= room.total - HEADROOM - ROUND
        return room.free if whole and room.free > 0 else None
    # a share of the GPU (an integer runs_per_gpu): slots that other engines' shares
    # keep apart; others' processes are what [engine] foreign decides
    need = int(room.total * budget)
    return need if need <= (room.free if room.booked is None else room.booked) else None


def gib(n: Any) -> str:
    return f"{n / GIB:.1f} GiB" if isinstance(n, int | float) else "?"


def book_lines(state: Any) -> list[str]:
    """`engine status`'s lines for the memory book (STATE): a line per GPU, and why the
    first queued run waits for memory (naming the other engines' entries that hold it);
    [] for anything else."""
    if not isinstance(state, dict) or not isinstance(state.get("gpus"), list):
        return []
    out, names = [], {}
    for g in state["gpus"]:
        if isinstance(g, dict):
            out.append(gpu_line(g))
            if isinstance(g.get("gpu"), int | str):  # a key written by hand may be a list
                names.setdefault(g["gpu"], gpu_name(g))
    for line in [state.get("ledger"), *(state.get("notes") or [])]:
        if isinstance(line, str):
            out.append(line)
    wait = state.get("waits")
    if isinstance(wait, dict) and isinstance(wait.get("busy"), str):
        out.append(f"queue: {wait['busy']}")
    elif isinstance(wait, dict):
        need = wait.get("need")
        held = f"; other gridrun engines commit {gib(wait['others'])}" if wait.get("others") else ""
        named = [f"{who(h)} commits {gib(h.get('bytes'))} on {holder_gpu(h, names)}"
                 for h in wait.get("holders") or [] if isinstance(h, dict)]
        held += f": {', '.join(named)}" if named and held else ""
        if isinstance(need, int):
            out.append(f"queue: no GPU has {gib(need)} free for {wait.get('run_id')} (the most "
                       f"free: {gib(wait.get('free'))}{held}): it and the runs after it wait")
        else:
            out.append(f"queue: {wait.get('run_id')} waits for a GPU of its own (its shape was "
                       f"never measured{held}): it and the runs after it wait; gpu_memory = N "
                       "(GiB) in the file lets it start beside others")
    return out


def gpu_name(g: Mapping[str, Any]) -> str:
    """A GPU of the book for people: its name where the book gives one ("node2:gpu0" on a
    Ray node, whose key is its UUID), a key that is a name already (a Ray node's GPU
    without a UUID), else "gpu" and its key ("gpu1")."""
    name, key = g.get("name"), g.get("gpu")
    if isinstance(name, str) and name:
        return name
    return key if isinstance(key, str) and ":gpu" in key else f"gpu{key}"


def holder_gpu(h: Mapping[str, Any], names: Mapping[Any, str]) -> str:
    """The GPU another engine's entry holds memory on, named as the book's line for it."""
    key = h.get("gpu")
    return (names.get(key) if isinstance(key, int | str) else None) or gpu_name(h)


def gpu_line(g: dict[str, Any]) -> str:
    """One GPU of the book: what is committed and used there, and what is free."""
    if not isinstance(g.get("total"), int):
        return (f"{gpu_name(g)}: its memory size is unknown (NVML does not report it): runs "
                'are placed there by slots alone, one at a time under runs_per_gpu = "auto"')
    runs = g.get("runs") or 0
    nvml = f" (NVML reports {gib(g['used'])} used)" if isinstance(g.get("used"), int) else ""
    return (f"{gpu_name(g)}: {gib(g.get('total'))}: {gib(g.get('ours'))} committed by "
            f"{runs} run{'s' * (runs != 1)} here, {gib(g.get('others'))} by other gridrun "
            f"engines, {gib(g.get('foreign'))} used by others' processes; "
            f"{gib(max(0, g.get('free') or 0))} free{nvml}")
