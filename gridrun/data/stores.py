"""The two containers: records written into LMDB or HDF5, and read back.

LMDB: one file (`subdir=False`), record i under the 8-byte big-endian key i,
written in key order (`append`), the metadata under keys that start with
0xff. Readers open it read-only and lock-free (`readonly=True, lock=False`):
nothing writes a packed file once it is renamed into place, so there is no
lock file and no reader table, and any number of processes may read it.

HDF5: one contiguous uint8 dataset `records` with every record's bytes back
to back, `offsets` (n + 1 int64) where each starts, and the metadata as uint8
datasets under `meta/`. No chunking and no compression: reading record i is
one contiguous read of exactly its bytes (a pread() at the dataset's offset
in the file, once h5py has opened and checked the file).

A packed file under half the available memory is read ahead (LMDB's
`readahead`, `posix_fadvise(WILLNEED)` for HDF5): a cold epoch then costs a
few large reads instead of one small read per record, and the file ends up
cached whole, as one epoch would leave it anyway. A larger file is read only
where its records are (MADV_RANDOM for LMDB), so that reading ahead never
evicts what is needed.

A reader checks what it opens: an LMDB file shorter than its own meta page
says (reading past the end of a mapped file kills the process with SIGBUS)
and an HDF5 file shorter than its superblock says are refused as truncated.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

from gridrun.data.index import PackError

LMDB, HDF5 = "lmdb", "hdf5"
FORMATS = (LMDB, HDF5)
SUFFIXES = {".lmdb": LMDB, ".mdb": LMDB, ".h5": HDF5, ".hdf5": HDF5}
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
LMDB_MAGIC = 0xBEEFC0DE  # the meta page's mm_magic, after its 16-byte page header
META_PREFIX = b"\xff"
LMDB_MAP_SIZE = 1 << 40  # address space only: the file grows as written, readers map what is used
COMMIT_BYTES = 256 << 20  # an LMDB write transaction is committed every this many bytes
COPY_BYTES = 64 << 20
REPACK = "re-pack it (`gridrun pack SRC -o {path} --force`) or copy it again"


def need(module: str) -> Any:
    """The lmdb or h5py module, or PackError saying how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise PackError(f"packed datasets in {'HDF5' if module == 'h5py' else 'LMDB'} need the "
                        f"{module} package: pip install 'gridrun[data]'") from None


