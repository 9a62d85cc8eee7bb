"""The `devices` key against the rest of the file, run by run: it must divide
`accumulate`, suit the backend, and fit the file's `[engine]` table. Each problem is
said once, where the run's `devices` is written (a grid, an ablation, the experiment,
[defaults]), so a value every experiment inherits is one problem at its line.

The fit is the rule the engine applies at launch (engine/placement.never: a run on n
devices takes n distinct GPUs, or n CPU slots), checked when a file is planned or
queued, for what the file makes certain: a backend other than local has limits of its
own (a Ray run's devices are GPUs of one node, which only the engine sees), and
`gpus = "auto"` written out leaves the GPUs to the machine the engine starts on. With
no `gpus` key the engine takes this machine's GPUs, else its CPU slots: the caller says
how many GPUs an engine started here could have (spec reads no hardware).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gridrun.spec.errors import LineIndex
from gridrun.spec.model import EngineConfig, ExperimentSpec, RunSpec
from gridrun.spec.validate import Checker, key_where


def written_at(lines: LineIndex, exp: ExperimentSpec, run: RunSpec, key: str
               ) -> tuple[str, ...] | None:
    """Where the value `run` has for `key` is written, by expand's precedence (a grid or
    zip cell, the run's ablation, its search's params, the experiment, [defaults]); None
    where the key keeps its default."""
    path = ("experiments", exp.name)
    if key in exp.grid or key in exp.zip:
        return (*path, "grid" if key in exp.grid else "zip", key)
    if key in exp.ablations.get(run.ablation, {}):
        return (*path, "ablations", run.ablation, key)
    if exp.search is not None and any(p.name == key for p in exp.search.params):
        return (*path, "search", "params", key)
    if key not in exp.keys:
        return None
    if (*path, key) in lines.lines or ("defaults", key) not in lines.lines:
        return (*path, key)
    return ("defaults", key)


@dataclass(frozen=True)
class Room:
    """The most devices one run can have under an [engine] table, and how to say so."""

    most: int  # what the engine gives a run: the advice
    unit: str  # "CPU slots" | "distinct GPUs"
    has: str  # what the table (or this machine) gives, e.g. "[engine] has cpu_slots = 2"
    change: str  # the way out other than fewer devices, e.g. "raise cpu_slots to {devices}"
    certain: int = 0  # more devices than this can never fit (most, unless set)

    def refuses(self, devices: int) -> bool:
        return devices > max(self.most, self.certain)

    def refusal(self, devices: int) -> str:
        return (f"devices = {devices} needs {devices} {self.unit} at once and {self.has}: lower "
                f"devices to at most {self.most} or {self.change.format(devices=devices)}")


def room(engine: EngineConfig, gpus_written: bool, gpus_here: Callable[[], int]
         ) -> Room | None:
    """What the engine can give one run, where the file makes it certain (None where only
    the engine can know). `gpus_written`: the table has a `gpus` key; `gpus_here`: the
    most GPUs an engine started on this machine could take."""
    if engine.backend != "local":
        return None
    slots = f"[engine] has cpu_slots = {engine.cpu_slots}"
    more_slots = "raise cpu_slots to {devices}"
    if isinstance(engine.gpus, tuple) and engine.gpus:
        named = len(set(engine.gpus))  # runs_per_gpu slots of one GPU are one device
        return Room(named, "distinct GPUs", f"[engine] gpus = {list(engine.gpus)} names {named}",
                    "name {devices} GPUs in gpus")
    if isinstance(engine.gpus, tuple):
        return Room(engine.cpu_slots, "CPU slots", f"{slots} (gpus = [])", more_slots)
    if gpus_written:  # "auto" written out: the GPUs of the machine the engine starts on
        return None
    gpus = gpus_here()
    if not gpus:
        return Room(engine.cpu_slots, "CPU slots", f"{slots} (this machine has no GPU)",
                    more_slots)
    # an engine started here with no GPU visible (CUDA_VISIBLE_DEVICES="") has its CPU
    # slots instead: only more devices than either is certain never to fit
    return Room(gpus, "distinct GPUs", f"this machine gives the engine {gpus} ([engine] has "
                "no gpus key)", "run the engine where it has {devices} GPUs",
                certain=engine.cpu_slots)


def check_devices(c: Checker, experiments: Iterable[tuple[ExperimentSpec, list[RunSpec]]],
                  engine: EngineConfig | None, *, gpus_written: bool = False,
                  gpus_here: Callable[[], int] | None = None) -> None:
    """Every run's `devices` checked against its `accumulate` and the backend, and, given
    `gpus_here` (the commands that queue: `plan`, `queue`, `run`; a foreground `gridrun
    train` takes none of the engine's slots), against what the engine can give it."""
    limit: Room | None = None
    asked = False  # what the engine can give is found once, at the first run that asks
    worst: dict[tuple[str, ...], tuple[int, str]] = {}  # where -> most devices refused, exp
    for exp, runs in experiments:
        divides = True  # said once an experiment: its other cells fail alike
        for run in runs:
            devices = run.trainer.get("devices", 1)
            if devices <= 1:
                continue
            where = written_at(c.lines, exp, run, "devices") or ("experiments", exp.name)
            if divides:
                divides = _divides(c, exp, run, devices, where)
            if engine is None or gpus_here is None:
                continue
            if not asked:
                limit, asked = room(engine, gpus_written, gpus_here), True
            if limit is not None and limit.refuses(devices):
                worst[where] = max(worst.get(where, (0, "")), (devices, exp.name))
    for where, (devices, exp_name) in worst.items():
        assert limit is not None
        c.add(limit.refusal(devices), *where, **key_where(exp_name, where))


def _divides(c: Checker, exp: ExperimentSpec, run: RunSpec, devices: int,
             where: tuple[str, ...]) -> bool:
    """Whether the run's world size divides its micro-batches (each rank takes an equal
    share); when not, it is said in the cell's words, unless both keys come from
    [defaults] (every experiment's runs then fail alike: one problem, at its line)."""
    accumulate: Any = run.trainer.get("accumulate", 1)
    if accumulate % devices == 0:
        return True
    fits = [d for d in range(1, accumulate + 1) if accumulate % d == 0]
    inherited = where[0] == "defaults" and (
        written_at(c.lines, exp, run, "accumulate") or ("defaults",))[0] == "defaults"
    cell = "" if inherited else f" ({run.variant or 'baseline'})"
    c.add(f"devices = {devices} does not divide accumulate = {accumulate}{cell}: each device "
          f"takes an equal share of a step's micro-batches; use devices in {fits} or accumulate "
          f"a multiple of {devices}", *where, **key_where(exp.name, where))
    return False
