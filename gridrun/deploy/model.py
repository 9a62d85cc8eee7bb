"""From a finished run to a deployable model.

`load_run(path_or_id)` turns a run folder into its config, summary, metrics
and model (rebuilt through the task factory, seeded as in training, the
checkpoint loaded with `weights_only=True`, in eval mode). `export_model`
exports that model (with the task's preprocess in front when it declares one:
whole.py) to ONNX, a `torch.export` archive (`.pt2`) or TorchScript, dynamic or
`static` (static.py), then proves it computes what PyTorch computes on
validation batches (parity.py), and writes `parity.json` and `model.json`
(describe.py) beside it: the three by the rule of userfiles.py, checked before
anything is exported, written only once all is done.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from gridrun import userfiles
from gridrun.deploy.formats import DeployError
from gridrun.runs import layout, nofollow, runlog
from gridrun.runs.records import Summary
from gridrun.spec import RunSpec, parse_run_config
from gridrun.tasks import Task, resolve
from gridrun.train import checkpoint

CHECKPOINTS = {"best": checkpoint.BEST, "last": checkpoint.LAST}
FORMATS = {"onnx": "model.onnx", "pt2": "model.pt2", "torchscript": "model.ts.pt"}
EXPORT_DIR = "export"  # inside the run folder, unless -o says otherwise
PARITY, MODEL_JSON = "parity.json", "model.json"
CONFIG_MAX = 1 << 20  # a run's config.toml is a few kB: more is not one of ours


def find_run(path_or_id: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """A run folder given as a path, or the folder of the run whose id starts with `path_or_id`."""
    path = Path(path_or_id)
    if (path / layout.CONFIG).is_file():
        # a path the user typed is theirs to resolve; inside the run, nothing is followed
        return Path(os.path.realpath(path))
    root = Path(root) if root is not None else layout.default_root()
    prefix = str(path_or_id)
    if (root / layout.DB_NAME).exists():
        from gridrun.runs.store import RunNotFound, Store

        try:
            with Store(root) as store:
                return store.get_run(prefix).run_dir(root)
        except RunNotFound as e:
            raise DeployError(str(e).strip("'\"")) from None
    found = sorted(p for p in root.glob(f"*/{prefix}*") if (p / layout.CONFIG).is_file())
    if len(found) == 1:
        return found[0]
    what = "no run" if not found else f"{len(found)} runs"
    raise DeployError(f"{prefix!r}: {what} under {root} with a folder or id starting so "
                      "(name a run folder, or --root / root= another root)")


@dataclass
class LoadedRun:
    """One run as a notebook wants it; see `load_run`."""

    folder: Path
    spec: RunSpec
    summary: Summary = field(default_factory=Summary)  # records.Summary: .best, .final, .status, ...

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def config(self) -> dict[str, Any]:
        """The flat resolved config: task, every trainer key, every task key."""
        return self.spec.config

    @cached_property
    def metrics(self) -> Any:
        """Every metrics line as a pandas DataFrame (one row a line: step, epoch, split, ...)."""
        import pandas as pd

        return pd.DataFrame(runlog.read_all(self.folder / layout.METRICS))

    @cached_property
    def task(self) -> Task:
        """The run's Task, built by its factory after seeding as the trainer does
        (the init source's seed, the run's switches while the factory runs)."""
        from gridrun import randomness
        from gridrun.spec import sources
        from gridrun.train.seeding import seed_everything

        seed_everything(sources.seeds_of(self.spec.trainer, self.spec.seed)["init"])
        previous = randomness.configure(sources.switched_off(self.spec.trainer))
        try:
            return resolve(self.spec.task)(**self.spec.task_args)
        except Exception as exc:  # the factory is the user's code
            raise DeployError(f"run {self.id}: task {self.spec.task!r} cannot be built: "
                              f"{type(exc).__name__}: {exc}") from exc
        finally:
            randomness.configure(previous)

    @property
    def augment_seed(self) -> int:
        """The seed of the run's data streams (the augment source's)."""
        from gridrun.spec import sources

        return sources.seeds_of(self.spec.trainer, self.spec.seed)["augment"]

    def checkpoint_path(self, which: str = "best") -> Path:
        if which not in CHECKPOINTS:
            raise DeployError(f"checkpoint must be 'best' or 'last', not {which!r}")
        path = self.folder / layout.CHECKPOINTS / CHECKPOINTS[which]
        if not path.is_file():
            why = ("no evaluation finished with a finite metric" if which == "best"
                   else "it never reached a checkpoint")
            raise DeployError(f"run {self.id} has no {layout.CHECKPOINTS}/{path.name} ({why}; "
                              f"status {self.summary.status or 'unknown'})"
                              + ("; --checkpoint last exports the last weights"
                                 if which == "best" and (path.parent / checkpoint.LAST).is_file() else ""))
        return path

    def state(self, which: str = "best", device: str | torch.device = "cpu") -> dict[str, Any]:
        path = self.checkpoint_path(which)
        try:
            with nofollow.open_file(path) as f:  # checkpoints/ and the run folder: no link
                state = checkpoint.load(path, device, file=f)
        except FileNotFoundError:
            state = None
        except (checkpoint.CheckpointError, layout.UnsafePath) as e:
            raise DeployError(str(e)) from None
        if state is None or "model" not in state:
            raise DeployError(f"{self.checkpoint_path(which)} holds no model weights")
        return state

    def checkpoint_metrics(self, which: str = "best") -> dict[str, float]:
        """The validation metrics recorded when the checkpoint was written."""
        state = self.state(which)
        if which == "best":
            return dict(state.get("best", {}).get("metrics") or {})
        return dict(state.get("final") or {})

    def model(self, checkpoint: str = "best", device: str | torch.device = "cpu") -> torch.nn.Module:
        """A fresh copy of the task's model with the checkpoint's weights, on `device`, in eval mode."""
        model = copy.deepcopy(self.task.model)
        model.load_state_dict(self.state(checkpoint, device)["model"])
        return model.to(device).eval()

    def val_loader(self, device: str | torch.device = "cpu", *, raw: bool = False) -> Any:
        """The validation batches exactly as the trainer iterated them; `raw`: the same
        batches of the task's `raw_val_data` (before preprocess)."""
        from gridrun.train.data import val_loader

        data = self.task.raw_val_data if raw else self.task.val_data
        if data is None:
            raise DeployError(f"run {self.id}: task {self.spec.task!r} declares no raw_val_data")
        return val_loader(data, self.spec.trainer, seed=self.augment_seed,
                          collate_fn=self.task.collate_fn, cuda=torch.device(device).type == "cuda")

    def evaluate(self, checkpoint: str = "best", device: str | torch.device = "cpu") -> dict[str, float]:
        """The task's validation metrics of a checkpoint, computed the trainer's way."""
        return self.evaluate_model(self.model(checkpoint, device), self.val_loader(device), device)

    def evaluate_model(self, model: torch.nn.Module, loader: Any,
                       device: str | torch.device = "cpu") -> dict[str, float]:
        """The task's metrics of `model` (the run's, or anything called like it: an exported
        program) over `loader`, computed the trainer's way."""
        from gridrun.train.loop.trainer import evaluate, resolve_precision
        from gridrun.train.seeding import set_determinism

        device = torch.device(device)
        if device.type == "cuda":
            set_determinism(self.spec.trainer.get("deterministic", True))
        precision = resolve_precision(self.spec.trainer.get("precision", "fp32"), device)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        autocast = torch.autocast(device.type, dtype=dtype) if dtype else torch.autocast(
            device.type, enabled=False)
        return evaluate(model, self.task, loader, device, autocast)


