"""The keys of an experiment file: the trainer's keys, the names users reach for
instead (aliases from other frameworks), and the checks of one key's value.

Nothing here imports torch or a task; `task_params` inspects a factory that
the caller has already imported.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gridrun.spec import sources
from gridrun.spec.errors import nearest, nearest_key, printable, toml_type

GPU_THREADS = 4  # threads = "auto" on a GPU run: min(this, usable cores); a CPU run: 1 (train/threads.py)
RESERVED = ("task", "grid", "zip", "ablations", "seeds", "search")  # the matrix's own keys, not run keys

# Upper bounds a real run could use: far above any real run, far below what overflows
# (SQLite's and torch's 64-bit integers) or what would take forever to refuse.
MAX_EPOCHS = 10**6
MAX_BATCH = 2**24
MAX_ACCUMULATE = 2**16
MAX_STEPS = 2**40  # any count of steps (max_steps, warmup, log_every, ...) and a run's total
MAX_SEED = 2**63  # seeds are integers in [0, MAX_SEED)
MAX_DEVICES = 1024
REDUCE_DEFAULT = "ddp"  # one device: the plain loop, the bits of every run before `devices`


@dataclass(frozen=True)
class Key:
    """One trainer key: its TOML type, default, allowed values and meaning."""

    name: str
    type: str  # "integer" | "float" | "string" | "boolean" | "array of 2 floats" | "float or integer" | "boolean or \"auto\"" | "integer or \"auto\""
    default: Any
    doc: str
    choices: tuple[Any, ...] = ()
    min: float | None = None  # inclusive
    max: float | None = None  # inclusive
    above: float | None = None  # exclusive lower bound
    below: float | None = None  # exclusive upper bound
    affects_results: bool = True  # False: left out of the run id


def in_run_id(trainer: Any) -> dict[str, Any]:
    """The trainer keys a run id hashes: those that change results. compile_mode
    changes them only with compile on, and at "default" is what compiled runs
    used before the key existed, so their ids stay; drop_last likewise only when
    false (true is what every run did before the key existed)."""
    out = {k: v for k, v in trainer.items() if k not in TRAINER_KEYS or TRAINER_KEYS[k].affects_results}
    if not trainer.get("compile") or out.get("compile_mode") == "default":
        out.pop("compile_mode", None)
    for k in sources.KEYS:  # the randomness keys: at their defaults, ids are those of before them
        if k in out and out[k] == TRAINER_KEYS[k].default:
            del out[k]
    if out.get("drop_last", True) is True:
        out.pop("drop_last", None)
    # one device, or the invariant sum: the device count changes nothing (train/loop/combine.py)
    if out.get("reduce", REDUCE_DEFAULT) == REDUCE_DEFAULT:
        out.pop("reduce", None)
    if out.get("devices", 1) == 1 or out.get("reduce") == "invariant":
        out.pop("devices", None)
    return out


TRAINER_KEYS: dict[str, Key] = {k.name: k for k in [
    Key("epochs", "integer", 10, "passes over the training data", min=1, max=MAX_EPOCHS),
    Key("max_steps", "integer", 0, "stop after this many optimizer steps (0: no cap)", min=0,
        max=MAX_STEPS),
    Key("batch_size", "integer", 64, "samples per micro-batch", min=1, max=MAX_BATCH),
    Key("lr", "float", 1e-3, "peak learning rate", above=0),
    Key("optimizer", "string", "adamw", "the optimizer", choices=("adamw", "adam", "sgd")),
    Key("momentum", "float", 0.9, "SGD momentum", min=0, below=1),
    Key("nesterov", "boolean", False, "Nesterov momentum (sgd)"),
    Key("betas", "array of 2 floats", [0.9, 0.999], "Adam(W) betas, each in [0, 1)"),
    Key("weight_decay", "float", 0.0, "weight decay (decoupled for adamw)", min=0),
    Key("schedule", "string", "cosine", "learning-rate schedule after warmup",
        choices=("cosine", "linear", "step", "constant", "onecycle")),
    Key("warmup", "float or integer", 0.0,
        "linear warmup: a float in [0, 1) is a fraction of all steps, an integer a step count",
        min=0, max=MAX_STEPS),
    Key("min_lr", "float", 0.0, "the floor of cosine and linear decay", min=0),
    Key("step_size", "integer", 1000, "steps between decays of the step schedule", min=1,
        max=MAX_STEPS),
    Key("gamma", "float", 0.1, "decay factor of the step schedule", above=0, max=1),
    Key("precision", "string", "auto", "auto: bf16 on CUDA devices that support it, else fp32; "
        "fp16 uses a GradScaler", choices=("auto", "fp32", "bf16", "fp16")),
    Key("accumulate", "integer", 1, "micro-batches per optimizer step (the loss is divided by it)",
        min=1, max=MAX_ACCUMULATE),
    Key("devices", "integer", 1, "devices one run trains on, one process each (GPUs, or CPU "
        "processes of `threads` threads); it must divide accumulate", min=1, max=MAX_DEVICES),
    Key("reduce", "string", REDUCE_DEFAULT, "how several devices sum a step's gradients: ddp "
        "(DistributedDataParallel: bits change with the device count) or invariant (the same "
        "bits for every device count; devices is then left out of the run id)",
        choices=("ddp", "invariant")),
    Key("clip_grad", "float", 0.0, "clip the global gradient norm to this (0: off)", min=0),
    Key("eval_every", "integer", 0, "evaluate every this many steps (0: at each epoch end)", min=0,
        max=MAX_STEPS),
    Key("log_every", "integer", 10, "write a train line every this many steps", min=1,
        max=MAX_STEPS),
    Key("checkpoint_every", "integer", 0, "checkpoint every this many steps (0: epoch ends only)",
        min=0, max=MAX_STEPS, affects_results=False),
    Key("early_stop_patience", "integer", 0, "stop after this many evaluations without improvement (0: off)",
        min=0, max=MAX_STEPS),
    Key("early_stop_metric", "string", "", "validation metric for early stopping and best.pt "
        "(empty: the task's first metric; under a search's scheduler, its metric)"),
    Key("deterministic", "boolean", True, "deterministic algorithms (bitwise-reproducible on CUDA)"),
    Key("threads", 'integer or "auto"', "auto", "CPU threads each process of the run computes "
        f"with (auto: 1 on the CPU, on any machine and device count; a GPU run min({GPU_THREADS}, "
        "the usable cores)); recorded, kept when the run resumes, and verify replays with it",
        min=1, affects_results=False),
    Key("detect_anomaly", "boolean", False, "autograd anomaly detection (slow; for debugging)",
        affects_results=False),
    Key("drop_last", "boolean", True, "the training loader leaves out the last partial batch "
        "of each epoch (validation never does; false is part of the run id)"),
    Key("compile", "boolean", False, "wrap the model in torch.compile"),
    Key("compile_mode", "string", "default", "torch.compile's mode (part of the run id only with "
        "compile = true, and then only when not default)",
        choices=("default", "reduce-overhead", "max-autotune")),
    Key("checkpoint_modules", "array of strings", [], "activation checkpointing (non-reentrant "
        "torch.utils.checkpoint) of every submodule of these classes: less memory for one more "
        "forward, bitwise the same results", affects_results=False),
    Key("num_workers", 'integer or "auto"', 0, "DataLoader worker processes (auto: measured at "
        "the start of the run, with prefetch_factor and pin_memory)", min=0, max=1024,
        affects_results=False),
    Key("pin_memory", "boolean or \"auto\"", "auto", "pinned host memory (auto: on with CUDA)",
        affects_results=False),
    Key("prefetch_factor", "integer", 2, "batches prefetched per worker (with num_workers > 0)",
        min=1, max=1024, affects_results=False),
    Key("persistent_workers", "boolean", False, "keep DataLoader workers between epochs",
        affects_results=False),
    Key("gpu_memory", 'float or "auto"', "auto", "GiB of GPU memory the run may use, CUDA "
        "context included: it is held to it and placed by it (auto: under [engine] runs_per_gpu "
        '= "auto", what an earlier run of its shape measured, the first alone on its GPU; else '
        "a 1/runs_per_gpu share, not enforced)", above=0, max=1 << 20, affects_results=False),
    Key("max_retries", "integer", 0, "times the engine retries a failed run", min=0, max=100,
        affects_results=False),
    # the sources of randomness and their switches (spec/sources.py); each is part of
    # the run id only when it is not its default
    Key("vary", "source or array of sources", "all", "the sources that follow `seeds` (init, "
        "order, augment, model); the others stay at the first seed of the list"),
    *(Key(pin, 'integer or "seed"', "seed", f"the seed of the {source} source (\"seed\": the "
          "run's seed)") for source, pin in sources.PINS.items()),
    Key("shuffle", "boolean", True, "false: the training data in index order, every epoch"),
    Key("augmentation", "boolean", True, "false: the task is told augmentation is off "
        "(gridrun.randomness.enabled(\"augment\")); the data streams still run"),
    Key("dropout_layers", "boolean", True, "false: dropout modules run as the identity in "
        "training"),
]}


# Names other trainers and papers use for our keys (Hugging Face TrainingArguments,
# Lightning's Trainer, nanoGPT, timm, PyTorch's schedulers): an unknown key that is
# one of these is answered with ours, before any spelling-distance guess.
KEY_ALIASES: dict[str, str] = {
    **dict.fromkeys(("learning_rate", "base_lr", "peak_lr", "max_lr", "init_lr", "lr0"), "lr"),
    **dict.fromkeys(("optimiser", "optim", "opt", "optimizer_name", "optim_name"), "optimizer"),
    **dict.fromkeys(("wd", "l2", "decay", "weight_decay_rate"), "weight_decay"),
    **dict.fromkeys(("grad_accum", "grad_accum_steps", "gradient_accumulation_steps",
                     "gradient_accumulation", "accumulate_grad_batches", "accumulation_steps",
                     "accum_steps", "accum_iter"), "accumulate"),
    **dict.fromkeys(("max_epochs", "num_epochs", "n_epochs", "num_train_epochs", "epoch",
                     "train_epochs", "total_epochs"), "epochs"),
    **dict.fromkeys(("bs", "batch", "batchsize", "train_batch_size", "micro_batch_size",
                     "per_device_train_batch_size", "mini_batch_size"), "batch_size"),
    **dict.fromkeys(("warmup_steps", "num_warmup_steps", "warmup_ratio", "warmup_iters",
                     "warmup_epochs", "lr_warmup", "warmup_fraction"), "warmup"),
    **dict.fromkeys(("seed", "random_seed", "seed_list", "num_seeds", "n_seeds"), "seeds"),
    **dict.fromkeys(("mixed_precision", "amp", "fp16", "bf16", "dtype", "autocast",
                     "use_amp"), "precision"),
    **dict.fromkeys(("max_iters", "num_steps", "total_steps", "train_steps", "max_train_steps",
                     "num_train_steps", "max_iterations", "iterations"), "max_steps"),
    **dict.fromkeys(("scheduler", "lr_scheduler", "lr_scheduler_type", "lr_schedule",
                     "sched"), "schedule"),
    **dict.fromkeys(("grad_clip", "max_grad_norm", "gradient_clip_val", "clip_grad_norm", "clip",
                     "clip_norm", "gradient_clipping"), "clip_grad"),
    **dict.fromkeys(("min_learning_rate", "lr_min", "eta_min", "final_lr", "end_lr"), "min_lr"),
    **dict.fromkeys(("eval_interval", "eval_steps", "val_check_interval", "evaluate_every",
                     "validate_every", "val_every", "eval_freq"), "eval_every"),
    **dict.fromkeys(("log_interval", "logging_steps", "log_every_n_steps", "log_freq",
                     "print_freq"), "log_every"),
    **dict.fromkeys(("save_steps", "save_every", "save_interval", "checkpoint_interval",
                     "ckpt_every", "checkpoint_freq"), "checkpoint_every"),
    **dict.fromkeys(("patience", "early_stopping_patience", "early_stopping"),
                    "early_stop_patience"),
    **dict.fromkeys(("monitor", "metric_for_best_model", "early_stopping_metric",
                     "best_metric"), "early_stop_metric"),
    **dict.fromkeys(("beta1", "beta2", "adam_beta1", "adam_beta2", "adam_betas"), "betas"),
    **dict.fromkeys(("lr_decay", "lr_gamma", "decay_rate", "gamma_decay"), "gamma"),
    **dict.fromkeys(("lr_step", "decay_steps", "lr_decay_steps", "step_every"), "step_size"),
    **dict.fromkeys(("sgd_momentum",), "momentum"),
    **dict.fromkeys(("torch_compile", "use_compile", "compiled"), "compile"),
    **dict.fromkeys(("workers", "n_workers", "dataloader_num_workers", "num_data_workers"),
                    "num_workers"),
    **dict.fromkeys(("dataloader_pin_memory", "pin"), "pin_memory"),
    **dict.fromkeys(("gpu_mem", "memory", "mem_gb", "gpu_memory_gb", "vram", "memory_budget"),
                    "gpu_memory"),
    **dict.fromkeys(("retries", "max_retry", "num_retries"), "max_retries"),
    **dict.fromkeys(("use_deterministic_algorithms", "deterministic_algorithms", "determinism"),
                    "deterministic"),
    **dict.fromkeys(("anomaly_detection", "detect_anomalies"), "detect_anomaly"),
    **dict.fromkeys(("gradient_checkpointing", "activation_checkpointing", "checkpoint_activations",
                     "grad_checkpointing"), "checkpoint_modules"),
    **dict.fromkeys(("torch_compile_mode", "compilation_mode"), "compile_mode"),
    # the sources of randomness (a task's own `augment` or `dropout` key is its own)
    **dict.fromkeys(("sources", "vary_sources", "varies", "vary_source"), "vary"),
    **dict.fromkeys(("init_seed", "weights_seed", "seed_weights"), "seed_init"),
    **dict.fromkeys(("order_seed", "data_order_seed", "shuffle_seed", "sampler_seed"),
                    "seed_order"),
    **dict.fromkeys(("augment_seed", "augmentation_seed", "seed_augmentation"), "seed_augment"),
    **dict.fromkeys(("dropout_seed", "seed_dropout"), "seed_model"),
    **dict.fromkeys(("shuffle_data", "random_order", "data_shuffle"), "shuffle"),
    **dict.fromkeys(("augment", "augmentations", "use_augmentation", "data_augmentation"),
                    "augmentation"),
    **dict.fromkeys(("dropout", "use_dropout", "dropouts"), "dropout_layers"),
}

# Values other tools spell their own way, for keys with a fixed set of choices.
VALUE_ALIASES: dict[str, dict[str, str]] = {
    "precision": {
        **dict.fromkeys(("32", "32-true", "float32", "float", "full", "fp32-true", "no", "none",
                         "tf32"), "fp32"),
        **dict.fromkeys(("bf16-mixed", "bf16-true", "bfloat16", "16-bf16"), "bf16"),
        **dict.fromkeys(("16", "16-mixed", "16-true", "float16", "half", "amp", "mixed",
                         "fp16-mixed"), "fp16"),
    },
    "optimizer": {"adam_w": "adamw", "adam-w": "adamw", "adamw_torch": "adamw",
                  "adamw_hf": "adamw", "momentum": "sgd"},
    "schedule": {"cos": "cosine", "cosine_annealing": "cosine", "cosineannealinglr": "cosine",
                 "one_cycle": "onecycle", "one-cycle": "onecycle", "onecyclelr": "onecycle",
                 "steplr": "step", "const": "constant", "none": "constant",
                 "constant_with_warmup": "constant", "linear_decay": "linear"},
}


def suggest_key(name: str, known: Iterable[str]) -> str | None:
    """The key a person most likely meant: an alias we know, the same name in
    another case or with dashes, else the key naming the same words or the nearest
    spelling (`nearest_key`); None rather than a poor guess."""
    known = list(known)
    folded = name.lower().replace("-", "_")
    for candidate in (name, folded):
        if candidate in KEY_ALIASES and KEY_ALIASES[candidate] in known:
            return KEY_ALIASES[candidate]
    same = [k for k in known if k.lower().replace("-", "_") == folded and k != name]
    return same[0] if same else nearest_key(name, known)


def suggest_choice(key: Key, value: Any) -> str | None:
    """The choice meant by a value that is not one (`"AdamW"`, `"bf16-mixed"`, `32`)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    text = str(value).strip()
    folded = text.lower()
    if folded in key.choices:
        return folded
    alias = VALUE_ALIASES.get(key.name, {}).get(folded)
    if alias in key.choices:
        return alias
    return nearest(folded, key.choices)


