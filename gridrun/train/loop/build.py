"""The build phase: from a run spec to everything its loop needs, made once.

`build` seeds, makes the task, the model and its optimizer, picks the precision
and works out how long the run is; it writes what it learns into the summary as
it goes, so a run that fails half-way built still says how far it got. The
`Setup` it returns is what the loop and its collaborators read and never
replace; the state that changes step by step is `state.TrainState`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from gridrun import randomness
from gridrun.spec import RunSpec, sources
from gridrun.spec.errors import suggest_metric
from gridrun.tasks import Task, resolve
from gridrun.train import environment, levers, loader_probe, switches, threads
from gridrun.train.data import count_samples, train_loader, val_loader
from gridrun.train.diagnostics import Diagnostics, model_facts
from gridrun.train.loop.probe import Probe
from gridrun.train.optim import build_optimizer
from gridrun.train.seeding import model_seed, seed_everything, set_determinism
from gridrun.train.world import SINGLE, World


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision != "auto":
        return precision
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


@dataclass(frozen=True, eq=False)
class Setup:
    """One run's built parts: fixed for the run, read by every phase."""

    cfg: Mapping[str, Any]  # the run's trainer keys
    seed: int
    seeds: Mapping[str, int]  # each source's seed (spec/sources.py): init, order, augment, model
    device: torch.device
    task: Task
    model: torch.nn.Module
    step_model: torch.nn.Module  # the model as the step calls it (compiled when asked)
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    autocast: Any  # a context manager: torch.autocast, or nothing for fp32
    precision: str
    diagnostics: Diagnostics
    val_data: DataLoader
    count_samples: Callable[[Any], int]
    steps_per_epoch: int
    total: int  # optimizer steps in the whole run
    metrics: Mapping[str, str]  # every metric a val line records: evaluate's, then derived
    metric: str  # the early-stop metric
    direction: str  # records.LOWER or records.HIGHER: which way `metric` improves
    world: World = SINGLE  # this process's rank among the run's devices

    @property
    def accumulate(self) -> int:
        return self.cfg["accumulate"]

    @property
    def local_accumulate(self) -> int:
        """The micro-batches of a step this rank trains."""
        return self.cfg["accumulate"] // self.world.size

    @property
    def batches_per_epoch(self) -> int:
        """The micro-batches an epoch trains on (a partial step's are never drawn)."""
        return self.steps_per_epoch * self.cfg["accumulate"]


