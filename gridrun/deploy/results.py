"""`gridrun predict`'s results: each input's outputs as plain values, the top classes of a
classifier, the decision of a one-logit binary model, as text lines or as strict JSON (a NaN
or an infinity written as null, with a note saying how many). NumPy only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from gridrun.deploy.predict import Served


def softmax(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):  # a NaN or infinite logit gives NaN, silently
        z = np.exp(x - x.max(axis=-1, keepdims=True))
        return z / z.sum(axis=-1, keepdims=True)


def threshold(spec: dict[str, Any], out: np.ndarray) -> tuple[str, float] | None:
    """(rule, cut) for a one-output binary model, whose last axis has size 1: argmax over it
    is always 0, so the decision is the logit's sign, or 0.5 for an output model.json
    declares a probability (its range within 0..1); None for any other output."""
    shape = spec.get("shape") or list(out.shape)
    if out.dtype.kind != "f" or out.ndim < 2 or len(shape) < 2 or shape[-1] != 1:
        return None
    declared = spec.get("range")
    if isinstance(declared, list) and len(declared) == 2 and declared[0] >= 0 and declared[1] <= 1:
        return "probability > 0.5", 0.5
    return "logit > 0", 0.0


def result(path: Path, feed: dict[str, np.ndarray], outs: list[np.ndarray], served: Served,
           top: int) -> dict[str, Any]:
    """One input's outputs as plain values; top-k per sample for a classifier's output."""
    found: dict[str, Any] = {"input": str(path),
                             "fed": {n: [str(a.dtype), list(a.shape)] for n, a in feed.items()},
                             "outputs": {s["name"]: o.tolist() for s, o in zip(served.outputs, outs, strict=True)},
                             "dtypes": {s["name"]: str(o.dtype) for s, o in zip(served.outputs, outs, strict=True)}}
    for spec, out in zip(served.outputs, outs, strict=True):
        bad = int(np.count_nonzero(~np.isfinite(out))) if out.dtype.kind in "fc" else 0
        if bad:
            found.setdefault("notes", []).append(
                f"output {spec['name']!r}: {bad} of {out.size} values non-finite (NaN or infinity; "
                "null in --json)")
        if out.dtype.kind not in "iuf":
            continue
        names = spec.get("class_names")
        rule = threshold(spec, out)
        if rule is not None:
            found.setdefault("decisions", {})[spec["name"]] = {
                "rule": rule[0], "values": (out[..., 0] > rule[1]).astype(int).tolist()}
            continue
        if names and len(names) > 1 and out.ndim >= 1 and out.shape[-1] == len(names):
            probs = softmax(out.astype(np.float64).reshape(-1, len(names)))
            scores = out.reshape(-1, len(names))
            found.setdefault("top", {})[spec["name"]] = [
                [{"class": names[k], "score": float(s[k]), "p": float(p[k])}
                 for k in np.argsort(-s, kind="stable")[:top]] for s, p in zip(scores, probs, strict=True)]
    return found


def json_text(found: list[dict[str, Any]]) -> str:
    """`--json`'s text: strict JSON, a NaN or an infinity written as null (a note says so)."""
    return json.dumps(_strict(found), indent=1, allow_nan=False, default=str)


def _strict(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, complex):
        return [_strict(v.real), _strict(v.imag)]
    if isinstance(v, dict):
        return {k: _strict(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_strict(x) for x in v]
    return v


def lines(found: dict[str, Any], served: Served) -> list[str]:
    fed = ", ".join(f"{n} {d} {s}" for n, (d, s) in found["fed"].items())
    out = [f"{found['input']}  ({fed})"]
    for spec in served.outputs:
        name = spec["name"]
        if name in found.get("top", {}):
            rows = found["top"][name]
            for i, row in enumerate(rows):
                if len(rows) > 1:
                    out.append(f"  sample {i}")
                out += [f"  {r['class']:<12} {r['p']:.3f}  ({name} {r['score']:.4g})" for r in row]
            continue
        a = np.asarray(found["outputs"][name], dtype=found["dtypes"][name])
        out.append(f"  {name} {a.dtype} {list(a.shape)}: "
                   + np.array2string(a, precision=4, threshold=40, max_line_width=100).replace("\n", " "))
        decided = found.get("decisions", {}).get(name)
        if decided:
            out.append(f"  {decided['rule']} (one output): "
                       + np.array2string(np.asarray(decided["values"]), threshold=60,
                                         max_line_width=100).replace("\n", " "))
        elif a.dtype.kind == "f" and a.ndim >= 2 and a.shape[-1]:
            out.append("  argmax over its last axis: "
                       + np.array2string(a.argmax(-1), threshold=60, max_line_width=100).replace("\n", " "))
    return out + [f"  note: {note}" for note in found.get("notes", [])]