class _NoDefault:
    def __repr__(self) -> str:
        return "<required>"


NO_DEFAULT = _NoDefault()  # a task parameter without a default: the file must give it


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and not isinstance(v, bool)


def number(x: float) -> str:
    """A bound as people read it: 1,099,511,627,776 rather than 1.09951e+12."""
    return f"{x:,}" if isinstance(x, int) and abs(x) >= 10_000 else f"{x:g}"


def _range_text(key: Key) -> str:
    bits = []
    if key.min is not None:
        bits.append(f">= {number(key.min)}")
    if key.above is not None:
        bits.append(f"> {number(key.above)}")
    if key.max is not None:
        bits.append(f"<= {number(key.max)}")
    if key.below is not None:
        bits.append(f"< {number(key.below)}")
    return " and ".join(bits)


def _in_range(key: Key, v: float) -> bool:
    return ((key.min is None or v >= key.min) and (key.above is None or v > key.above)
            and (key.max is None or v <= key.max) and (key.below is None or v < key.below))


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(g|gb|gib|m|mb|mib|t|tb|tib)$", re.IGNORECASE)
_UNIT = {"g": 1, "gb": 1, "gib": 1, "m": 1 / 1024, "mb": 1 / 1024, "mib": 1 / 1024, "t": 1024,
         "tb": 1024, "tib": 1024}  # a size people write, in GiB


