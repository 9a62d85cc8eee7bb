"""Does the exported model compute what PyTorch computes? Checked on real validation batches.

The batches: the first N of the validation loader (as the trainer saw them;
raw ones when the preprocess is exported too), plus one whose dynamic
dimensions (batch size, and for `sort` the sequence length) all differ from the
example the model was exported with. Per output: the largest absolute and
relative difference, against tolerances per dtype (overridable). The task's own
metrics, both ways, are computed on exactly the validation set by the caller
(`metrics`), so that PyTorch's match the run's record; the unseen-shape batch
is reported on its own line, never mixed into them.
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


def batches_for(run: Any, loader: Any, sig: Signature, count: int,
                data: Any) -> list[tuple[str, Any]]:
    """[(label, CPU batch)]: `count` validation batches, then one of an unseen shape (drawn
    from `data`: the validation set the loader reads, raw or not)."""
    chosen = [(f"val {i}", b) for i, b in enumerate(itertools.islice(loader, count))]
    unseen = unseen_batch(run, sig, data)
    if unseen is not None:
        chosen.append(unseen)
    return chosen


def unseen_batch(run: Any, sig: Signature, data: Any) -> tuple[str, Any] | None:
    """A few validation samples whose every dynamic dimension differs from the example's."""
    from gridrun.train.data import VALIDATION, SeededBatches
    from gridrun.train.seeding import stream_seed

    fetch = SeededBatches(data, run.task.collate_fn)
    seen = sig.dim_sizes(sig.inputs)
    first = None
    for i in range(min(64, len(data) // UNSEEN_SIZE)):
        indices = list(range(i * UNSEEN_SIZE, (i + 1) * UNSEEN_SIZE))
        batch = fetch[(stream_seed(run.augment_seed, VALIDATION, 1_000_000 + i), indices)]
        sizes = sig.dim_sizes(sig.call_inputs(batch))
        if first is None:
            first = batch
        if all(sizes[d] != seen[d] for d in sizes):
            return "unseen shape", batch
    return ("unseen shape?", first) if first is not None else None


def tolerance(dtype: torch.dtype, atol: float | None, rtol: float | None) -> tuple[float, float]:
    a, r = TOLERANCES.get(dtype, (0.0, 0.0))  # integers and booleans: exactly
    return (a if atol is None else atol), (r if rtol is None else rtol)


def check(model: torch.nn.Module, program: Exported, sig: Signature,
          batches: list[tuple[str, Any]], *, fmt: str, atol: float | None,
          rtol: float | None) -> dict[str, Any]:
    """The parity report (parity.json) less its metrics: per output, per batch, ok."""
    outputs = {n: {"max_abs": 0.0, "max_rel": 0.0, "dtype": str(t.dtype).removeprefix("torch."),
                   "atol": tolerance(t.dtype, atol, rtol)[0], "rtol": tolerance(t.dtype, atol, rtol)[1],
                   "ok": True} for n, t in zip(sig.outputs, sig.example_outputs, strict=True)}
    rows, problems = [], []
    for label, batch in batches:
        inputs = sig.call_inputs(batch)
        row = {"batch": label, "inputs": {n: list(t.shape) for n, t in inputs.items()}, "error": None,
               "max_abs": 0.0}
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
                problem = _compare(name, a, b, outputs[name], label, row)
                if problem:
                    problems.append(problem)
    return {"ok": not problems, "problems": problems, "outputs": outputs, "batches": rows}


def metrics(report: dict[str, Any], fmt: str, recorded: dict[str, float],
            evaluate: Any, model: torch.nn.Module, program: torch.nn.Module, samples: int) -> None:
    """Add the task's metrics on the whole validation set, PyTorch's and the exported model's
    (`evaluate(model)`: the trainer's evaluation), beside the run's record."""
    found: dict[str, Any] = {"recorded": recorded}
    for who, m in (("pytorch", model), (fmt, program)):
        try:
            found[who] = evaluate(m)
        except Exception as exc:
            found[who] = {}
            report["ok"] = False
            report["problems"].append(f"the task's evaluate fails on the {who} model over the "
                                      f"validation set: {_first_line(exc)}")
    report["metrics"] = found
    report["metrics_samples"] = samples
    off = [k for k, v in found["pytorch"].items()
           if k in recorded and not math.isclose(v, recorded[k], rel_tol=1e-6, abs_tol=1e-9)]
    if off:
        report.setdefault("notes", []).append(
            "PyTorch's " + ", ".join(f"{k} {found['pytorch'][k]:.6g}" for k in off)
            + " on this validation data differ from the run's record ("
            + ", ".join(f"{recorded[k]:.6g}" for k in off) + "): the model's input is not what "
            "training evaluated (does the task's data path call its preprocess?)")


def _flat(out: Any, sig: Signature) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return list(out.values()) if isinstance(out, dict) else list(out)


def _compare(name: str, got: torch.Tensor, expected: torch.Tensor, stats: dict[str, Any],
             label: str, row: dict[str, Any]) -> str | None:
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
    row["max_abs"] = max(row["max_abs"], max_abs)
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
    val = [r for r in report["batches"] if not r["batch"].startswith("unseen")]
    unseen = [r for r in report["batches"] if r["batch"].startswith("unseen")]
    shapes = "; ".join(f"{r['batch']}: " + ", ".join(f"{n} {shape_text(s)}" for n, s in r["inputs"].items())
                       for r in val)
    whole = "; preprocess + model, from raw data" if report.get("preprocess") else ""
    lines = [f"parity of {report['model']} ({fmt}{whole}) against PyTorch on {len(val)} "
             f"validation batch{'es' * (len(val) != 1)} ({shapes})"]
    if report.get("static"):
        lines.append("static: every input fed padded to " + ", ".join(
            f"{d} {n}" for d, n in report["static"].items()))
    head = f"  {'output':<12} {'dtype':<8} {'max abs diff':>12} {'max rel diff':>12}  {'atol':>7} {'rtol':>7}"
    lines += ["", head]
    for name, s in report["outputs"].items():
        lines.append(f"  {name:<12} {s['dtype']:<8} {s['max_abs']:>12.3g} {s['max_rel']:>12.3g}  "
                     f"{s['atol']:>7.0e} {s['rtol']:>7.0e}  {'ok' if s['ok'] else 'DIFFERS'}")
    for r in unseen:
        shown = ", ".join(f"{n} {shape_text(s)}" for n, s in r["inputs"].items())
        got = f"fails: {r['error']}" if r["error"] else f"max abs diff {r['max_abs']:.3g}"
        lines.append(f"  {r['batch']} ({shown}, not part of the metrics): {got}")
    m = report.get("metrics") or {}
    if m.get("pytorch"):
        n = report.get("metrics_samples")
        lines += ["", f"  {'metric':<12} {'recorded':>12} {'pytorch':>12} {fmt:>12}"
                  + (f"   (the validation set, {n} samples)" if n else "")]
        for k, v in m["pytorch"].items():
            lines.append(f"  {k:<12} {m.get('recorded', {}).get(k, math.nan):>12.6g} {v:>12.6g} "
                         f"{m.get(fmt, {}).get(k, math.nan):>12.6g}")
    lines.append("")
    took = f"exported in {report['export_s']:.2f} s"
    if report.get("train_s"):
        took += f" (the run trained in {report['train_s']:.1f} s)"
    lines.append(took)
    lines += [f"note: {note}" for note in report.get("notes", [])]
    if report["ok"]:
        lines.append("parity ok")
    else:
        lines += ["PARITY FAILED: the exported model does not compute what PyTorch computes",
                  *(f"  {p}" for p in report["problems"][:8])]
    return "\n".join(lines)
