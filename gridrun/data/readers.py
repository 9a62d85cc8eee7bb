"""Reading records: `PackedDataset` over a packed file, `FolderDataset` over
the folder it came from, and `open_records` for either.

Both are map-style datasets of raw records: for a packed folder (or the
folder itself) item i is `(encoded_bytes, class_index)`; for packed samples,
the sample as it was. Decoding and augmentation stay in the user's own
Dataset, which wraps one of these (the reader pattern):

    class Images(torch.utils.data.Dataset):
        def __init__(self, path):
            self.records = open_records(path)     # a folder or its packed form
        def __len__(self):
            return len(self.records)
        def __getitem__(self, i):
            data, label = self.records[i]
            image = decode(data)                  # PIL, torchvision.io, ...
            return augment(image), label

A `PackedDataset` reads through one handle per process and file
(`shared_reader`), opened on first use: the first read in a DataLoader worker
opens the worker's own. A handle inherited through fork() (opened under
another pid) is never read from: the child closes its copy, which touches only
the child's own mappings and descriptors, and opens its own (LMDB and HDF5
handles are not fork-safe, and py-lmdb refuses a second handle on one file in
one process, which is also why the training and validation sets of one file
share theirs). Pickling (spawned workers) drops the handle. Persistent
workers keep theirs.
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
from pathlib import Path
from typing import Any

import numpy as np

from gridrun.data import stores
from gridrun.data.folder import read_image, scan_folder
from gridrun.data.index import FILES, Index, PackError
from gridrun.data.sources import decode_sample

INDEX, LABELS, CRC, NAMES = "index", "labels", "crc32", "names"  # the metadata of a packed file
# (pid, file, inode, mtime) -> the handle
_OPEN: dict[tuple[int, str, int, int], Any] = {}


def shared_reader(path: str | Path) -> stores.LmdbReader | stores.Hdf5Reader:
    """This process's one handle on the packed file at `path` (opened on first use)."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        return stores.open_reader(path)  # raises with the reason, in one line
    key = (os.getpid(), str(path.resolve()), st.st_ino, st.st_mtime_ns)
    reader = _OPEN.get(key)
    if reader is None:
        # the same file's other handles: inherited through fork(), or the file was replaced
        for old in [k for k in _OPEN if k[1] == key[1]]:
            with contextlib.suppress(Exception):
                _OPEN.pop(old).close()
        reader = _OPEN[key] = stores.open_reader(path)
    return reader


def close_readers() -> None:
    """Close every handle this process holds (a long-lived process done with its data)."""
    for key in list(_OPEN):
        with contextlib.suppress(Exception):
            _OPEN.pop(key).close()


def read_index(reader: stores.LmdbReader | stores.Hdf5Reader) -> Index:
    raw = reader.meta(INDEX)
    if raw is None:
        raise PackError(f"{reader.path} is an {reader.format.upper()} file but not a packed dataset "
                        f"(no gridrun index): `gridrun pack SRC -o {reader.path}` makes one")
    return Index.from_bytes(raw, str(reader.path))


def read_array(reader: stores.LmdbReader | stores.Hdf5Reader, name: str, dtype: Any,
               length: int) -> np.ndarray:
    raw = reader.meta(name) or b""
    size = np.dtype(dtype).itemsize
    if len(raw) != length * size:
        raise PackError(f"{reader.path}: its {name} hold {len(raw) / size:g} entries for {length} "
                        "records: " + stores.REPACK.format(path=reader.path))
    arr = np.frombuffer(raw, dtype=dtype)
    return arr


def read_labels(reader: stores.LmdbReader | stores.Hdf5Reader, index: Index) -> np.ndarray:
    """The class index of each record of a packed folder, each naming one of its classes."""
    labels = read_array(reader, LABELS, np.int64, index.length)
    wrong = (labels < 0) | (labels >= len(index.class_names))
    if wrong.any():
        i = int(np.argmax(wrong))
        raise PackError(f"{reader.path}: record {i} has the label {int(labels[i])}, which names "
                        f"none of its {len(index.class_names)} classes: "
                        + stores.REPACK.format(path=reader.path))
    return labels