def load_run(path_or_id: str | os.PathLike, root: str | os.PathLike | None = None) -> LoadedRun:
    """A run folder, or a run id (a unique prefix) of `root` (default ./runs or $GRIDRUN_ROOT)."""
    folder = find_run(path_or_id, root)
    try:
        spec = parse_run_config(nofollow.read_bytes(folder / layout.CONFIG, limit=CONFIG_MAX))
    except layout.UnsafePath as e:
        raise DeployError(str(e)) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DeployError(f"{folder}: no readable {layout.CONFIG} ({e})") from None
    return LoadedRun(folder=folder, spec=spec,
                     summary=runlog.read_summary(folder / layout.SUMMARY) or Summary())


# ---- export ------------------------------------------------------------------------------


def default_output(run: LoadedRun, fmt: str, which: str) -> Path:
    return run.folder / EXPORT_DIR / which / FORMATS[fmt]


def export_model(run: LoadedRun, *, checkpoint: str = "best", fmt: str = "onnx",
                 out: str | os.PathLike | None = None, force: bool = False, batches: int = 3,
                 atol: float | None = None, rtol: float | None = None,
                 preprocess: bool | None = None, static: bool = False,
                 log: Any = lambda line: None) -> dict[str, Any]:
    """Export the run's model, check parity, write parity.json and model.json; the report.
    `out`: the model file (default: in the run's export folder, replaced on a re-export);
    an existing one, or a parity.json or model.json beside it, is replaced only with `force`
    (userfiles.py). `preprocess`: export the task's preprocess in front of the model (None:
    when the task declares one); `static`: every input dimension fixed (static.py)."""
    from gridrun.deploy import describe, formats, parity, whole
    from gridrun.deploy.static import Padded

    if fmt not in FORMATS:
        raise DeployError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if fmt == "onnx":
        formats.require_onnx()
    run.checkpoint_path(checkpoint)  # a clear message before anything is built
    if out is None:  # gridrun's own folder: a re-export replaces its files
        out, force = default_output(run, fmt, checkpoint), True
        layout.make_private_dir(out.parent)
    targets = _targets(Path(out), force)  # before anything is built: a refusal changes nothing
    out = targets[0]
    model = run.model(checkpoint, "cpu")
    task = run.task
    included, note = whole.wanted(task, run.spec.task, preprocess)  # the note goes in the report
    reference = whole.Whole(task.preprocess, model).eval() if included else model
    loader = run.val_loader("cpu", raw=included)
    example_batch = next(iter(loader), None)
    if example_batch is None:
        raise DeployError(f"run {run.id}: the validation set is empty: no example input to export with")
    if included:
        sig = formats.Signature.of(reference, task, example_batch, static=static,
                                   to_inputs=lambda b: (formats.first_tensor(b),),
                                   dynamic=whole.raw_dynamic(task))
        whole.check_exportable(fmt, task.preprocess, sig.inputs[whole.RAW], sig.export_shapes())
    else:
        sig = formats.Signature.of(model, task, example_batch, static=static)
    log(f"exporting run {run.id} ({run.spec.task}, {checkpoint}.pt{', with its preprocess' * included}) "
        f"to {fmt}{' (static)' * static}: inputs "
        + ", ".join(f"{n} {formats.shape_text(s)}" for n, s in sig.symbolic_shapes().items()))

    started = time.perf_counter()
    exported = formats.export(fmt, reference, sig)
    export_s = time.perf_counter() - started
    program: torch.nn.Module = formats.load(fmt, exported, sig, out.name)
    if sig.static is not None:
        program = Padded(program, sig)
    load_s = time.perf_counter() - started - export_s

    data = task.raw_val_data if included else task.val_data
    checked = parity.batches_for(run, loader, sig, batches, data)
    report = parity.check(reference, program, sig, checked, fmt=fmt, atol=atol, rtol=rtol)
    parity.metrics(report, fmt, run.checkpoint_metrics(checkpoint),
                   lambda m: run.evaluate_model(m, loader), reference, program, len(data))
    if note:
        report.setdefault("notes", []).insert(0, note)
    train_s = run.summary.wall_time_s
    report.update(run_id=run.id, format=fmt, checkpoint=checkpoint, model=out.name,
                  preprocess=included, static=sig.static,
                  export_s=round(export_s, 3), load_s=round(load_s, 3),
                  train_s=round(train_s, 3) if isinstance(train_s, int | float) else None)
    card = describe.card(run, checkpoint, fmt, out, sig, report, model, included=included, log=log)
    _write(dict(zip(targets, (exported, _json(report), _json(card)), strict=True)), force)
    return report


