"""Divergence explained: replay a diverged run to the step where it broke, watching.

Runs replay bit for bit (the determinism and exact-resume contracts), so the
replay starts from the run's last good checkpoint (or from scratch when it
diverged before the first one), in a scratch folder inside the run's, with
autograd's anomaly mode on and a hook on every module. It names:

- `phase`: "forward" (a module's output became non-finite), "backward" (a
  gradient did; anomaly mode names the op) or "update" (the optimizer step
  before broke the weights: the next forward starts from non-finite ones);
- `module` and `type`: the first module whose output (or whose gradient, or
  whose parameters) went non-finite; in the forward, the innermost one to
  finish, which is where the value was made;
- `op`: the backward function anomaly mode caught returning NaN;
- `batch_finite`: whether the input batch itself held only finite values;
- `step`: the optimizer step (1-based), as `diverged_step` counts.

The hooks read values on the host once per module per step: a replay is slow
on purpose and never runs in a healthy run.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from gridrun.runs import layout
from gridrun.train.loop.trainer import Probe, train


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def _finite(value: Any) -> bool:
    return all(bool(t.isfinite().all()) for t in _tensors(value)
               if t.is_floating_point() or t.is_complex())


class Watch(Probe):
    """The replay's probe: the first non-finite value, where and when it appeared."""

    def __init__(self, last_step: int):
        self.last_step, self.step = last_step, 0
        self.found: dict[str, Any] | None = None
        self.batch_finite = True
        self.names: dict[torch.nn.Module, str] = {}
        self.grad_from: str | None = None  # the innermost module whose output's gradient was finite
        self.model: torch.nn.Module | None = None

    def attach(self, model: torch.nn.Module) -> None:
        self.model = model
        for name, module in model.named_modules():
            self.names[module] = name or "(model)"
            module.register_forward_hook(self._forward)

    def before_step(self, step: int, batch: Any) -> None:
        self.step, self.grad_from = step, None
        self.batch_finite = _finite(batch)
        self.check_weights(step - 1)

    def check_weights(self, step: int) -> None:
        """Non-finite parameters before a forward: the update of `step` broke them."""
        if self.found is None and self.model is not None:
            for name, p in self.model.named_parameters():
                if not bool(p.isfinite().all()):
                    owner = name.rpartition(".")[0]
                    module = self.model.get_submodule(owner) if owner else self.model
                    self._find("update", owner or "(model)", module, step=step, parameter=name)
                    return

    def _find(self, phase: str, name: str, module: torch.nn.Module, **more: Any) -> None:
        if self.found is None:
            self.found = {"step": self.step, "phase": phase, "module": name,
                          "type": type(module).__name__, "op": None,
                          "batch_finite": self.batch_finite, **more}

    def _forward(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if not module.training or not torch.is_grad_enabled():
            return  # evaluation is not the training step that diverged
        if self.found is None and not _finite(output):
            self._find("forward", self.names[module], module, inputs_finite=_finite(inputs))
        for t in _tensors(output):
            if t.requires_grad:
                t.register_hook(lambda grad, m=module: self._backward(m, grad))

    def _backward(self, module: torch.nn.Module, grad: torch.Tensor) -> None:
        if self.found is not None:
            return
        if _finite(grad):
            # a container's output is its last child's: the child's hook, registered
            # first, runs first; keep the innermost module, not its ancestors
            name, inner = self.names[module], self.grad_from
            if inner is None or not (name == "(model)" or inner.startswith(name + ".")):
                self.grad_from = name
            return
        self._find("backward", self.names[module], module, gradient_of_output=True)


def explain(run: Any, run_dir: str | Path, diverged_step: int | None,
            log: Any = lambda s: None, should_stop: Any = lambda: False) -> dict[str, Any]:
    """Replay `run` (its folder `run_dir`) up to `diverged_step`; what broke, for summary.json."""
    run_dir = Path(run_dir)
    scratch = run_dir / "replay"
    shutil.rmtree(scratch, ignore_errors=True)
    layout.make_private_dir(scratch)
    try:
        start_over = True
        saved = run_dir / layout.CHECKPOINTS
        if (saved / "last.pt").is_file():
            shutil.copytree(saved, scratch / layout.CHECKPOINTS,
                            ignore=shutil.ignore_patterns("best.pt", "*.tmp"))
            if (run_dir / layout.METRICS).is_file():
                shutil.copy(run_dir / layout.METRICS, scratch / layout.METRICS)
            start_over = False
        last = diverged_step if diverged_step is not None else 10**12
        watch = Watch(last)
        # anomaly mode names the backward op; checkpoints in between only cost time
        replay = run.with_trainer(detect_anomaly=True, checkpoint_every=0)
        summary = train(replay, scratch, fresh=start_over, log=log, probe=watch,
                        should_stop=lambda: watch.step > last + 1 or should_stop())
        if not summary.get("divergence"):
            watch.check_weights(watch.step)  # the last update broke the weights, no forward after
        found = dict(watch.found or {})
        anomaly = summary.get("divergence") or {}
        if found:
            found["op"] = anomaly.get("op")
        elif anomaly:
            found = {**anomaly, "module": watch.grad_from, "batch_finite": watch.batch_finite,
                     "type": _type_of(watch, watch.grad_from)}
        if not found:
            why = (f"the replay did not diverge (it ended {summary.get('status')}"
                   + (f": {summary['error']}" if summary.get("error") else "") + ")")
            return {"step": diverged_step, "reproduced": False, "note": why}
        found["reproduced"] = True
        found["replayed_from_step"] = summary.get("resumed_from_step") or 0
        return found
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _type_of(watch: Watch, name: str | None) -> str | None:
    for module, n in watch.names.items():
        if n == name:
            return type(module).__name__
    return None


def describe(d: dict[str, Any]) -> str:
    """One line for the log and the interface."""
    if not d.get("reproduced", True) and "module" not in d:
        return f"divergence not explained: {d.get('note')}"
    where = f"{d.get('module')} ({d.get('type')})" if d.get("module") else "the loss, outside any module"
    text = f"diverged at step {d.get('step')}: first non-finite {d.get('phase')} value in {where}"
    if d.get("op"):
        text += f"; anomaly mode: {d['op']} returned NaN"
    if d.get("batch_finite") is False:
        text += "; the input batch itself held NaN/Inf"
    return text