def sniff(path: Path) -> str | None:
    """LMDB or HDF5 by the file's first bytes; None when it is neither."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError as e:
        raise PackError(f"{path}: cannot read it ({e.strerror})") from None
    if head[:8] == HDF5_SIGNATURE:
        return HDF5
    if len(head) >= 20 and struct.unpack_from("<I", head, 16)[0] == LMDB_MAGIC:
        return LMDB
    return None


def fits_in_memory(path: Path) -> bool:
    """Whether a file is under half the memory available now (see the module's
    docstring: such a file is read ahead; measured on a cold 247 MB LMDB file, 3x
    the records/s of reading it page by page)."""
    try:
        import psutil

        return os.path.getsize(path) < psutil.virtual_memory().available // 2
    except Exception:  # no psutil or no /proc: the safe choice for any size
        return False


def key(i: int) -> bytes:
    return struct.pack(">Q", i)


# ---- writing (always into a temporary file; pack.py renames it into place)

class LmdbWriter:
    def __init__(self, path: Path):
        lmdb = need("lmdb")
        self.env = lmdb.open(str(path), subdir=False, map_size=LMDB_MAP_SIZE, lock=False,
                             sync=False, metasync=False, meminit=False, mode=0o644)
        self.txn = self.env.begin(write=True)
        self.pending = 0

    def add(self, i: int, data: bytes) -> None:
        self.txn.put(key(i), data, append=True)
        self.pending += len(data)
        if self.pending >= COMMIT_BYTES:
            self.txn.commit()
            self.txn = self.env.begin(write=True)
            self.pending = 0

    def finish(self, meta: dict[str, bytes]) -> None:
        """The metadata, the index last, in the last transaction: a file cut
        short before it has no index and never reads as a packed dataset."""
        for name, value in meta.items():
            self.txn.put(META_PREFIX + name.encode(), value)
        self.txn.commit()
        self.env.sync(True)
        self.env.close()

    def abort(self) -> None:
        try:
            self.txn.abort()
        finally:
            self.env.close()


class Hdf5Writer:
    """Records go to a spool file beside the target first: the contiguous
    dataset needs its size before the first write."""

    def __init__(self, path: Path):
        self.h5py = need("h5py")
        self.path = path
        self.spool_path = path.with_name(path.name + ".spool")
        self.spool = open(self.spool_path, "w+b")  # noqa: SIM115 (closed in finish/abort)
        self.offsets = [0]

    def add(self, i: int, data: bytes) -> None:
        self.spool.write(data)
        self.offsets.append(self.offsets[-1] + len(data))

    def finish(self, meta: dict[str, bytes]) -> None:
        try:
            self.spool.flush()
            self.spool.seek(0)
            with self.h5py.File(self.path, "w") as f:
                records = f.create_dataset("records", shape=(self.offsets[-1],), dtype=np.uint8)
                pos = 0
                while block := self.spool.read(COPY_BYTES):
                    records[pos:pos + len(block)] = np.frombuffer(block, dtype=np.uint8)
                    pos += len(block)
                f.create_dataset("offsets", data=np.asarray(self.offsets, dtype=np.int64))
                for name, value in meta.items():  # the index last
                    f.create_dataset(f"meta/{name}", data=np.frombuffer(value, dtype=np.uint8))
                f.attrs["format"] = "gridrun-packed"
        finally:
            self._drop_spool()

    def abort(self) -> None:
        self._drop_spool()

    def _drop_spool(self) -> None:
        self.spool.close()
        self.spool_path.unlink(missing_ok=True)


WRITERS = {LMDB: LmdbWriter, HDF5: Hdf5Writer}


# ---- reading: one reader per process (readers.PackedDataset makes sure of it)

class LmdbReader:
    format = LMDB

    def __init__(self, path: Path):
        lmdb = need("lmdb")
        try:
            self.env = lmdb.open(str(path), subdir=False, readonly=True, lock=False,
                                 readahead=fits_in_memory(path), meminit=False)
        except lmdb.Error as e:
            raise PackError(f"{path}: a damaged or truncated LMDB file ({e}): "
                            + REPACK.format(path=path)) from None
        size = os.path.getsize(path)
        needed = (self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"]
        if size < needed:
            self.env.close()
            raise PackError(f"{path} is truncated: {size:,} bytes of the {needed:,} it says it "
                            "holds (a copy or a pack cut short): " + REPACK.format(path=path))
        self.path, self.closed = path, False
        self.txn = self.env.begin(buffers=False)  # read-only and never written: held for good

    def get(self, i: int) -> bytes:
        data = self.txn.get(key(i))
        if data is None:
            raise PackError(f"{self.path}: record {i} is missing: " + REPACK.format(path=self.path))
        return data

    def meta(self, name: str) -> bytes | None:
        return self.txn.get(META_PREFIX + name.encode())

    def close(self) -> None:
        self.closed = True
        self.env.close()


class Hdf5Reader:
    format = HDF5

    def __init__(self, path: Path):
        h5py = need("h5py")
        try:
            self.file = h5py.File(path, "r", locking=False)  # never written once in place
        except OSError as e:
            sizes = re.search(r"eof = (\d+).*stored_eof = (\d+)", str(e))
            what = (f"is truncated: {int(sizes[1]):,} bytes of the {int(sizes[2]):,} it says it "
                    "holds (a copy or a pack cut short)" if sizes and "truncated" in str(e)
                    else f"is a damaged HDF5 file ({e})")
            raise PackError(f"{path} {what}: " + REPACK.format(path=path)) from None
        if "records" not in self.file or "offsets" not in self.file:
            self.file.close()
            raise PackError(f"{path} is an HDF5 file but not a packed dataset (no records written "
                            f"by `gridrun pack`): `gridrun pack SRC -o {path}` makes one")
        self.path, self.closed = path, False
        self.records = self.file["records"]
        self.offsets = self.file["offsets"][()]
        # contiguous and uncompressed (as pack writes it): its bytes lie at one offset in the
        # file, read with pread() without h5py's ~40 µs a slice (the file was checked above)
        self.base = self.records.id.get_offset() if self.records.chunks is None else None
        self.fd = os.open(path, os.O_RDONLY) if self.base is not None else None
        if self.fd is not None and fits_in_memory(path):  # as LMDB's readahead: one cached file
            os.posix_fadvise(self.fd, self.base, int(self.offsets[-1]), os.POSIX_FADV_WILLNEED)

    def get(self, i: int) -> bytes:
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        if self.fd is not None:
            return os.pread(self.fd, end - start, self.base + start)
        return self.records[start:end].tobytes()

    def meta(self, name: str) -> bytes | None:
        dataset = self.file.get(f"meta/{name}")
        return None if dataset is None else dataset[()].tobytes()

    def close(self) -> None:
        self.closed = True
        if self.fd is not None:
            os.close(self.fd)
        self.file.close()


READERS = {LMDB: LmdbReader, HDF5: Hdf5Reader}


def open_reader(path: str | Path) -> LmdbReader | Hdf5Reader:
    path = Path(path)
    if not path.exists():
        raise PackError(f"{path}: no such file")
    if path.is_dir():
        raise PackError(f"{path} is a folder, not a packed file")
    fmt = sniff(path)
    if fmt is None:
        raise PackError(f"{path} is not a packed dataset: neither an LMDB nor an HDF5 file "
                        f"(`gridrun pack SRC -o {path}` makes one)")
    return READERS[fmt](path)