def read_names(reader: stores.LmdbReader | stores.Hdf5Reader, index: Index) -> list[str]:
    """The file each record of a packed folder was read from (relative to the folder)."""
    raw = reader.meta(NAMES)
    try:
        names = json.loads(raw) if raw is not None else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        names = None
    if not isinstance(names, list) or len(names) != index.length or not all(
            isinstance(n, str) and _utf8(n) for n in names):
        what = ("are missing" if raw is None else "do not parse" if names is None
                else f"hold {len(names)} entries for {index.length} records"
                if isinstance(names, list) and len(names) != index.length else "are not names")
        raise PackError(f"{reader.path}: its record names {what}: "
                        + stores.REPACK.format(path=reader.path))
    return names


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _checked(i: Any, length: int) -> int:
    i = operator.index(i)
    if i < 0:
        i += length
    if not 0 <= i < length:
        raise IndexError(f"record {i} of {length}")
    return i


class PackedDataset:
    """A packed file (LMDB or HDF5, written by `gridrun pack`) as a map-style dataset."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        reader = shared_reader(self.path)
        self.index = read_index(reader)
        self.labels = read_labels(reader, self.index) if self.index.kind == FILES else None
        self.storage = reader.format  # "lmdb" | "hdf5": what the diagnostics name
        self.class_names = list(self.index.class_names)
        self.classes = self.class_names  # the name torchvision's datasets use
        self._reader: Any = None
        self._pid: int | None = None
        self._names: list[str] | None = None

    def __len__(self) -> int:
        return self.index.length

    def reader(self) -> stores.LmdbReader | stores.Hdf5Reader:
        """This process's own handle, opened on first use (and again after a fork:
        the pid it was opened under is not ours)."""
        if self._pid != os.getpid() or self._reader.closed:
            self._reader = shared_reader(self.path)
            self._pid = os.getpid()
        return self._reader

    def raw(self, i: int) -> bytes:
        """Record i's bytes as packed."""
        return self.reader().get(_checked(i, len(self)))

    def __getitem__(self, i: int) -> Any:
        data = self.raw(i)
        if self.labels is not None:
            return data, int(self.labels[operator.index(i)])
        return decode_sample(data, self.index.structure or "single", self.index.fields,
                             f"{self.path} record {i}")

    def name(self, i: int) -> str:
        """What record i was packed from: the image file's path in its folder, or "sample i"."""
        if self.index.kind != FILES:
            return f"sample {i}"
        if self._names is None:
            self._names = read_names(self.reader(), self.index)
        return self._names[_checked(i, len(self))]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_reader=None, _pid=None)  # a spawned worker opens its own
        return state

    def __repr__(self) -> str:
        return f"PackedDataset({str(self.path)!r}: {self.index.describe()}, {self.storage})"


class FolderDataset:
    """A folder of image files in the ImageFolder layout, read file by file:
    item i is `(the file's bytes, class index)`, in the order `gridrun pack` packs."""

    storage = "files"

    def __init__(self, root: str | Path):
        folder = scan_folder(root)
        self.root = folder.root
        self.class_names = folder.class_names
        self.classes = self.class_names
        # one array of fixed-width bytes, not a list of str objects: forked workers
        # touch no reference counts on it, so its pages stay shared
        self._names = np.array([n.encode() for n in folder.names])
        self.labels = np.asarray(folder.labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def name(self, i: int) -> str:
        return self._names[i].decode()

    def raw(self, i: int) -> bytes:
        return read_image(self.root / self.name(_checked(i, len(self))))

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        return self.raw(i), int(self.labels[operator.index(i)])

    def __repr__(self) -> str:
        return f"FolderDataset({str(self.root)!r}: {len(self):,} files in {len(self.class_names)} classes)"


def open_records(path: str | Path) -> PackedDataset | FolderDataset:
    """A folder of images or a packed file, by what `path` is."""
    path = Path(path)
    if path.is_dir():
        if (path / "data.mdb").exists():
            raise PackError(f"{path} is an LMDB folder, not a file `gridrun pack` wrote: pack "
                            "your data with `gridrun pack SRC -o OUT.lmdb`")
        return FolderDataset(path)
    return PackedDataset(path)
