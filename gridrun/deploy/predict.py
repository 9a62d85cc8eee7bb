"""`gridrun predict`: an exported folder served from its model.json alone.

Reads model.json, runs the model file it names (onnxruntime for ONNX, the
loaded program for `pt2` and TorchScript) on inputs read from files (an image,
a `.npy`/`.npz`, or JSON: jsoninput.py, in memory in proportion to the file) and
returns the outputs (results.py writes them as it makes their text). It imports no
task code and no training code: of gridrun only userfiles, modeljson, jsoninput and
results; NumPy, and onnxruntime (or torch for the other formats), Pillow for images. What it reads is checked against model.json first (dtype, shape, layout,
range; NaN and infinities refused), so a wrong input gets one line saying what
was expected, never a runtime's stack trace.

Every file is read through userfiles (regular files only, a FIFO never hangs) with
a size bound: JSON_LIMIT for a JSON input (more: a .npy), ARRAY_LIMIT for a .npy
or a .npz (uncompressed), IMAGE_LIMIT and IMAGE_PIXELS for an image; model.json
is checked field by field on load (modeljson.py) and may only name a model file
inside its own folder.
"""

from __future__ import annotations

import io
import os
import stat
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from gridrun.deploy import jsoninput, modeljson
from gridrun.userfiles import RefusedFile, kind_of, open_regular

MODEL_JSON = modeljson.MODEL_JSON
JSON_LIMIT = 16_000_000  # bytes of a JSON input: a larger input is given as a .npy
ARRAY_LIMIT = 1_000_000_000  # bytes of a .npy, or of a .npz's arrays uncompressed
IMAGE_LIMIT = 64_000_000  # bytes of an image file
IMAGE_PIXELS = 2**25  # an image's width x height, checked before it is decoded
IMAGES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
INSTALL = {"onnxruntime": "pip install onnxruntime (or 'gridrun[export]')",
           "torch": "pip install torch", "PIL": "pip install pillow (or 'gridrun[export]')"}
MODES = {1: "L", 3: "RGB", 4: "RGBA"}


class PredictError(Exception):
    """A folder, file or input that cannot be served as asked; str() is one line."""


def _import(name: str, why: str) -> Any:
    import importlib

    top = name.split(".")[0]
    try:
        return importlib.import_module(name)
    except ImportError:
        raise PredictError(f"{why} needs {'Pillow' if top == 'PIL' else top}: "
                           f"{INSTALL.get(top, 'pip install ' + top)}"
                           + (" (or give the image as a .npy)" if top == "PIL" else "")) from None


def describe(spec: dict[str, Any], card: dict[str, Any] | None = None) -> str:
    """An input as model.json describes it: `'raw' uint8 [batch, 16, 16, 1] (layout HWC, values
    0..255)`; with the card, also the dynamic dimensions' ranges, or that it is static."""
    extra = []
    card = card or {}
    for dim in dict.fromkeys(spec.get("dims", {}).values()):
        got = (card.get("dynamic_dims") or {}).get(dim) or {}
        if got.get("max") is not None:
            extra.append(f"{dim} {got.get('min') or 0}..{got['max']}")
    if card.get("static") and spec.get("dims"):
        extra.append("static: smaller inputs are fed padded")
    if spec.get("layout"):
        extra.append(f"layout {spec['layout']}")
    if spec.get("range"):
        low, high = spec["range"]
        extra.append(f"values {low:g}..{high:g}")
    shape = "[" + ", ".join(str(s) for s in spec["shape"]) + "]"
    return f"{spec['name']!r} {spec['dtype']} {shape}" + (f" ({', '.join(extra)})" if extra else "")


