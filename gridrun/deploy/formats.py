"""The three export formats behind one shape: export(fmt, model, signature) gives the
exported file's bytes (written by the caller, userfiles.atomic_write: the exporters
write nothing to disk), then load(fmt, data, signature) gives a module that computes
with them (onnxruntime for ONNX, the loaded program for `pt2` and TorchScript) and can
be handed to the task's own `evaluate` in place of the PyTorch model.

A `Signature` names what the model is called with: the task's `inputs(batch)`
(default: the batch's first tensor) bound to the model's `forward` parameters,
and which axes are dynamic (the task's `dynamic_shapes`; default: axis 0 of
every input, one shared `batch` dimension), or with `static`, the size each of
those axes is fixed at (static.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from gridrun.deploy import static as fixed
from gridrun.tasks import Task


class DeployError(Exception):
    """A run that cannot be loaded or exported as asked; str() is one line (or a short
    paragraph). Defined here, the lowest of the deploy modules; deploy re-exports it."""


ONNX_MODULES = ("onnx", "onnxscript", "onnxruntime")
INSTALL_HINT = ("ONNX export needs the export extra: pip install 'gridrun[export]' "
                "(onnx, onnxscript, onnxruntime); --format pt2 works without it")
HOW_TO_LOAD = {
    "onnx": "onnxruntime.InferenceSession(path).run(None, {name: array, ...})",
    "pt2": "torch.export.load(path).module()(**inputs)",
    "torchscript": "torch.jit.load(path)(*inputs)  # inputs in the order of 'inputs'",
}


def require_onnx() -> None:
    missing = [m for m in ONNX_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise DeployError(f"{INSTALL_HINT} (missing: {', '.join(missing)})")


def runtime_versions(fmt: str) -> dict[str, str]:
    if fmt != "onnx":
        return {}
    from importlib.metadata import version

    return {m: version(m) for m in ONNX_MODULES}


def first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    items = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(items, list | tuple) or isinstance(batch, Mapping):
        for item in items:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def shape_text(shape: list[int | str]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


@dataclass
class Signature:
    """What the model is called with and returns, with names."""

    forward: inspect.Signature
    to_inputs: Callable[[Any], Any]
    inputs: dict[str, torch.Tensor]             # the example, by forward parameter name
    axes: dict[str, dict[int, str]]             # dynamic axes by input: {axis: dim name}
    dims: dict[str, Any]                        # dim name -> torch.export.Dim (or Dim.AUTO, ...)
    outputs: list[str]
    example_outputs: list[torch.Tensor]
    structure: Any                              # None: a tensor; "seq": a tuple; or the dict keys
    out_axes: list[dict[int, str]] = field(default_factory=list)  # per output: {axis: dim name}
    static: dict[str, int] | None = None        # --static: each dimension's fixed size

    @classmethod
    def of(cls, model: torch.nn.Module, task: Task, batch: Any, *, static: bool = False,
           to_inputs: Callable[[Any], Any] | None = None, dynamic: Any = "task") -> Signature:
        """`to_inputs` and `dynamic` default to the task's `inputs` and `dynamic_shapes`."""
        to_inputs = to_inputs or task.inputs or (lambda b: (first_tensor(b),))
        sig = cls(forward=inspect.signature(model.forward), to_inputs=to_inputs, inputs={},
                  axes={}, dims={}, outputs=[], example_outputs=[], structure=None)
        sig.inputs = sig.call_inputs(batch)
        sig.axes, sig.dims = _dynamic(task.dynamic_shapes if dynamic == "task" else dynamic,
                                      sig.inputs)
        if static:
            sig.static = fixed.fixed_sizes(sig.dims, sig.dim_sizes(sig.inputs))
            sig.inputs = fixed.pad_inputs(sig.inputs, sig.axes, sig.static)
        with torch.inference_mode():
            out = model(**sig.inputs)
        sig.example_outputs, sig.outputs, sig.structure = _flatten(out)
        sig.out_axes = fixed.output_axes(lambda inputs: _flatten(model(**inputs))[0], sig.inputs,
                                         sig.axes, sig.example_outputs)
        return sig

    def bind(self, args: tuple, kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
        try:
            bound = self.forward.bind(*args, **kwargs)
        except TypeError as e:
            raise DeployError(f"the task's inputs(batch) do not fit the model's forward"
                              f"{self.forward}: {e}") from None
        values = dict(bound.arguments)
        for name, value in values.items():
            if not isinstance(value, torch.Tensor):
                raise DeployError(f"input {name!r} is a {type(value).__name__}, not a tensor: "
                                  "inputs(batch) must give the model's tensor arguments")
        return values

    def call_inputs(self, batch: Any) -> dict[str, torch.Tensor]:
        """The model's inputs for a CPU batch, by forward parameter name."""
        got = self.to_inputs(batch)
        if isinstance(got, Mapping):
            return self.bind((), dict(got))
        if isinstance(got, torch.Tensor):
            got = (got,)
        return self.bind(tuple(got), {})

    def export_shapes(self) -> dict[str, Any] | None:
        """dynamic_shapes for torch.export / torch.onnx.export, keyed by input name."""
        if self.static is not None:
            return None
        return {n: ({a: self.dims[d] for a, d in self.axes[n].items()} or None) for n in self.inputs}

    def symbolic_shapes(self) -> dict[str, list[int | str]]:
        """Each input's shape, a dynamic axis by its dimension's name (static: all sizes)."""
        axes = {n: {} for n in self.inputs} if self.static is not None else self.axes
        return {n: [axes[n].get(a, size) for a, size in enumerate(t.shape)]
                for n, t in self.inputs.items()}

    def dim_sizes(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """Each dynamic dimension's size in `inputs`."""
        return {d: int(inputs[n].shape[a]) for n, axes in self.axes.items() for a, d in axes.items()
                if n in inputs and a < inputs[n].dim()}

    def dim_ranges(self) -> dict[str, dict[str, int | None]]:
        """Each dynamic dimension's declared range (None: unbounded)."""
        def bound(v: Any) -> int | None:
            return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

        if self.static is not None:
            return {}
        return {d: {"min": bound(getattr(dim, "min", None)), "max": bound(getattr(dim, "max", None))}
                for d, dim in self.dims.items()}

    def output_info(self) -> list[tuple[str, list[int | str], str]]:
        """Output names, shapes (an axis that follows a dynamic dimension by its name; static:
        all sizes) and dtypes."""
        named = self.out_axes if self.static is None else [{} for _ in self.outputs]
        return [(n, [axes.get(a, s) for a, s in enumerate(t.shape)], str(t.dtype).removeprefix("torch."))
                for n, t, axes in zip(self.outputs, self.example_outputs, named, strict=True)]

    def rebuild(self, flat: list[torch.Tensor]) -> Any:
        if self.structure is None:
            return flat[0]
        if self.structure == "seq":
            return tuple(flat)
        return dict(zip(self.structure, flat, strict=True))


def _dynamic(spec: Any, inputs: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """The task's dynamic_shapes as {input: {axis: dim name}} and {dim name: Dim}."""
    names = list(inputs)
    if spec is None:
        spec = {n: {0: "batch"} for n in names}
    elif isinstance(spec, list | tuple):
        spec = dict(zip(names, spec, strict=False))
    unknown = set(spec) - set(names)
    if unknown:
        raise DeployError(f"dynamic_shapes names {', '.join(sorted(unknown))}, which the model "
                          f"is not called with (its inputs: {', '.join(names)})")
    axes: dict[str, dict[int, str]] = {}
    dims: dict[str, Any] = {}
    for n in names:
        axes[n] = {}
        for axis, dim in (spec.get(n) or {}).items():
            name = dim if isinstance(dim, str) else getattr(dim, "__name__", f"{n}_{axis}")
            dims.setdefault(name, torch.export.Dim(name) if isinstance(dim, str) else dim)
            axes[n][int(axis)] = name
    return axes, dims


def _flatten(out: Any) -> tuple[list[torch.Tensor], list[str], Any]:
    if isinstance(out, torch.Tensor):
        return [out], ["output"], None
    if isinstance(out, list | tuple) and all(isinstance(t, torch.Tensor) for t in out):
        return list(out), [f"output_{i}" for i in range(len(out))], "seq"
    if isinstance(out, Mapping) and all(isinstance(t, torch.Tensor) for t in out.values()):
        return list(out.values()), [str(k) for k in out], list(out)
    raise DeployError(f"the model returns a {type(out).__name__}: export needs a tensor, a tuple "
                      "of tensors or a dict of tensors")


# ---- export and load -----------------------------------------------------------------------


@contextlib.contextmanager
def _quiet():
    """The exporters print progress, graphs and warnings at length; the command says what matters."""
    names = ["torch", *(n for n in logging.root.manager.loggerDict if n.startswith("torch."))]
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        for logger in loggers:
            logger.setLevel(logging.CRITICAL)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


def export(fmt: str, model: torch.nn.Module, sig: Signature) -> bytes:
    """The exported file, in memory: the caller checks its targets first and writes it
    with the files beside it (a refusal or a full disk then changes nothing)."""
    buffer = io.BytesIO()
    try:
        with _quiet(), torch.no_grad():
            if fmt == "onnx":  # no file: the program, serialized as ONNXProgram.save would
                program = torch.onnx.export(model, (), kwargs=sig.inputs, input_names=list(sig.inputs),
                                            output_names=sig.outputs, dynamic_shapes=sig.export_shapes(),
                                            dynamo=True, verbose=False)
                return program.model_proto.SerializeToString()
            if fmt == "pt2":
                program = torch.export.export(model, (), sig.inputs, dynamic_shapes=sig.export_shapes())
                torch.export.save(program, buffer)
            else:
                traced = torch.jit.trace(model, tuple(sig.inputs.values()), check_trace=False)
                torch.jit.save(traced, buffer)
    except DeployError:
        raise
    except Exception as exc:
        raise DeployError(export_failure(fmt, exc)) from exc
    return buffer.getvalue()


def export_failure(fmt: str, exc: BaseException) -> str:
    """One paragraph on why the exporter refused, without its multi-page traceback."""
    cause = exc.__cause__ if fmt == "onnx" else None  # torch.onnx wraps torch.export's error
    inner = cause or exc
    text = f"{exc}\n{cause}" if cause else str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first_lines = [line.strip() for line in str(inner).splitlines() if line.strip()]
    first = first_lines[0][:300] if first_lines else ""
    where = next((line for line in lines if "File " in line and "site-packages" not in line), "")
    hint = ""
    if "data-dependent" in text or "data dependent" in text or "GuardOnDataDependent" in text:
        hint = ("the model branches on the values of its input; write the branch with "
                "torch.where or torch.cond, or try --format torchscript (which keeps the branch "
                "the example took: the parity check will tell)")
    elif "Constraints violated" in text or "specialized" in text.lower():
        hint = ("a dimension declared dynamic is fixed by the model; adjust the task's "
                "dynamic_shapes (e.g. a max for a length) or leave that axis static")
    return "\n".join(part for part in (
        f"cannot export to {fmt}: {type(inner).__name__}: {first}", where and f"  at {where}",
        hint and f"  hint: {hint}") if part)


class Exported(torch.nn.Module):
    """An exported file behind the model's calling convention, for the task's evaluate."""

    def __init__(self, fmt: str, run: Callable[[dict[str, torch.Tensor]], list[torch.Tensor]],
                 sig: Signature):
        super().__init__()
        self.fmt, self.run, self.sig = fmt, run, sig

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.sig.rebuild(self.run(self.sig.bind(args, kwargs)))


def load(fmt: str, data: bytes, sig: Signature, name: str = "model") -> Exported:
    """The exported file's bytes (`name`: its file name, for messages) as a module."""
    try:
        with _quiet():
            run = _loader(fmt, data, sig)
    except Exception as exc:
        raise DeployError(f"the exported {name} cannot be loaded: {type(exc).__name__}: "
                          f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}") from exc
    return Exported(fmt, run, sig).eval()


def _loader(fmt: str, data: bytes, sig: Signature) -> Callable[[dict[str, torch.Tensor]], list]:
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]

        def run(inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
            feed = {n: inputs[n].detach().cpu().numpy() for n in names}
            return [torch.from_numpy(a) for a in session.run(None, feed)]

        return run
    if fmt == "pt2":
        module = torch.export.load(io.BytesIO(data)).module()
        return lambda inputs: _flatten(module(**inputs))[0]
    traced = torch.jit.load(io.BytesIO(data), map_location="cpu")
    return lambda inputs: _flatten(traced(*inputs.values()))[0]