def check_trainer_value(key: Key, value: Any) -> tuple[Any, str | None]:
    """(the value coerced to the key's type, None) or (None, what was expected)."""
    got = f"got {show_value(value)}" if not isinstance(value, dict | list) else f"got {toml_type(value)}"
    if key.choices:
        if isinstance(value, str) and value in key.choices:
            return value, None
        choices = " | ".join(f'"{c}"' for c in key.choices)
        suggestion = suggest_choice(key, value)
        hint = f" (did you mean {suggestion!r}?)" if suggestion else ""
        return None, f"expected one of {choices}, {got}{hint}"
    if key.type == "integer":
        if not _is_int(value):
            return None, f"expected an integer {_range_text(key)}, {got}".replace("  ", " ")
        if not _in_range(key, value):
            return None, f"expected an integer {_range_text(key)}, {got}"
        return value, None
    if key.type == "float":
        if not _is_number(value) or not math.isfinite(value):
            return None, f"expected a finite float {_range_text(key)}, {got}".replace("  ", " ")
        if not _in_range(key, value):
            return None, f"expected a float {_range_text(key)}, {got}"
        return float(value), None
    if key.type == "float or integer":  # warmup: a fraction of all steps, or a step count
        if _is_int(value):
            return (value, None) if _in_range(key, value) else (
                None, f"expected a step count {_range_text(key)}, {got}")
        if isinstance(value, float) and math.isfinite(value):
            if 0 <= value < 1:
                return value, None
            return None, f"expected a fraction in [0, 1) or an integer step count, {got}"
        return None, f"expected a float in [0, 1) or an integer step count, {got}"
    if key.type == "boolean":
        return (value, None) if isinstance(value, bool) else (None, f"expected a boolean (true or false), {got}")
    if key.type == "string":
        return (value, None) if isinstance(value, str) else (None, f"expected a string, {got}")
    if key.type == 'integer or "auto"':
        if value == "auto" or (_is_int(value) and _in_range(key, value)):
            return value, None
        return None, f'expected "auto" or an integer {_range_text(key)}, {got}'
    if key.type == 'float or "auto"':  # gpu_memory: GiB
        if value == "auto" or (_is_number(value) and math.isfinite(value) and _in_range(key, value)):
            return value if value == "auto" else float(value), None
        size = _SIZE.match(value.strip()) if isinstance(value, str) else None
        hint = (f" (did you mean {key.name} = {float(size[1]) * _UNIT[size[2].lower()]:g}, in GiB?)"
                if size else "")
        return None, f'expected "auto" or a number of GiB {_range_text(key)}, {got}{hint}'
    if key.type == 'boolean or "auto"':
        if isinstance(value, bool) or value == "auto":
            return value, None
        return None, f'expected a boolean or "auto", {got}'
    if key.type == "array of strings":
        if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
            return list(value), None
        return None, f"expected an array of class names (strings), {got}"
    if key.type == "source or array of sources":
        return sources.check_vary(value)
    if key.type == 'integer or "seed"':
        return sources.check_pin(value)
    if key.type == "array of 2 floats":
        if (isinstance(value, list) and len(value) == 2 and all(_is_number(b) for b in value)
                and all(0 <= b < 1 for b in value)):
            return [float(b) for b in value], None
        return None, f"expected an array of 2 floats, each in [0, 1), {got}"
    raise AssertionError(f"unhandled key type {key.type}")


