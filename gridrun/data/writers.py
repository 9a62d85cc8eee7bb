"""Writing the two containers (always into a temporary file: `pack` renames it
into place). `stores` holds their layout and reads them.

LMDB's map (the address space the file may grow into) is sized from the
source: its bytes, a page of slack for each record, the metadata, and a
margin (`map_size_for`); when it fills anyway (a Dataset's samples, whose
size is not known before they are made) the writer grows it (`set_mapsize`)
and writes the transaction again. So packing works under a `ulimit -v` a
little above what the records take (a fixed 1 TiB map did not). Records are
kept until their transaction is committed (every COMMIT_BYTES), so that a
transaction aborted by a full map can be written again. After the last page
comes the tail (`stores.LMDB_TAIL`), which keeps a damaged page from making a
reader read past the end of the file.

HDF5: the records go to a spool file beside the target first (the contiguous
dataset needs its size before the first write), then into the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gridrun.data.stores import HDF5, LMDB, LMDB_END, LMDB_TAIL, META_PREFIX, key, need

MAP_SLACK = 16 << 20  # added to every LMDB map estimate
COMMIT_BYTES = 64 << 20  # an LMDB write transaction is committed every this many bytes
COPY_BYTES = 64 << 20


def map_size_for(expected_bytes: int, records: int, psize: int = 4096) -> int:
    """An LMDB map for `records` records of `expected_bytes` in all: the bytes, up to a
    page of slack each (a large record takes whole overflow pages), the metadata (a
    CRC, a label and a name each), a quarter more, and MAP_SLACK."""
    return int((expected_bytes + records * (psize + 256)) * 1.25) + MAP_SLACK


class LmdbWriter:
    """Records in key order; a full map is grown and the transaction written again."""

    def __init__(self, path: Path, expected_bytes: int = 0, records: int = 0):
        self.lmdb = need("lmdb")
        self.path = path
        self.map_size = map_size_for(expected_bytes, records)
        self.records, self.added = records, 0
        self.env = self.lmdb.open(str(path), subdir=False, map_size=self.map_size, lock=False,
                                  sync=False, metasync=False, meminit=False, mode=0o644)
        self.pending: list[tuple[bytes, bytes]] = []
        self.pending_bytes = 0

    def add(self, i: int, data: bytes) -> None:
        self.pending.append((key(i), data))
        self.pending_bytes += len(data)
        self.added += 1
        if self.pending_bytes >= COMMIT_BYTES:
            self._commit()

    def _commit(self, meta: dict[str, bytes] | None = None) -> None:
        extra = [(META_PREFIX + name.encode(), value) for name, value in (meta or {}).items()]
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    for k, v in self.pending:
                        txn.put(k, v, append=True)
                    for k, v in extra:
                        txn.put(k, v)
                break
            except self.lmdb.MapFullError:  # the transaction was aborted: grow, write it again
                self._grow(sum(len(v) for _, v in extra))
        self.pending.clear()
        self.pending_bytes = 0

    def _grow(self, extra: int) -> None:
        info, psize = self.env.info(), self.env.stat()["psize"]
        used = (info["last_pgno"] + 1) * psize
        projected = used * self.records // self.added if self.added else 0
        self.map_size = max(self.map_size * 3 // 2, int(projected * 1.25),
                            used + 2 * (self.pending_bytes + extra) + len(self.pending) * psize
                            + MAP_SLACK)
        self.env.set_mapsize(self.map_size)

    def finish(self, meta: dict[str, bytes]) -> None:
        """The metadata, the index last, in the last transaction: a file cut
        short before it has no index and never reads as a packed dataset."""
        self._commit(meta)
        self.env.sync(True)
        self.env.close()
        with open(self.path, "ab") as f:  # the tail (see `stores`), fsynced by pack
            f.write(bytes(LMDB_TAIL - len(LMDB_END)) + LMDB_END)

    def abort(self) -> None:
        self.pending.clear()
        self.env.close()


class Hdf5Writer:
    """Records go to a spool file beside the target first: the contiguous
    dataset needs its size before the first write."""

    def __init__(self, path: Path, expected_bytes: int = 0, records: int = 0):
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
        try:
            self.spool.close()  # may fail again on a full disk (its buffer is flushed)
        finally:
            self.spool_path.unlink(missing_ok=True)


WRITERS = {LMDB: LmdbWriter, HDF5: Hdf5Writer}