class Served:
    """An export folder: model.json and the model file it names, ready to run."""

    def __init__(self, folder: str | Path):
        path = Path(folder)
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise PredictError(f"{path}: no such folder (give the folder export-model wrote)") from None
        except OSError as e:
            raise PredictError(f"cannot read {path}: {e.strerror or e}") from None
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            raise PredictError(f"{path} is {kind_of(mode)}: give the folder export-model wrote "
                               "(or its model file)")
        folder = path if stat.S_ISDIR(mode) else path.parent
        try:
            self.card, self.model_file = modeljson.load(folder)
        except FileNotFoundError:
            raise PredictError(f"{folder} has no {MODEL_JSON}: give the folder `gridrun export-model` "
                               "wrote (it holds the model file, model.json and parity.json)") from None
        except modeljson.CardError as e:
            raise PredictError(str(e)) from None
        self.fmt: str = self.card["format"]
        self.inputs: list[dict[str, Any]] = self.card["inputs"]
        self.outputs: list[dict[str, Any]] = self.card["outputs"]
        self.static: dict[str, int] | None = self.card.get("static")
        self._run = self._loader()

    def _loader(self) -> Any:
        path = str(self.model_file)
        try:  # the model file as model.json names it: a regular file inside the folder
            model = open_regular(path, what="model file")
        except FileNotFoundError:
            raise PredictError(f"{path} is missing: {MODEL_JSON} names it ({self.fmt}); export "
                               "again or copy the whole folder") from None
        except RefusedFile as e:
            raise PredictError(str(e)) from None
        with model:
            if self.fmt == "onnx":
                ort = _import("onnxruntime", "serving an ONNX model")
                try:  # from the bytes read: the file checked is the file loaded
                    session = ort.InferenceSession(model.read(), providers=["CPUExecutionProvider"])
                except Exception as e:
                    raise PredictError(f"{path} cannot be loaded by onnxruntime: {_first(e)}") from None
                return lambda feed: session.run(None, feed)
            torch = _import("torch", f"serving a {self.fmt} model")
            try:
                if self.fmt == "pt2":
                    module = torch.export.load(model).module()
                else:
                    module = torch.jit.load(model, map_location="cpu")
            except Exception as e:
                raise PredictError(f"{path} cannot be loaded: {_first(e)}") from None

        def run(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            tensors = {i["name"]: torch.from_numpy(np.array(feed[i["name"]])) for i in self.inputs}
            with torch.inference_mode():  # pt2 takes the names it was exported with; TorchScript, the order
                out = module(**tensors) if self.fmt == "pt2" else module(*tensors.values())
            flat = list(out.values()) if isinstance(out, dict) else (
                list(out) if isinstance(out, list | tuple) else [out])
            return [t.detach().cpu().numpy() for t in flat]

        return run

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The outputs for a checked feed; a static model gets it padded, in chunks."""
        if not self.static:
            return self._call(feed)
        batch = next(iter(feed.values())).shape[0]
        size = next((self.static[d] for i in self.inputs for a, d in i.get("dims", {}).items()
                     if a == "0"), batch)
        parts = [self._padded({n: a[start:start + size] for n, a in feed.items()})
                 for start in range(0, batch, size)]
        try:
            return [np.concatenate([p[k] for p in parts], axis=0) for k in range(len(self.outputs))]
        except (ValueError, IndexError) as e:
            raise PredictError(f"the model's outputs cannot be put back together along the batch "
                               f"as model.json's static sizes say: {_first(e)}") from None

    def _padded(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        given: dict[str, int] = {}
        padded = {}
        for spec in self.inputs:
            a = feed[spec["name"]]
            for axis, dim in ((int(k), d) for k, d in spec.get("dims", {}).items()):
                given[dim] = a.shape[axis]
                a = _pad(a, axis, self.static[dim])
            padded[spec["name"]] = a
        outs = self._call(padded)
        cut = []
        for spec, out in zip(self.outputs, outs, strict=True):
            for axis, dim in ((int(k), d) for k, d in spec.get("dims", {}).items()):
                if dim in given and axis < out.ndim and out.shape[axis] >= given[dim]:
                    out = np.take(out, range(given[dim]), axis=axis)
            cut.append(out)
        return cut

    def _call(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            outs = [np.asarray(o) for o in self._run(feed)]
        except PredictError:
            raise
        except Exception as e:
            raise PredictError("the model failed on inputs "
                               + ", ".join(f"{n} {a.dtype} {list(a.shape)}" for n, a in feed.items())
                               + f": {_first(e)}") from None
        if len(outs) != len(self.outputs):
            raise PredictError(f"the model gives {len(outs)} outputs, {MODEL_JSON} declares "
                               f"{len(self.outputs)}: export the model again")
        return outs


def _pad(a: np.ndarray, axis: int, size: int) -> np.ndarray:
    missing = size - a.shape[axis]
    if missing <= 0:
        return a
    if axis == 0:
        fill = np.repeat(np.take(a, [a.shape[0] - 1], axis=0), missing, axis=0)
    else:
        shape = list(a.shape)
        shape[axis] = missing
        fill = np.zeros(shape, a.dtype)
    return np.concatenate([a, fill], axis=axis)


def _first(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0][:300]}" if lines else type(e).__name__


# ---- reading inputs ----------------------------------------------------------------------


def read(path: str | Path, served: Served) -> dict[str, np.ndarray]:
    """The feed for one input file, batched and checked against model.json."""
    path = Path(path)
    suffix = path.suffix.lower()
    try:
        f = open_regular(path, what="input")
    except FileNotFoundError:
        raise PredictError(f"{path}: no such file") from None
    except RefusedFile as e:
        raise PredictError(str(e)) from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if suffix in IMAGES:
            spec = _only(served, path)
            arrays = {spec["name"]: _image(path, _bytes(f, path, size, IMAGE_LIMIT, "image"), spec)}
        elif suffix in (".npy", ".npz"):
            arrays = _numpy(f, path, size, served)
        elif suffix == ".json":
            arrays = _json(path, _bytes(f, path, size, JSON_LIMIT, "JSON"), served)
        else:
            raise PredictError(f"{path}: give an image ({', '.join(sorted(IMAGES))}), a .npy or "
                               ".npz, or a .json file")
    return check(arrays, served, path)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n % 1_000_000 else f"{n // 1_000_000} MB"


def _bytes(f: Any, path: Path, size: int, limit: int, what: str) -> bytes:
    more = (": give a larger input as a .npy (a .npz for several inputs), up to "
            f"{_mb(ARRAY_LIMIT)}") if what == "JSON" else ""
    data = f.read(limit + 1) if size <= limit else b""
    if size > limit or len(data) > limit:
        raise PredictError(f"{path}: {_mb(max(size, len(data)))} of {what}, more than the "
                           f"{_mb(limit)} predict reads{more}")
    return data


def _numpy(f: Any, path: Path, size: int, served: Served) -> dict[str, np.ndarray]:
    if size > ARRAY_LIMIT:
        raise PredictError(f"{path}: {_mb(size)}, more than the {_mb(ARRAY_LIMIT)} predict reads")
    try:
        loaded = np.load(f, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            return {_only(served, path)["name"]: loaded}
        unpacked = sum(info.file_size for info in loaded.zip.infolist())
        if unpacked > ARRAY_LIMIT:
            raise PredictError(f"{path}: {_mb(unpacked)} uncompressed, more than the "
                               f"{_mb(ARRAY_LIMIT)} predict reads")
        return {k: loaded[k] for k in loaded.files}
    except PredictError:
        raise
    except Exception as e:
        raise PredictError(f"{path}: not a NumPy file ({_first(e)})") from None


def _only(served: Served, path: Path) -> dict[str, Any]:
    if len(served.inputs) != 1:
        raise PredictError(f"{path}: the model takes {len(served.inputs)} inputs ("
                           + "; ".join(describe(i) for i in served.inputs)
                           + "): give a .npz or a JSON object with one array per input name")
    return served.inputs[0]


def _image(path: Path, data: bytes, spec: dict[str, Any]) -> np.ndarray:
    layout = spec.get("layout", "")
    letters = "HWC" if "C" in layout else "HW"
    if sorted(layout) != sorted(letters) or len(spec["shape"]) != len(layout) + 1:
        raise PredictError(f"{path}: input {describe(spec)} is not an image (its layout in "
                           "model.json is not made of H, W and C): give a .npy or JSON")
    image_module = _import("PIL.Image", f"reading {path.name}")
    channels = spec["shape"][1 + layout.index("C")] if "C" in layout else 1
    try:
        with warnings.catch_warnings():  # Pillow's own bomb warning: the limit below says it
            warnings.simplefilter("ignore")
            img = image_module.open(io.BytesIO(data))
        with img:
            if img.width * img.height > IMAGE_PIXELS:
                raise PredictError(f"{path}: {img.width} x {img.height} pixels, more than the "
                                   f"{IMAGE_PIXELS} predict decodes")
            a = np.asarray(img.convert(MODES.get(channels, "RGB")))
    except PredictError:
        raise
    except Exception as e:
        raise PredictError(f"{path}: cannot read the image ({_first(e)})") from None
    if a.ndim == 2:
        a = a[:, :, None]
    if "C" not in layout:
        a = a[:, :, 0]
    return a.transpose([letters.index(c) for c in layout])


def _json(path: Path, data: bytes, served: Served) -> dict[str, Any]:
    """Arrays read in memory in proportion to the file (jsoninput), never as Python lists;
    nested no deeper than the inputs' axes."""
    try:
        value = jsoninput.read(data, {i["name"]: len(i["shape"]) for i in served.inputs})
    except jsoninput.JsonInputError as e:
        raise PredictError(f"{path}: {e}") from None
    if isinstance(value, dict):
        return value
    return {_only(served, path)["name"]: value}


def check(arrays: dict[str, Any], served: Served, path: Path) -> dict[str, np.ndarray]:
    """Each array as model.json says the input is: dtype, shape (a batch axis added to a single
    sample), range; the first mismatch is one line naming what was expected."""
    names = [i["name"] for i in served.inputs]
    missing, extra = [n for n in names if n not in arrays], [n for n in arrays if n not in names]
    if missing or extra:
        given = [modeljson.short(n) for n in list(arrays)[:5]] + (["..."] if len(arrays) > 5 else [])
        raise PredictError(f"{path}: gives {', '.join(given) or 'nothing'}; the model takes "
                           + "; ".join(describe(i) for i in served.inputs))
    feed = {}
    for spec in served.inputs:
        feed[spec["name"]] = _fit(arrays[spec["name"]], spec, served, path)
    batches = {a.shape[0] for a in feed.values()}
    if len(batches) > 1:
        raise PredictError(f"{path}: the inputs have different batch sizes {sorted(batches)}")
    if 0 in batches:
        raise PredictError(f"{path}: an empty batch (no samples): give at least one")
    return feed


def _fit(value: Any, spec: dict[str, Any], served: Served, path: Path) -> np.ndarray:
    want = np.dtype(spec["dtype"])
    expected = f"input {describe(spec, served.card)} (model.json)"
    prep = served.card.get("preprocess") or {}
    if prep and not prep.get("included"):
        expected += ", the model's own input: this export has no preprocess"
    if isinstance(value, np.ndarray):
        if value.dtype != want:
            raise PredictError(f"{path}: {value.dtype} values, but {expected}: convert them first"
                               + (" (an image's 0..255 pixels, not 0-1 floats)"
                                  if want == np.uint8 else ""))
        a = value
    else:
        try:  # JSON's numbers: bool, int64 or float64, converted below
            a = value.array if isinstance(value, jsoninput.Numbers) else np.asarray(value)
        except Exception as e:
            raise PredictError(f"{path}: not an array for {expected} ({_first(e)})") from None
        if want.kind == "b":
            kind_ok = a.dtype.kind == "b" or (a.dtype.kind in "iu" and bool(np.isin(a, (0, 1)).all()))
        elif want.kind in "iu":
            kind_ok = a.dtype.kind in "iu"
        else:
            kind_ok = want.kind == "f" and a.dtype.kind in "iuf"
        if a.size and not kind_ok:
            raise PredictError(f"{path}: {a.dtype} values, but {expected}")
        if want.kind in "iu" and a.size and (a.min() < np.iinfo(want).min or a.max() > np.iinfo(want).max):
            raise PredictError(f"{path}: values {a.min()}..{a.max()} do not fit {expected}")
    if a.dtype.kind == "f" and a.size and not np.isfinite(a).all():
        bad = int(np.count_nonzero(~np.isfinite(a)))
        raise PredictError(f"{path}: {bad} non-finite values (NaN or infinity), but {expected}")
    if spec.get("range") and a.size:  # its bounds as the input's dtype holds them: 1.2 is 1.2f
        with np.errstate(all="ignore"):
            low, high = (float(np.asarray(float(v)).astype(want) if want.kind == "f" else v)
                         for v in spec["range"])
        if float(a.min()) < low or float(a.max()) > high:
            raise PredictError(f"{path}: values {float(a.min()):g}..{float(a.max()):g} outside "
                               f"{expected}")
    if want.kind == "f" and a.size and float(np.abs(a).max()) > float(np.finfo(want).max):
        raise PredictError(f"{path}: values up to {float(np.abs(a).max()):g} do not fit {expected}")
    a = a.astype(want)
    shape = spec["shape"]
    if a.ndim == len(shape) - 1:
        a = a[None]
    dims = spec.get("dims", {})
    ranges = served.card.get("dynamic_dims") or {}
    fits = a.ndim == len(shape)
    for axis, size in enumerate(shape if fits else []):
        dim = dims.get(str(axis))
        if dim is None:
            fits = fits and a.shape[axis] == size
        elif served.static:
            fits = fits and (axis == 0 or a.shape[axis] <= served.static[dim])
        else:
            low, high = (ranges.get(dim) or {}).get("min"), (ranges.get(dim) or {}).get("max")
            fits = fits and (low is None or a.shape[axis] >= low) and (high is None or a.shape[axis] <= high)
    if not fits:
        raise PredictError(f"{path}: shape {list(a.shape)}, but {expected}"
                           + (" (a batch axis first, or a single sample)"
                              if a.ndim != len(shape) and dims.get("0") else ""))
    return a
