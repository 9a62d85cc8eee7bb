"""The two containers, LMDB and HDF5: their layout, and reading them back
(`writers` writes them).

LMDB: one file (`subdir=False`), record i under the 8-byte big-endian key i,
written in key order (`append`), the metadata under keys that start with
0xff, then LMDB_TAIL bytes of zeros that end in LMDB_END. Readers open it
read-only and lock-free (`readonly=True, lock=False`): nothing writes a
packed file once it is renamed into place, so there is no lock file and no
reader table, and any number of processes may read it.

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

A reader opens the file through `userfiles.open_regular` first (a FIFO, a
device or a folder is refused at once, never waited on) and checks what it
opens: an LMDB file shorter than its own meta page says, or than its tail,
and an HDF5 file shorter than its superblock says are refused as truncated;
HDF5 offsets that do not fit the records, and any error of lmdb or h5py on a
damaged file, are one line (PackError) too.

LMDB trusts its pages, and reading past the end of a mapped file kills the
process (SIGBUS). Two guards keep a damaged byte from doing that. The tail is
longer than a damaged node can reach past the start of its page (a 16-bit
offset, a 16-bit key size, a value of up to SMALL_VALUE bytes), so what a
damaged page near the end makes LMDB read are zeros of the file. A larger
value's place is checked before it is copied: its address against where
/proc/self/maps says the file is mapped (elsewhere, only its length against
the file's). A file packed before the tail was written has every value
checked so (about 2.5 µs a record).
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

from gridrun.data.index import PackError
from gridrun.userfiles import RefusedFile, open_regular

LMDB, HDF5 = "lmdb", "hdf5"
FORMATS = (LMDB, HDF5)
SUFFIXES = {".lmdb": LMDB, ".mdb": LMDB, ".h5": HDF5, ".hdf5": HDF5}
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
LMDB_MAGIC = 0xBEEFC0DE  # the meta page's mm_magic, after its 16-byte page header
META_PREFIX = b"\xff"
LMDB_END = b"gridrun-lmdb-end"  # the last bytes of a packed LMDB file's tail
# zeros after the last page: more than a damaged node can reach past its page's start
# (its 16-bit offset, its 16-bit key size, and a value of up to SMALL_VALUE bytes)
LMDB_TAIL = 256 << 10
SMALL_VALUE = 64 << 10  # with the tail there, a value this small cannot reach past the file
REPACK = "re-pack it (`gridrun pack SRC -o {path} --force`) or copy it again"


def need(module: str) -> Any:
    """The lmdb or h5py module, or PackError saying how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise PackError(f"packed datasets in {'HDF5' if module == 'h5py' else 'LMDB'} need the "
                        f"{module} package: pip install 'gridrun[data]'") from None


def open_packed(path: Path) -> Any:
    """The packed file at `path`, opened through `open_regular` (a regular file only,
    never waited on); PackError in one line otherwise."""
    try:
        return open_regular(path, what="packed file")
    except FileNotFoundError:
        raise PackError(f"{path}: no such file") from None
    except RefusedFile as e:
        if os.path.isdir(path):
            raise PackError(f"{path} is a folder, not a packed file") from None
        raise PackError(str(e)) from None
    except OSError as e:
        raise PackError(f"{path}: cannot read it ({e.strerror or e})") from None


def sniff(path: Path) -> str | None:
    """LMDB or HDF5 by the file's first bytes; None when it is neither."""
    with open_packed(path) as f:
        return _kind(f.read(24))


def _kind(head: bytes) -> str | None:
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


# ---- reading: one reader per process (readers.PackedDataset makes sure of it)

def damaged(path: Path, e: BaseException) -> PackError:
    """PackError for an error of lmdb or h5py met reading `path`."""
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    return PackError(f"{path} is damaged ({type(e).__name__}{': ' + first if first else ''}): "
                     + REPACK.format(path=path))


