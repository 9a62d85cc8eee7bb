"""model.json read back, for `gridrun predict`: the file and every field predict uses checked
before anything is served (describe.py writes it; a field added there is checked here).

The file is read through userfiles (a regular file, at most CARD_LIMIT bytes), parsed, then
checked field by field: `format` one of FORMATS; `model` a file name inside the export
folder (no absolute path, no `..`, no link out of the folder); `inputs` and `outputs`
non-empty lists of objects, each with a unique `name`, a `shape` of sizes (whole numbers)
and dimension names, a `dtype` predict can feed (inputs: INPUT_DTYPES), `dims` naming the
shape's axes, `range` a pair of finite numbers low <= high, `layout` and `note` strings,
`class_names` strings; `static` null or {dimension: size} covering every input dimension;
`dynamic_dims` {dimension: {min, max}} of whole numbers or null; `preprocess` null or an
object whose `included` is true or false. A wrong one is refused in one line (CardError)
naming the file, the field and what was expected. Other fields (metrics, versions, ...)
only inform and are not read.

Imports nothing of gridrun but userfiles.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn

from gridrun.userfiles import RefusedFile, read_regular

MODEL_JSON = "model.json"
CARD_LIMIT = 4_000_000  # bytes: a model.json is a few kB (class names included)
FORMATS = ("onnx", "pt2", "torchscript")
INPUT_DTYPES = ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
                "float16", "float32", "float64")
OUTPUT_DTYPES = (*INPUT_DTYPES, "bfloat16", "complex64", "complex128")
MAX_SIZE = 2**31 - 1  # a size, a static size or a dimension's bound
MAX_AXES = 32
MAX_ELEMENTS = 2**28  # what a static input may be padded to, in elements
MISSING = object()  # a field that is not there
AXES = [str(a) for a in range(MAX_AXES)]  # a `dims` key: an axis as model.json writes it


class CardError(Exception):
    """model.json cannot be served; str() is one line naming the file and the field."""


def load(folder: Path) -> tuple[dict[str, Any], Path]:
    """model.json in `folder`, checked, and the model file it names (resolved, inside the
    folder; whether it exists is the caller's to check). FileNotFoundError if there is none."""
    path = folder / MODEL_JSON
    try:
        data = read_regular(path, limit=CARD_LIMIT, what=MODEL_JSON)
    except RefusedFile as e:
        raise CardError(str(e)) from None
    try:
        card = json.loads(data)
    except RecursionError:
        raise CardError(f"{path} is nested too deeply to be a model.json gridrun wrote") from None
    except ValueError as e:
        first = (str(e).splitlines() or [""])[0][:200]
        raise CardError(f"{path} is not a model.json gridrun wrote (not JSON: {first})") from None
    Checker(path).card(card)
    return card, model_file(path, folder, card["model"])


def model_file(path: Path, folder: Path, name: str) -> Path:
    """The file `model` names: inside `folder`, whatever links lie on the way."""
    where = PurePosixPath(name)
    if where.is_absolute() or ".." in where.parts:
        raise CardError(f"{path}: field 'model' is {short(name)}: expected a file name inside "
                        "its export folder (no absolute path, no '..')")
    home = os.path.realpath(folder)
    real = os.path.realpath(os.path.join(home, name))
    if os.path.commonpath([home, real]) != home or real == home:
        raise CardError(f"{path}: field 'model' is {short(name)}, which leads to {real}: expected "
                        "a file inside its export folder (a link out of it is not followed)")
    return Path(real)


def short(value: Any) -> str:
    """A field's value in a few words (never a whole nested structure)."""
    if isinstance(value, dict):
        return f"an object of {len(value)} fields"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if value is MISSING:
        return "missing"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def finite(v: Any) -> bool:
    """A number a float holds (not NaN, not infinite, no 400-digit integer)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and abs(v) <= sys.float_info.max


def whole(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= MAX_SIZE


def name(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= 200 and "\x00" not in v


class Checker:
    """Each check raises CardError naming `path` and the field."""

    def __init__(self, path: Path):
        self.path = path

    def refuse(self, field: str, value: Any, expected: str) -> NoReturn:
        raise CardError(f"{self.path}: field {field!r} is {short(value)}: expected {expected}; "
                        "export the model again or fix the file")

    def card(self, card: Any) -> None:
        if not isinstance(card, dict):
            raise CardError(f"{self.path} is {short(card)}, not a model.json gridrun wrote: "
                            "expected an object with 'model', 'format', 'inputs' and 'outputs'")
        if card.get("format") not in FORMATS:
            self.refuse("format", card.get("format", MISSING), "one of " + ", ".join(FORMATS))
        if not name(card.get("model")):
            self.refuse("model", card.get("model", MISSING), "the model's file name, inside its folder")
        static = card.get("static")
        if static is not None and not (isinstance(static, dict) and static
                                       and all(name(k) and whole(v, 1) for k, v in static.items())):
            self.refuse("static", static, f"null or an object of dimension sizes (1..{MAX_SIZE})")
        ranges = card.get("dynamic_dims")
        if ranges is not None and not isinstance(ranges, dict):
            self.refuse("dynamic_dims", ranges, "an object of {dimension: {min, max}}")
        for dim, bounds in (ranges or {}).items():
            if not isinstance(bounds, dict):
                self.refuse(f"dynamic_dims.{dim}", bounds, "an object with 'min' and 'max'")
            for key in ("min", "max"):
                if bounds.get(key) is not None and not whole(bounds[key]):
                    self.refuse(f"dynamic_dims.{dim}.{key}", bounds[key],
                                f"null or a whole number 0..{MAX_SIZE}")
        prep = card.get("preprocess")
        if prep is not None and not isinstance(prep, dict):
            self.refuse("preprocess", prep, "null or an object")
        if isinstance(prep, dict) and not isinstance(prep.get("included", False), bool):
            self.refuse("preprocess.included", prep["included"], "true or false")
        for which in ("inputs", "outputs"):
            specs = card.get(which, MISSING)
            if not isinstance(specs, list) or not specs or len(specs) > 256:
                self.refuse(which, specs, "a non-empty list of objects (name, shape, dtype)")
            for i, spec in enumerate(specs):
                self.spec(f"{which}[{i}]", spec, which == "inputs", static)
            names = [s["name"] for s in specs]
            if len(set(names)) != len(names):
                self.refuse(which, names, "each name once")

    def spec(self, field: str, spec: Any, feed: bool, static: dict[str, int] | None) -> None:
        if not isinstance(spec, dict):
            self.refuse(field, spec, "an object with name, shape and dtype")
        if not name(spec.get("name")):
            self.refuse(f"{field}.name", spec.get("name", MISSING), "the name, a non-empty string")
        shape, dims = spec.get("shape", MISSING), spec.get("dims", {})
        if not isinstance(shape, list) or len(shape) > MAX_AXES or (feed and not shape):
            self.refuse(f"{field}.shape", shape, f"a list of {int(feed)} to {MAX_AXES} sizes or "
                        "dimension names")
        for axis, size in enumerate(shape):
            if not (whole(size) or name(size)):
                self.refuse(f"{field}.shape", shape, f"a size (0..{MAX_SIZE}) or a dimension name "
                            f"at each axis, not {short(size)} at axis {axis}")
        dtypes = INPUT_DTYPES if feed else OUTPUT_DTYPES
        if spec.get("dtype") not in dtypes:
            self.refuse(f"{field}.dtype", spec.get("dtype", MISSING), "one of " + ", ".join(dtypes))
        if not isinstance(dims, dict):
            self.refuse(f"{field}.dims", dims, "an object of {axis: dimension name}")
        for axis, dim in dims.items():
            if not (axis in AXES[:len(shape)] and name(dim)):
                self.refuse(f"{field}.dims", dims, f"an axis of the shape (0..{len(shape) - 1}) "
                            "and a dimension name for each entry")
        for axis, size in enumerate(shape):
            if isinstance(size, str) and dims.get(str(axis)) != size:
                self.refuse(f"{field}.dims", dims, f"axis {axis} named {size!r}, as the shape says")
        if feed and static is not None:
            missing = [d for d in dims.values() if d not in static]
            if missing:
                self.refuse("static", static, f"a size for {short(missing[0])}, a dimension of {field}")
            sizes = [static[dims[str(a)]] if str(a) in dims else s for a, s in enumerate(shape)]
            if math.prod(sizes) > MAX_ELEMENTS:
                self.refuse("static", static, f"sizes that pad {field} to at most {MAX_ELEMENTS} values")
        declared = spec.get("range")
        if declared is not None and not (isinstance(declared, list) and len(declared) == 2
                                         and all(map(finite, declared))):
            self.refuse(f"{field}.range", declared, "a pair of finite numbers [low, high]")
        if declared is not None and declared[0] > declared[1]:
            self.refuse(f"{field}.range", declared, "a pair of finite numbers [low, high] with low <= high")
        for key in ("layout", "note"):
            if not isinstance(spec.get(key, ""), str):
                self.refuse(f"{field}.{key}", spec[key], "a string")
        if len(spec.get("layout", "")) > MAX_AXES:
            self.refuse(f"{field}.layout", spec["layout"], f"one letter per axis, at most {MAX_AXES}")
        names = spec.get("class_names")
        if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            self.refuse(f"{field}.class_names", names, "a list of strings, one per class")
