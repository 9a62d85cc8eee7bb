"""`gridrun predict`'s results: each input's outputs as plain values, the top classes of a
classifier, the decision of a one-logit binary model, as text lines or as strict JSON (a NaN
or an infinity written as null, with a note saying how many). NumPy only.

The outputs stay NumPy arrays until they are written, CHUNK samples at a time: a Python
object for each sample's value and class (a dict, a float) took 5.7 GB for the 2.65 million
samples a 16 MB JSON input holds (issue 45). So the memory a result takes is its arrays'.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from gridrun.deploy.predict import Served

CHUNK = 4096  # samples made into text at once
Write = Callable[[str], None]


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


@dataclass
class Found:
    """One input's outputs, as arrays, with what is shown of each."""

    input: str
    fed: dict[str, list]  # input name -> [dtype, shape]
    outputs: list[tuple[dict[str, Any], np.ndarray]]  # (model.json's output, its values)
    top: int
    notes: list[str] = field(default_factory=list)


def result(path: Path, feed: dict[str, np.ndarray], outs: list[np.ndarray], served: Served,
           top: int) -> Found:
    """One input's outputs; what is shown of each (top-k per sample of a classifier's, the
    decision of a binary one) is decided as they are written."""
    found = Found(str(path), {n: [str(a.dtype), list(a.shape)] for n, a in feed.items()},
                  list(zip(served.outputs, outs, strict=True)), top)
    for spec, out in found.outputs:
        bad = int(np.count_nonzero(~np.isfinite(out))) if out.dtype.kind in "fc" else 0
        if bad:
            found.notes.append(f"output {spec['name']!r}: {bad} of {out.size} values non-finite "
                               "(NaN or infinity; null in --json)")
    return found


def _classes(spec: dict[str, Any], out: np.ndarray) -> list[str] | None:
    """A classifier's class names, when its top classes are shown (not for a binary one)."""
    names = spec.get("class_names")
    if out.dtype.kind not in "iuf" or threshold(spec, out) is not None:
        return None
    if names and len(names) > 1 and out.ndim >= 1 and out.shape[-1] == len(names):
        return names
    return None


def _ranked(out: np.ndarray, names: list[str], top: int) -> Iterator[tuple[int, list, list, list]]:
    """(first sample, scores, probabilities, top classes' indices) for CHUNK samples at a
    time, as Python lists: a NumPy scalar formats ten times slower than a float."""
    scores = out.reshape(-1, len(names))
    for start in range(0, scores.shape[0], CHUNK):
        s = scores[start:start + CHUNK]
        order = np.argsort(-s, axis=1, kind="stable")[:, :top]
        yield start, s.tolist(), softmax(s.astype(np.float64)).tolist(), order.tolist()


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


# ---- JSON --------------------------------------------------------------------------------


def write_json(found: list[Found], write: Write) -> None:
    """`--json`'s text, written as it is made: strict JSON, a NaN or an infinity as null
    (a note says so)."""
    write("[")
    for i, item in enumerate(found):
        write(("," if i else "") + "\n{" + json.dumps({"input": item.input})[1:-1]
              + ', "fed": ' + json.dumps(item.fed)
              + ', "dtypes": ' + json.dumps({s["name"]: str(o.dtype) for s, o in item.outputs})
              + ',\n "outputs": {')
        for k, (spec, out) in enumerate(item.outputs):
            write(("," if k else "") + "\n  " + json.dumps(spec["name"]) + ": ")
            _array(out, write)
        write("}")
        decided = [(spec, out, threshold(spec, out)) for spec, out in item.outputs
                   if out.dtype.kind in "iuf"]
        decided = [(spec, out, rule) for spec, out, rule in decided if rule is not None]
        if decided:
            write(',\n "decisions": {')
            for k, (spec, out, (rule, cut)) in enumerate(decided):
                write(("," if k else "") + "\n  " + json.dumps(spec["name"]) + ': {"rule": '
                      + json.dumps(rule) + ', "values": ')
                _array((out[..., 0] > cut).astype(int), write)
                write("}")
            write("}")
        ranked = [(spec, out, names) for spec, out in item.outputs
                  if (names := _classes(spec, out)) is not None]
        if ranked:
            write(',\n "top": {')
            for k, (spec, out, names) in enumerate(ranked):
                write(("," if k else "") + "\n  " + json.dumps(spec["name"]) + ": [")
                for start, s, p, order in _ranked(out, names, item.top):
                    rows = [[{"class": names[c], "score": _finite(sr[c]), "p": _finite(pr[c])}
                             for c in cs] for sr, pr, cs in zip(s, p, order, strict=True)]
                    write(("," if start else "") + "\n   " + json.dumps(rows)[1:-1])
                write("]")
            write("}")
        if item.notes:
            write(',\n "notes": ' + json.dumps(item.notes))
        write("}")
    write("\n]\n")


def _array(a: np.ndarray, write: Write) -> None:
    """An array as JSON, CHUNK rows at a time."""
    if a.ndim == 0 or a.dtype.kind not in "biuf":
        write(json.dumps(_strict(a.tolist()), default=str))
        return
    write("[")
    for start in range(0, a.shape[0], CHUNK):
        text = json.dumps(a[start:start + CHUNK].tolist())[1:-1]
        if a.dtype.kind == "f":  # numbers only: no string to mistake for these words
            text = text.replace("-Infinity", "null").replace("Infinity", "null").replace("NaN", "null")
        write(("," if start else "") + "\n   " + text)
    write("]")


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


# ---- text ---------------------------------------------------------------------------------


def write_lines(found: Found, write: Write) -> None:
    """The text of one input's outputs, written as it is made."""
    fed = ", ".join(f"{n} {d} {s}" for n, (d, s) in found.fed.items())
    write(f"{found.input}  ({fed})\n")
    for spec, a in found.outputs:
        name = spec["name"]
        names = _classes(spec, a)
        if names is not None:
            many = a.reshape(-1, len(names)).shape[0] > 1
            for start, s, p, order in _ranked(a, names, found.top):
                lines = []
                for r, (sr, pr, cs) in enumerate(zip(s, p, order, strict=True), start):
                    if many:
                        lines.append(f"  sample {r}")
                    lines += [f"  {names[c]:<12} {pr[c]:.3f}  ({name} {sr[c]:.4g})" for c in cs]
                write("\n".join(lines) + "\n")
            continue
        write(f"  {name} {a.dtype} {list(a.shape)}: "
              + np.array2string(a, precision=4, threshold=40, max_line_width=100).replace("\n", " ")
              + "\n")
        rule = threshold(spec, a) if a.dtype.kind in "iuf" else None
        if rule:
            write(f"  {rule[0]} (one output): "
                  + np.array2string((a[..., 0] > rule[1]).astype(int), threshold=60,
                                    max_line_width=100).replace("\n", " ") + "\n")
        elif a.dtype.kind == "f" and a.ndim >= 2 and a.shape[-1]:
            write("  argmax over its last axis: "
                  + np.array2string(a.argmax(-1), threshold=60, max_line_width=100).replace("\n", " ")
                  + "\n")
    for note in found.notes:
        write(f"  note: {note}\n")