class LmdbReader:
    format = LMDB

    def __init__(self, path: Path, fd: int):
        lmdb = need("lmdb")
        self.lmdb, self.path, self.closed = lmdb, path, False
        try:
            self.env = lmdb.open(str(path), subdir=False, readonly=True, lock=False,
                                 readahead=fits_in_memory(path), meminit=False)
        except lmdb.Error as e:
            raise PackError(f"{path}: a damaged or truncated LMDB file ({e}): "
                            + REPACK.format(path=path)) from None
        try:
            st = os.fstat(fd)
            self.size = st.st_size
            pages = (self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"]
            tail = os.pread(fd, len(LMDB_END), self.size - len(LMDB_END)) if self.size > 16 else b""
            needed = pages + LMDB_TAIL if tail == LMDB_END or self.size > pages else pages
            if self.size < needed or (self.size > pages and tail != LMDB_END):
                raise PackError(f"{path} is truncated: {self.size:,} bytes of the "
                                f"{pages + LMDB_TAIL:,} it says it holds (a copy or a pack cut "
                                "short): " + REPACK.format(path=path))
            self.starts = _mapped_at(st)  # None: not known here
            self.small = SMALL_VALUE if tail == LMDB_END else 0  # values not placed one by one
            self.txn = self.env.begin(buffers=True)  # read-only, never written: held for good
        except BaseException as e:
            self.env.close()
            if isinstance(e, lmdb.Error):
                raise damaged(path, e) from None
            raise

    def _copy(self, value: Any) -> bytes | None:
        """The bytes of a value, once its place is known to lie inside the file."""
        if value is None:
            return None
        n = len(value)
        if n > self.size:
            raise PackError(f"{self.path}: a value of {n:,} bytes in a file of {self.size:,}: "
                            "damaged: " + REPACK.format(path=self.path))
        if n > self.small and self.starts is not None:
            at = np.frombuffer(value, dtype=np.uint8).ctypes.data
            if not any(s <= at and at + n <= s + self.size for s in self.starts):
                raise PackError(f"{self.path}: a value lies past the end of the file: damaged: "
                                + REPACK.format(path=self.path))
        return bytes(value)

    def get(self, i: int) -> bytes:
        try:
            data = self._copy(self.txn.get(key(i)))
        except self.lmdb.Error as e:
            raise damaged(self.path, e) from None
        if data is None:
            raise PackError(f"{self.path}: record {i} is missing: " + REPACK.format(path=self.path))
        return data

    def meta(self, name: str) -> bytes | None:
        try:
            return self._copy(self.txn.get(META_PREFIX + name.encode()))
        except self.lmdb.Error as e:
            raise damaged(self.path, e) from None

    def close(self) -> None:
        self.closed = True
        self.env.close()


def _mapped_at(st: os.stat_result) -> list[int] | None:
    """Where this process maps the file `st` describes, from its start (Linux's
    /proc/self/maps); None where that cannot be known."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    starts = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 5 or parts[4] != str(st.st_ino) or int(parts[2], 16) != 0:
            continue
        major, _, minor = parts[3].partition(":")
        if (int(major, 16), int(minor, 16)) == (os.major(st.st_dev), os.minor(st.st_dev)):
            starts.append(int(parts[0].split("-")[0], 16))
    return starts or None


class Hdf5Reader:
    format = HDF5

    def __init__(self, path: Path, fd: int):
        h5py = need("h5py")
        try:
            self.file = h5py.File(path, "r", locking=False)  # never written once in place
        except Exception as e:  # h5py raises OSError, and others on a damaged file
            sizes = re.search(r"eof = (\d+).*stored_eof = (\d+)", str(e))
            what = (f"is truncated: {int(sizes[1]):,} bytes of the {int(sizes[2]):,} it says it "
                    "holds (a copy or a pack cut short)" if sizes and "truncated" in str(e)
                    else f"is a damaged HDF5 file ({str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__})")
            raise PackError(f"{path} {what}: " + REPACK.format(path=path)) from None
        self.path, self.closed, self.fd = path, False, None
        try:
            self._open(path, fd)
        except BaseException as e:
            self.close()
            if isinstance(e, PackError | MemoryError | KeyboardInterrupt | SystemExit):
                raise
            raise damaged(path, e) from None

    def _open(self, path: Path, fd: int) -> None:
        h5py = need("h5py")
        records, offsets = self.file.get("records"), self.file.get("offsets")
        if not isinstance(records, h5py.Dataset) or not isinstance(offsets, h5py.Dataset):
            raise PackError(f"{path} is an HDF5 file but not a packed dataset (no records written "
                            f"by `gridrun pack`): `gridrun pack SRC -o {path}` makes one")
        self.size = size = os.fstat(fd).st_size
        if (records.ndim != 1 or records.dtype != np.uint8 or offsets.ndim != 1
                or offsets.dtype != np.int64 or offsets.shape[0] < 1
                or offsets.shape[0] * 8 > size + 8):
            raise PackError(f"{path}: its records or offsets are not what `gridrun pack` writes: "
                            + REPACK.format(path=path))
        self.records = records
        self.offsets = offsets[()]
        ends = self.offsets
        if (ends[0] != 0 or (ends[1:] < ends[:-1]).any() or int(ends[-1]) != records.shape[0]
                or records.shape[0] > size):
            raise PackError(f"{path}: its offsets do not fit its {records.shape[0]:,} bytes of "
                            "records: " + REPACK.format(path=path))
        # contiguous and uncompressed (as pack writes it): its bytes lie at one offset in the
        # file, read with pread() without h5py's ~40 µs a slice (the file was checked above)
        base = records.id.get_offset() if records.chunks is None else None
        if base is not None and base + records.shape[0] > size:
            raise PackError(f"{path} is truncated: its records end past its {size:,} bytes: "
                            + REPACK.format(path=path))
        self.base = base
        self.fd = os.dup(fd) if base is not None else None
        if self.fd is not None and fits_in_memory(path):  # as LMDB's readahead: one cached file
            os.posix_fadvise(self.fd, self.base, int(self.offsets[-1]), os.POSIX_FADV_WILLNEED)

    def get(self, i: int) -> bytes:
        if not 0 <= i < len(self.offsets) - 1:
            raise PackError(f"{self.path}: record {i} is missing: " + REPACK.format(path=self.path))
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        if self.fd is not None:
            return os.pread(self.fd, end - start, self.base + start)
        try:
            return self.records[start:end].tobytes()
        except Exception as e:  # a damaged chunked dataset (pack never writes one)
            raise damaged(self.path, e) from None

    def meta(self, name: str) -> bytes | None:
        try:
            dataset = self.file.get(f"meta/{name}")
            if dataset is None:
                return None
            if (not hasattr(dataset, "dtype") or dataset.dtype != np.uint8 or dataset.ndim != 1
                    or dataset.shape[0] > self.size):
                raise PackError(f"{self.path}: its metadata {name!r} is not what `gridrun pack` "
                                "writes: " + REPACK.format(path=self.path))
            return dataset[()].tobytes()
        except PackError:
            raise
        except Exception as e:
            raise damaged(self.path, e) from None

    def close(self) -> None:
        self.closed = True
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        with contextlib.suppress(Exception):
            self.file.close()


READERS = {LMDB: LmdbReader, HDF5: Hdf5Reader}


def open_reader(path: str | Path) -> LmdbReader | Hdf5Reader:
    """A reader of the packed file at `path`: opened as a regular file first (a FIFO or
    a device is refused, never waited on), then by its format."""
    path = Path(path)
    with open_packed(path) as f:
        fmt = _kind(f.read(24))
        if fmt is None:
            raise PackError(f"{path} is not a packed dataset: neither an LMDB nor an HDF5 file "
                            f"(`gridrun pack SRC -o {path}` makes one)")
        reader = READERS[fmt](path, f.fileno())
        ours, now = os.fstat(f.fileno()), _stat(path)
    if now is None or (now.st_dev, now.st_ino) != (ours.st_dev, ours.st_ino):
        reader.close()
        raise PackError(f"{path} was replaced while it was opened: open it again")
    return reader


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None
