"""`gridrun predict`: an exported folder served from its model.json alone.

Reads model.json, runs the model file it names (onnxruntime for ONNX, the
loaded program for `pt2` and TorchScript) on inputs read from files (an image,
a `.npy`/`.npz`, or JSON) and returns the outputs. It imports no task code, no
training code and nothing else of gridrun: NumPy, and onnxruntime (or torch for
the other formats), Pillow for images. What it reads is checked against
model.json first (dtype, shape, layout, range), so a wrong input gets one line
saying what was expected, never a runtime's stack trace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

MODEL_JSON = "model.json"
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
        folder = path.parent if path.is_file() else path
        if not folder.is_dir():
            raise PredictError(f"{folder}: no such folder (give the folder export-model wrote)")
        card_path = folder / MODEL_JSON
        if not card_path.is_file():
            raise PredictError(f"{folder} has no {MODEL_JSON}: give the folder `gridrun export-model` "
                               "wrote (it holds the model file, model.json and parity.json)")
        try:
            self.card = json.loads(card_path.read_text())
            self.fmt, self.model_file = self.card["format"], folder / self.card["model"]
            self.inputs: list[dict[str, Any]] = list(self.card["inputs"])
            self.outputs: list[dict[str, Any]] = list(self.card["outputs"])
        except (ValueError, KeyError, TypeError) as e:
            raise PredictError(f"{card_path} is not a model.json gridrun wrote ({type(e).__name__}: "
                               f"{e})") from None
        if not self.model_file.is_file():
            raise PredictError(f"{self.model_file} is missing: {MODEL_JSON} names it "
                               f"({self.fmt}); export again or copy the whole folder")
        self.static: dict[str, int] | None = self.card.get("static")
        self._run = self._loader()

    def _loader(self) -> Any:
        path = str(self.model_file)
        if self.fmt == "onnx":
            ort = _import("onnxruntime", "serving an ONNX model")
            try:
                session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            except Exception as e:
                raise PredictError(f"{path} cannot be loaded by onnxruntime: {_first(e)}") from None
            return lambda feed: session.run(None, feed)
        torch = _import("torch", f"serving a {self.fmt} model")
        try:
            if self.fmt == "pt2":
                module = torch.export.load(path).module()
            elif self.fmt == "torchscript":
                module = torch.jit.load(path, map_location="cpu")
            else:
                raise PredictError(f"{MODEL_JSON}: unknown format {self.fmt!r}")
        except PredictError:
            raise
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
        return [np.concatenate([p[k] for p in parts], axis=0) for k in range(len(self.outputs))]

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
                if dim in given:
                    out = np.take(out, range(given[dim]), axis=axis)
            cut.append(out)
        return cut

    def _call(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            return [np.asarray(o) for o in self._run(feed)]
        except PredictError:
            raise
        except Exception as e:
            raise PredictError("the model failed on inputs "
                               + ", ".join(f"{n} {a.dtype} {list(a.shape)}" for n, a in feed.items())
                               + f": {_first(e)}") from None


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
    if not path.is_file():
        raise PredictError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix in IMAGES:
        spec = _only(served, path)
        arrays = {spec["name"]: _image(path, spec)}
    elif suffix in (".npy", ".npz"):
        try:
            loaded = np.load(path, allow_pickle=False)
        except Exception as e:
            raise PredictError(f"{path}: not a NumPy file ({_first(e)})") from None
        arrays = ({k: loaded[k] for k in loaded.files} if suffix == ".npz"
                  else {_only(served, path)["name"]: loaded})
    elif suffix == ".json":
        arrays = _json(path, served)
    else:
        raise PredictError(f"{path}: give an image ({', '.join(sorted(IMAGES))}), a .npy or .npz, "
                           "or a .json file")
    return check(arrays, served, path)


def _only(served: Served, path: Path) -> dict[str, Any]:
    if len(served.inputs) != 1:
        raise PredictError(f"{path}: the model takes {len(served.inputs)} inputs ("
                           + "; ".join(describe(i) for i in served.inputs)
                           + "): give a .npz or a JSON object with one array per input name")
    return served.inputs[0]


def _image(path: Path, spec: dict[str, Any]) -> np.ndarray:
    layout = spec.get("layout", "")
    letters = "HWC" if "C" in layout else "HW"
    if sorted(layout) != sorted(letters):
        raise PredictError(f"{path}: input {describe(spec)} is not an image (its layout in "
                           "model.json is not made of H, W and C): give a .npy or JSON")
    image_module = _import("PIL.Image", f"reading {path.name}")
    channels = spec["shape"][1 + layout.index("C")] if "C" in layout else 1
    try:
        with image_module.open(path) as img:
            a = np.asarray(img.convert(MODES.get(channels, "RGB")))
    except Exception as e:
        raise PredictError(f"{path}: cannot read the image ({_first(e)})") from None
    if a.ndim == 2:
        a = a[:, :, None]
    if "C" not in layout:
        a = a[:, :, 0]
    return a.transpose([letters.index(c) for c in layout])


def _json(path: Path, served: Served) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PredictError(f"{path}: not JSON ({_first(e)})") from None
    if isinstance(value, dict):
        return dict(value)
    return {_only(served, path)["name"]: value}


def check(arrays: dict[str, Any], served: Served, path: Path) -> dict[str, np.ndarray]:
    """Each array as model.json says the input is: dtype, shape (a batch axis added to a single
    sample), range; the first mismatch is one line naming what was expected."""
    names = [i["name"] for i in served.inputs]
    missing, extra = [n for n in names if n not in arrays], [n for n in arrays if n not in names]
    if missing or extra:
        raise PredictError(f"{path}: gives {', '.join(map(repr, arrays)) or 'nothing'}; the model takes "
                           + "; ".join(describe(i) for i in served.inputs))
    feed = {}
    for spec in served.inputs:
        feed[spec["name"]] = _fit(arrays[spec["name"]], spec, served, path)
    batches = {a.shape[0] for a in feed.values()}
    if len(batches) > 1:
        raise PredictError(f"{path}: the inputs have different batch sizes {sorted(batches)}")
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
        try:
            a = np.asarray(value)
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
    if spec.get("range") and a.size and want.kind in "iub":  # for floats a range only informs
        low, high = spec["range"]
        if float(a.min()) < low or float(a.max()) > high:
            raise PredictError(f"{path}: values {float(a.min()):g}..{float(a.max()):g} outside "
                               f"{expected}")
    return a


# ---- showing outputs ---------------------------------------------------------------------


def softmax(x: np.ndarray) -> np.ndarray:
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
        elif a.dtype.kind == "f" and a.ndim >= 2:
            out.append("  argmax over its last axis: "
                       + np.array2string(a.argmax(-1), threshold=60, max_line_width=100).replace("\n", " "))
    return out
