"""Does the exported model compute what PyTorch computes? Checked on real validation batches.

The batches: the first N of the validation loader (as the trainer saw them),
plus one whose dynamic dimensions (batch size, and for `sort` the sequence
length) all differ from the example the model was exported with. Per output:
the largest absolute and relative difference, against tolerances per dtype
(overridable); and the task's own validation metrics computed both ways.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from gridrun.deploy.formats import Exported, Signature, shape_text

# (atol, rtol) per output dtype: |exported - pytorch| <= atol + rtol * |pytorch|
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-8, 1e-6),
    torch.float32: (1e-4, 1e-3),
    torch.bfloat16: (1e-2, 2e-2),
    torch.float16: (1e-3, 1e-2),
}
UNSEEN_SIZE = 3  # samples in the batch of an unseen shape (not 1: a size-1 axis may be fixed)


def batches_for(run: Any, loader: Any, sig: Signature, count: int) -> list[tuple[str, Any]]:
    """[(label, CPU batch)]: `count` validation batches, then one of an unseen shape."""
    chosen = [(f"val {i}", b) for i, b in enumerate(itertools.islice(loader, count))]
    unseen = unseen_batch(run, sig)
    if unseen is not None:
        chosen.append(unseen)
    return chosen


def unseen_batch(run: Any, sig: Signature) -> tuple[str, Any] | None:
    """A few validation samples whose every dynamic dimension differs from the example's."""
    from gridrun.train.data import VALIDATION, SeededBatches
    from gridrun.train.seeding import stream_seed

    data = run.task.val_data
    fetch = SeededBatches(data, run.task.collate_fn)
    seen = sig.dim_sizes(sig.inputs)
    first = None
    for i in range(min(64, len(data) // UNSEEN_SIZE)):
        indices = list(range(i * UNSEEN_SIZE, (i + 1) * UNSEEN_SIZE))
        batch = fetch[(stream_seed(run.spec.seed, VALIDATION, 1_000_000 + i), indices)]
        sizes = sig.dim_sizes(sig.call_inputs(batch))
        if first is None:
            first = batch
        if all(sizes[d] != seen[d] for d in sizes):
            return "unseen shape", batch
    return ("unseen shape?", first) if first is not None else None


def tolerance(dtype: torch.dtype, atol: float | None, rtol: float | None) -> tuple[float, float]:
    a, r = TOLERANCES.get(dtype, (0.0, 0.0))  # integers and booleans: exactly
    return (a if atol is None else atol), (r if rtol is None else rtol)


def check(model: torch.nn.Module, program: Exported, task: Any, sig: Signature,
          batches: list[tuple[str, Any]], *, fmt: str, atol: float | None,
          rtol: float | None) -> dict[str, Any]:
    """The parity report (parity.json): per output, per batch, metrics both ways, ok."""
    outputs = {n: {"max_abs": 0.0, "max_rel": 0.0, "dtype": str(t.dtype).removeprefix("torch."),
                   "atol": tolerance(t.dtype, atol, rtol)[0], "rtol": tolerance(t.dtype, atol, rtol)[1],
                   "ok": True} for n, t in zip(sig.outputs, sig.example_outputs, strict=True)}
    rows, problems = [], []
    sums: dict[str, dict[str, list[float]]] = {"pytorch": {}, fmt: {}}
    for label, batch in batches:
        inputs = sig.call_inputs(batch)
        row = {"batch": label, "inputs": {n: list(t.shape) for n, t in inputs.items()}, "error": None}
        rows.append(row)
        with torch.inference_mode():
            expected = sig.rebuild(_flat(model(**inputs), sig))
            try:
                got = program(**inputs)
            except Exception as exc:
                row["error"] = _first_line(exc)
                problems.append(f"the exported model fails on batch {label!r} ("
                                + ", ".join(f"{n} {shape_text(s)}" for n, s in row["inputs"].items())
                                + f"): {row['error']}")
                continue
            for name, a, b in zip(sig.outputs, _flat(got, sig), _flat(expected, sig), strict=True):
                problem = _compare(name, a, b, outputs[name], label)
                if problem:
                    problems.append(problem)
            for who, m in (("pytorch", model), (fmt, program)):
                for metric, (s, n) in task.evaluate(m, batch).items():
                    acc = sums[who].setdefault(metric, [0.0, 0.0])
                    acc[0] += float(torch.as_tensor(s, dtype=torch.float64))
                    acc[1] += float(torch.as_tensor(n, dtype=torch.float64))
    metrics = {who: {k: (s / n if n else math.nan) for k, (s, n) in d.items()} for who, d in sums.items()}
    return {"ok": not problems, "problems": problems, "outputs": outputs, "batches": rows,
            "metrics": metrics}


def _flat(out: Any, sig: Signature) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return list(out.values()) if isinstance(out, dict) else list(out)


def _compare(name: str, got: torch.Tensor, expected: torch.Tensor, stats: dict[str, Any],
             label: str) -> str | None:
    if tuple(got.shape) != tuple(expected.shape):
        stats["ok"] = False
        return (f"output {name!r} on batch {label!r} has shape {list(got.shape)}, "
                f"PyTorch's {list(expected.shape)}")
    a, b = got.detach().double(), expected.detach().double()
    diff = (a - b).abs()
    finite = torch.isfinite(a) == torch.isfinite(b)
    both_nan = torch.isnan(a) & torch.isnan(b)
    diff = torch.where(both_nan | (a == b), 0.0, diff)  # equal infinities and NaNs agree
    if not bool(finite.all()):
        diff = torch.where(finite, diff, math.inf)
    max_abs = float(diff.max()) if diff.numel() else 0.0
    max_rel = float((diff / b.abs().clamp_min(1e-12)).max()) if diff.numel() else 0.0
    stats["max_abs"], stats["max_rel"] = max(stats["max_abs"], max_abs), max(stats["max_rel"], max_rel)
    bad = diff > stats["atol"] + stats["rtol"] * b.abs()
    if bool(bad.any()):
        stats["ok"] = False
        i = int(bad.reshape(-1).nonzero()[0, 0])
        return (f"output {name!r} differs on batch {label!r}: {int(bad.sum())} of {bad.numel()} "
                f"values beyond atol {stats['atol']:g} + rtol {stats['rtol']:g}; e.g. element {i}: "
                f"exported {a.reshape(-1)[i].item():.6g}, PyTorch {b.reshape(-1)[i].item():.6g}")
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"


def table(report: dict[str, Any]) -> str:
    """The report as a few aligned lines for a terminal."""
    fmt = report["format"]
    shapes = "; ".join(f"{r['batch']}: " + ", ".join(f"{n} {shape_text(s)}" for n, s in r["inputs"].items())
                       for r in report["batches"])
    lines = [f"parity of {report['model']} ({fmt}) against PyTorch on {len(report['batches'])} "
             f"validation batches ({shapes})", ""]
    head = f"  {'output':<12} {'dtype':<8} {'max abs diff':>12} {'max rel diff':>12}  {'atol':>7} {'rtol':>7}"
    lines.append(head)
    for name, s in report["outputs"].items():
        lines.append(f"  {name:<12} {s['dtype']:<8} {s['max_abs']:>12.3g} {s['max_rel']:>12.3g}  "
                     f"{s['atol']:>7.0e} {s['rtol']:>7.0e}  {'ok' if s['ok'] else 'DIFFERS'}")
    m = report["metrics"]
    if m.get("pytorch"):
        lines += ["", f"  {'metric':<12} {'pytorch':>12} {fmt:>12}"]
        for k, v in m["pytorch"].items():
            lines.append(f"  {k:<12} {v:>12.6g} {m[fmt].get(k, math.nan):>12.6g}")
    lines.append("")
    took = f"exported in {report['export_s']:.2f} s"
    if report.get("train_s"):
        took += f" (the run trained in {report['train_s']:.1f} s)"
    lines.append(took)
    if report["ok"]:
        lines.append("parity ok")
    else:
        lines += ["PARITY FAILED: the exported model does not compute what PyTorch computes",
                  *(f"  {p}" for p in report["problems"][:8])]
    return "\n".join(lines)