def _targets(out: Path, force: bool) -> list[Path]:
    """The model, parity.json and model.json, each as userfiles.check_target allows (no
    link even with `force`, no system folder, an existing file only with `force`). A
    missing folder of `-o` is made, unless it would be in a system folder."""
    if not os.path.lexists(out.parent) and (tree := userfiles.system_tree(out.parent)):
        raise DeployError(f"refusing to write {out}: it is in the system folder {tree}; "
                          "write into a folder of your own")
    targets = [out, out.parent / PARITY, out.parent / MODEL_JSON]
    if out.name in (PARITY, MODEL_JSON):
        raise DeployError(f"cannot write the model to {out}: {out.name} is the name of the "
                          "report beside it; name the model otherwise")
    try:
        if not os.path.lexists(out.parent):
            layout.make_private_dir(out.parent)
        for target in targets:
            userfiles.check_target(target, force=force)
    except userfiles.RefusedFile as e:
        raise DeployError(str(e)) from None
    except OSError as e:  # making -o's folder
        raise DeployError(userfiles.why_not_written(e, out)) from None
    return targets


def _write(files: dict[Path, bytes], force: bool) -> None:
    """Each file through userfiles.atomic_write, every one's bytes on disk before the first
    takes its place (model.json last): a refusal or a full disk leaves the old ones whole."""
    try:
        with contextlib.ExitStack() as stack:  # left in reverse: the model first, model.json last
            opened = [(path, stack.enter_context(userfiles.atomic_write(path, force=force)))
                      for path in reversed(files)]
            for path, f in opened:
                try:
                    f.write(files[path])
                    f.flush()
                    os.fsync(f.fileno())
                except OSError as e:  # named here: the innermost file would be named otherwise
                    raise userfiles.RefusedFile(userfiles.why_not_written(e, path)) from None
    except userfiles.RefusedFile as e:
        raise DeployError(str(e)) from None


def _json(value: dict[str, Any]) -> bytes:
    from gridrun.train.worker import json_safe

    return (json.dumps(json_safe(value), indent=1, allow_nan=False, default=str) + "\n").encode()
