"""What gets packed: a folder of image files, or the samples of a map-style Dataset.

A folder is the ImageFolder layout, walked by `folder.scan_folder` (which also
holds the policy for links, FIFOs, devices and names that are not UTF-8). Its
records are the files' bytes as they are on disk (decoded at read time, by the
user's code); packing opens each image once to refuse unreadable ones and,
unless asked otherwise, images of another size or mode than the first.

A Dataset's sample (a tensor, an array, a number, bytes, or a tuple, list or
dict of them) becomes one record: a small header with each field's shape,
then each field's raw bytes. The index keeps the structure and each field's
kind and dtype, so reading gives back the same types, bit for bit.
"""

from __future__ import annotations

import io
import math
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np

from gridrun.data.index import PackError


def image_facts(where: str | Path, data: bytes) -> dict[str, Any]:
    """{"format", "width", "height", "mode"} of an encoded image, decoded in full
    so that a truncated file is caught here rather than in epoch 3."""
    try:
        from PIL import Image
    except ImportError:
        raise PackError("packing images checks each one with Pillow: "
                        "pip install 'gridrun[data]'") from None
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            return {"format": im.format, "width": im.width, "height": im.height, "mode": im.mode}
    except Exception as e:  # PIL raises many kinds; each is the same answer here
        raise PackError(f"{where}: not a readable image ({type(e).__name__}: {e}): "
                        "replace or remove it, then pack again") from None


def same_image(first: tuple[str, dict[str, Any]], where: str, facts: dict[str, Any]) -> None:
    """PackError naming both files when `facts` differs in size or mode from the first image."""
    name, ref = first
    if (facts["width"], facts["height"], facts["mode"]) != (ref["width"], ref["height"], ref["mode"]):
        raise PackError(
            f"{where} is {facts['width']}x{facts['height']} {facts['mode']} but {name} is "
            f"{ref['width']}x{ref['height']} {ref['mode']}: images of one size are expected "
            "(resize them, or pack with --any-size and resize in your transform)")


# ---- samples of a Dataset

def _split(sample: Any) -> tuple[str, list[tuple[str, Any]]]:
    if isinstance(sample, dict):
        return "dict", [(str(k), v) for k, v in sample.items()]
    if isinstance(sample, tuple | list):
        return type(sample).__name__, [(str(i), v) for i, v in enumerate(sample)]
    return "single", [("0", sample)]


def _as_array(value: Any, where: str) -> tuple[str, np.ndarray]:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            raise PackError(f"{where}: bfloat16 has no NumPy dtype: convert it (.float()) first")
        return "tensor", t.numpy()
    if isinstance(value, np.ndarray | np.generic):
        arr = np.asarray(value)
        if arr.dtype.hasobject or arr.dtype.fields is not None:
            raise PackError(f"{where}: an array of dtype {arr.dtype} cannot be packed")
        return "array", np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("="), copy=False))
    if isinstance(value, bool):
        return "bool", np.array(value, dtype=np.bool_)
    if isinstance(value, int):
        return "int", np.array(value, dtype=np.int64)
    if isinstance(value, float):
        return "float", np.array(value, dtype=np.float64)
    if isinstance(value, bytes | bytearray | memoryview):
        return "bytes", np.frombuffer(bytes(value), dtype=np.uint8)
    raise PackError(f"{where}: a {type(value).__name__} cannot be packed (tensors, NumPy arrays, "
                    "numbers and bytes can, or a tuple, list or dict of them)")


def _converted(value: Any, where: str) -> tuple[str, np.ndarray]:
    try:
        return _as_array(value, where)
    except PackError:
        raise
    except Exception as e:  # a tensor NumPy cannot take (sparse, on a meta device, ...)
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise PackError(f"{where} cannot be packed ({type(e).__name__}"
                        f"{': ' + first if first else ''})") from None


class SampleCodec:
    """Turns samples into records, learning the structure from the first one;
    every later sample must have the same fields, kinds and dtypes."""

    def __init__(self) -> None:
        self.structure: str | None = None
        self.fields: list[dict[str, Any]] = []

    def encode(self, i: int, sample: Any) -> bytes:
        structure, items = _split(sample)
        arrays = [(name, *_converted(v, f"sample {i}, field {name!r}")) for name, v in items]
        if self.structure is None:
            self.structure = structure
            self.fields = [{"name": n, "kind": k, "dtype": a.dtype.name, "shape": list(a.shape)}
                           for n, k, a in arrays]
        else:
            got = [(n, k, a.dtype.name, a.ndim) for n, k, a in arrays]
            want = [(f["name"], f["kind"], f["dtype"], len(f["shape"]) if f["shape"] is not None
                     else None) for f in self.fields]
            if structure != self.structure or [g[:3] for g in got] != [w[:3] for w in want]:
                raise PackError(f"sample {i} is a {structure} of {[g[:3] for g in got]} but "
                                f"sample 0 a {self.structure} of {[w[:3] for w in want]}: every "
                                "sample must have the same fields, kinds and dtypes")
            for f, (_, _, a) in zip(self.fields, arrays, strict=True):
                if f["shape"] is not None and list(a.shape) != f["shape"]:
                    f["shape"] = None  # varies: each record's header has it
        header = struct.pack("<H", len(arrays)) + b"".join(
            struct.pack(f"<B{a.ndim}Q", a.ndim, *a.shape) for _, _, a in arrays)
        return header + b"".join(a.tobytes() for _, _, a in arrays)


def decode_sample(data: bytes, structure: str, fields: list[dict[str, Any]],
                  where: str = "a record") -> Any:
    """A record back into the sample it was: the same structure, types and bits;
    PackError naming `where` when the record does not fit its index (damage)."""
    try:
        return _decode(data, structure, fields)
    except PackError:
        raise
    except (struct.error, ValueError, TypeError, IndexError, OverflowError, MemoryError) as e:
        raise PackError(f"{where} does not decode as its index says ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}): a damaged file") from None


def _decode(data: bytes, structure: str, fields: list[dict[str, Any]]) -> Any:
    (count,) = struct.unpack_from("<H", data, 0)
    if count != len(fields):
        raise ValueError(f"{count} fields where the index has {len(fields)}")
    pos, shapes = 2, []
    for _ in range(count):
        (ndim,) = struct.unpack_from("<B", data, pos)
        shapes.append(struct.unpack_from(f"<{ndim}Q", data, pos + 1))
        pos += 1 + 8 * ndim
    values = []
    for f, shape in zip(fields, shapes, strict=True):
        dtype = np.dtype(f["dtype"])
        n = math.prod(shape)
        if n * dtype.itemsize > len(data) - pos:
            raise ValueError(f"field {f['name']!r} of shape {tuple(shape)} runs past the record")
        arr = np.frombuffer(data, dtype=dtype, count=n, offset=pos).reshape(shape).copy()
        pos += n * dtype.itemsize
        kind = f["kind"]
        if kind == "tensor":
            import torch

            values.append(torch.from_numpy(arr))
        elif kind in ("int", "float", "bool"):
            values.append(arr.item())
        elif kind == "bytes":
            values.append(arr.tobytes())
        else:
            values.append(arr)
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} bytes left over")
    if structure == "dict":
        return {f["name"]: v for f, v in zip(fields, values, strict=True)}
    if structure == "tuple":
        return tuple(values)
    if structure == "list":
        return values
    return values[0]
