"""The index of a packed dataset: one owner of its shape, and the one error type.

A packed file holds its records (the bytes of each sample) and an index: what
kind of records (`files`: the encoded bytes of image files with a class label;
`samples`: the fields of a map-style Dataset's samples), how many, their
names, dtypes and shapes, the class names, and a content hash of the source.
The hash is taken over the records in order (name, label, bytes), so a folder
and its packed forms hash the same: it names the data, not the container.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass, field, fields
from typing import Any

FORMAT = "gridrun-packed"
VERSION = 1  # bumped when a reader of this version cannot read what an older writer wrote
FILES, SAMPLES = "files", "samples"
STRUCTURES = ("tuple", "list", "dict", "single")
FIELD_KINDS = ("tensor", "array", "int", "float", "bool", "bytes")


class PackError(ValueError):
    """Bad input to pack or read, said in one line: which file, what is wrong, what to do."""


@dataclass(frozen=True)
class Index:
    kind: str  # FILES | SAMPLES
    length: int
    source: str  # where it was packed from: a folder, or a description of the dataset
    source_sha256: str  # the content hash of the records (see `ContentHash`)
    bytes: int  # the records' bytes, all together
    class_names: list[str] = field(default_factory=list)
    # files: {"format": "PNG", "width": 64, "height": 64, "mode": "RGB"} when all agree, else None
    image: dict[str, Any] | None = None
    # samples: how a sample is put back together: "tuple" | "list" | "dict" | "single"
    structure: str | None = None
    # samples: [{"name", "kind": tensor|array|int|float|bool|bytes, "dtype", "shape" (None: varies)}]
    fields: list[dict[str, Any]] = field(default_factory=list)
    created: float = 0.0
    gridrun: str = ""  # the version of gridrun that wrote it
    # the SHA-256 of the class names as JSON ("" in files packed before it was recorded)
    class_names_sha256: str = ""
    format: str = FORMAT
    version: int = VERSION

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, path: str) -> Index:
        """The index stored in `path`; PackError when it is not one this version reads."""
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise PackError(f"{path}: its gridrun index does not parse: not a packed dataset "
                            "(or a damaged one); re-pack it with `gridrun pack SRC -o "
                            f"{path}`") from None
        try:
            json.dumps(raw, ensure_ascii=False).encode()
        except UnicodeEncodeError:  # "\udcff" parses, but prints nowhere
            raise PackError(f"{path}: its gridrun index holds text that is not UTF-8: a damaged "
                            "file; re-pack it") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise PackError(f"{path} is not a packed dataset written by `gridrun pack`")
        if raw.get("version") != VERSION:
            source = raw.get("source") or "SRC"
            raise PackError(
                f"{path} was packed by gridrun {raw.get('gridrun') or '?'} in format version "
                f"{raw.get('version')}; this gridrun reads version {VERSION}: re-pack it with "
                f"`gridrun pack {source} -o {path} --force`")
        known = {f.name for f in fields(cls)}
        try:
            index = cls(**{k: v for k, v in raw.items() if k in known})
        except TypeError as e:
            raise PackError(f"{path}: its gridrun index lacks a field ({e}): re-pack it") from None
        wrong = index.problem()
        if wrong:
            raise PackError(f"{path}: its gridrun index is damaged ({wrong}): re-pack it "
                            f"(`gridrun pack SRC -o {path} --force`) or copy it again")
        return index

    def problem(self) -> str | None:
        """What in this index cannot be what `pack` wrote (damage), or None."""
        if self.kind not in (FILES, SAMPLES):
            return f"kind {self.kind!r}"
        for name in ("length", "bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                return f"{name} {value!r}"
        if not all(isinstance(v, str) for v in (self.source, self.source_sha256, self.gridrun,
                                                self.class_names_sha256)):
            return "its source, version or hashes are not text"
        if not isinstance(self.class_names, list) or not all(
                isinstance(n, str) for n in self.class_names):
            return "class_names is not a list of names"
        if self.kind == FILES:
            return _image_problem(self.image)
        if self.structure not in STRUCTURES:
            return f"structure {self.structure!r}"
        if not isinstance(self.fields, list) or (
                self.structure == "single" and len(self.fields) != 1):
            return "fields"
        for f in self.fields:
            wrong = _field_problem(f)
            if wrong:
                return wrong
        return None

    def describe(self) -> str:
        """'20,000 files in 10 classes, 64x64 RGB PNG' or '512 samples (tuple: float32 ...)'."""
        if self.kind == FILES:
            what = f"{self.length:,} files in {len(self.class_names)} classes"
            if self.image:
                im = self.image
                what += f", {im['width']}x{im['height']} {im['mode']} {im['format']}"
            return what
        parts = ", ".join(f"{f['name']}: {f['dtype']}"
                          + (str(tuple(f["shape"])) if f.get("shape") is not None else "(varies)")
                          for f in self.fields)
        return f"{self.length:,} samples ({self.structure}: {parts})"


def _image_problem(image: Any) -> str | None:
    if image is None:
        return None
    if not isinstance(image, dict):
        return "image is not a table"
    for key, kind in (("width", int), ("height", int), ("mode", str), ("format", str)):
        if type(image.get(key)) is not kind:
            return f"image {key} {image.get(key)!r}"
    return None


def _field_problem(f: Any) -> str | None:
    """What is wrong with one field of a samples index, or None."""
    import numpy as np

    if not isinstance(f, dict) or not isinstance(f.get("name"), str):
        return f"field {f!r}"
    if f.get("kind") not in FIELD_KINDS:
        return f"field {f['name']!r} of kind {f.get('kind')!r}"
    try:
        dtype = np.dtype(f.get("dtype"))
    except (TypeError, ValueError, SyntaxError, RecursionError):
        dtype = None
    if (not isinstance(f.get("dtype"), str) or dtype is None or dtype.hasobject
            or dtype.fields is not None or dtype.itemsize == 0):
        return f"field {f['name']!r} of dtype {f.get('dtype')!r}"
    shape = f.get("shape")
    if shape is not None and not (isinstance(shape, list) and len(shape) < 256 and all(
            type(n) is int and n >= 0 for n in shape)):
        return f"field {f['name']!r} of shape {shape!r}"
    return None


class ContentHash:
    """SHA-256 over the records in order: each record's label, name and bytes,
    length-prefixed so no two different sequences hash alike."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def update(self, name: str, label: int, data: bytes) -> None:
        encoded = name.encode()
        self._h.update(struct.pack(">qIQ", label, len(encoded), len(data)))
        self._h.update(encoded)
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()