def build(run: RunSpec, device: torch.device, summary: dict[str, Any], probe: Probe,
          warn: Callable[[str], None], world: World = SINGLE, cpu_threads: int = 1) -> Setup:
    """Seed, then build `run` on `device` computing with `cpu_threads` (train/loop/attempts.py
    decides them); `probe` sees the model before anything wraps it."""
    cfg = run.trainer
    threads.apply(cpu_threads)  # before anything computes: the thread count decides CPU bits
    summary["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if device.type == "cpu" and environment.gpus_given() is not None:  # only as stand-ins
        warn(f"CUDA_VISIBLE_DEVICES={environment.gpus_given()} are stand-ins "
             f"({environment.STAND_INS}=1): trained on the CPU")
    summary["determinism"] = set_determinism(cfg["deterministic"], compiled=cfg["compile"])
    # CPU kernels split their sums by thread: another count, other bits (gridrun repro sets it)
    summary["determinism"]["cpu_threads"] = torch.get_num_threads()
    summary["environment"] = environment.describe(device, summary["determinism"])
    torch.autograd.set_detect_anomaly(cfg["detect_anomaly"])
    seeds, separate, off = randomness_of(run, summary)
    randomness.configure(off)  # before the factory: a task may ask while it builds
    seed_everything(seeds["init"])
    task: Task = resolve(run.task)(**run.task_args)
    model = task.model.to(device)
    if "dropout" in off and not switches.dropout_off(model):
        warn("dropout_layers = false changed nothing: no dropout module of the model drops "
             "anything")
    summary["parameters"], summary["dtype"] = model_facts(model)
    levers.checkpoint_modules(model, cfg["checkpoint_modules"])
    probe.attach(model)
    precision = resolve_precision(cfg["precision"], device)
    summary["precision"] = precision
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = (torch.autocast(device.type, dtype=dtype) if dtype else nullcontext())
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    optimizer = build_optimizer(model.parameters(), cfg)
    step_model = levers.compiled(model, cfg)
    if world.size > 1 and not world.invariant:  # "ddp": PyTorch's own sum over the ranks
        from torch.nn.parallel import DistributedDataParallel

        step_model = DistributedDataParallel(
            step_model, device_ids=[device.index] if device.type == "cuda" else None)
    diagnostics = Diagnostics(model, device, cfg["clip_grad"])
    accumulate, batch_size = cfg["accumulate"], cfg["batch_size"]
    batches = len(task.train_data) // batch_size if cfg.get("drop_last", True) else (
        -(-len(task.train_data) // batch_size))  # the last, partial batch too
    steps_per_epoch = batches // accumulate
    if steps_per_epoch < 1:
        raise ValueError(f"the training set has {len(task.train_data)} samples: fewer than one "
                         f"step of batch_size x accumulate = {batch_size * accumulate}")
    total = steps_per_epoch * cfg["epochs"]
    if cfg["max_steps"]:
        total = min(total, cfg["max_steps"])
    summary["total_steps"] = total
    if (problem := task.derived_problem()) is not None:
        raise ValueError(f"task {run.task!r}: {problem}")
    metrics = task.all_metrics()  # evaluate's, then the derived ones
    metric = cfg["early_stop_metric"] or next(iter(task.metrics))
    if metric not in metrics:
        guess = suggest_metric(metric, metrics)
        raise ValueError(f"early_stop_metric {metric!r} is not a metric of task {run.task!r}: "
                         f"it reports {', '.join(metrics)}"
                         + (f" (did you mean {guess!r}?)" if guess else ""))
    summary["metrics"], summary["early_stop_metric"] = metrics, metric
    val_data = val_loader(task.val_data, cfg, seed=seeds["augment"], collate_fn=task.collate_fn,
                          cuda=device.type == "cuda")
    val_data.sampler.deal(world.rank, world.size, world.size)
    cfg = loader_probe.settle(cfg, task, seeds["order"], device, total, summary, warn)  # "auto"
    if separate:  # what the model draws from here on is the model source's alone
        seed_everything(model_seed(seeds["model"]))
    return Setup(cfg=cfg, seed=run.seed, seeds=seeds, device=device, task=task, model=model,
                 step_model=step_model, optimizer=optimizer, scaler=scaler, autocast=autocast,
                 precision=precision, diagnostics=diagnostics, val_data=val_data,
                 count_samples=task.count_samples or count_samples,
                 steps_per_epoch=steps_per_epoch, total=total, metrics=metrics, metric=metric,
                 direction=metrics[metric], world=world)


def randomness_of(run: RunSpec, summary: dict[str, Any]) -> tuple[dict[str, int], bool, list[str]]:
    """(each source's seed, whether they draw from streams of their own, the switches
    off) of `run`, recorded in the summary."""
    seeds = sources.seeds_of(run.trainer, run.seed)
    separate, off = sources.separated(run.trainer), sources.switched_off(run.trainer)
    summary["randomness"] = {"seeds": seeds, "separate": separate, "switched_off": off}
    return seeds, separate, off


def training_loader(setup: Setup) -> DataLoader:
    """The run's one training loader (this rank's share of each step's micro-batches);
    `step.micro_batches` points it at each epoch."""
    loader = train_loader(setup.task.train_data, setup.cfg, seed=setup.seeds["order"],
                          augment_seed=setup.seeds["augment"], collate_fn=setup.task.collate_fn,
                          cuda=setup.device.type == "cuda")
    loader.sampler.deal(setup.world.rank, setup.world.size, setup.accumulate)
    return loader