def show_value(value: Any) -> str:
    """A value in a message: repr, control characters escaped, a huge number shortened."""
    if _is_int(value) and abs(value) >= 10**12:
        return f"{value:,}" if abs(value) < 10**30 else f"an integer of {len(str(abs(value)))} digits"
    return printable(repr(value))[:200]


def check_task_value(name: str, default: Any, value: Any) -> tuple[Any, str | None]:
    """Task keys are checked against the type of the factory's default, when it has one."""
    got = f"got {show_value(value)}" if not isinstance(value, dict) else "got a table"
    if default is None or default is NO_DEFAULT:
        return value, None
    if isinstance(default, bool):
        ok = isinstance(value, bool)
        expected = "a boolean"
    elif _is_int(default):
        ok = _is_int(value) and -MAX_SEED <= value < MAX_SEED
        expected = "an integer" if not _is_int(value) else "an integer of at most 64 bits"
    elif isinstance(default, float):
        if _is_number(value):
            return float(value), None
        ok, expected = False, "a float"
    elif isinstance(default, str):
        ok, expected = isinstance(value, str), "a string"
    else:
        return value, None
    if ok:
        return value, None
    return None, f"expected {expected} (the task's default is {default!r}), {got}"


@dataclass(frozen=True)
class TaskSignature:
    """A task factory's signature, read once: validation checks keys against
    `params`, expansion records `defaults` for the keys a file leaves out."""

    params: dict[str, Any]  # {keyword parameter: its default or NO_DEFAULT}
    any_keyword: bool  # **kwargs: any key is the task's
    defaults: dict[str, Any]  # plain TOML defaults, part of every run's task_args (and id)


def task_signature(factory: Callable[..., Any]) -> TaskSignature:
    params: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    any_keyword = False
    for p in inspect.signature(factory).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            any_keyword = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            params[p.name] = NO_DEFAULT if p.default is p.empty else p.default
        if p.default is not p.empty and isinstance(p.default, bool | int | float | str):
            defaults[p.name] = p.default
    return TaskSignature(params, any_keyword, defaults)
