"""Packed datasets: many small files (or any map-style Dataset) in one LMDB or HDF5 file.

    index     the index a packed file carries (kind, length, class names,
              dtypes and shapes, the source's content hash), PackError
    folder    a source folder (the ImageFolder layout), walked under the policy
              for links, FIFOs, devices and names that are not UTF-8
    sources   what gets packed: the images of a folder, a Dataset's samples
    stores    the containers: LMDB and HDF5 readers
    writers   the LMDB (its map sized from the source, grown) and HDF5 writers
    pack      `pack` (atomic: temporary file, fsync, rename) and `check`
    readers   `PackedDataset` (opens its handle lazily in each process, again
              after a fork), `FolderDataset`, `open_records`

Near the bottom of the stack: imports nothing else of gridrun but
`gridrun.userfiles` (every packed file and source file is opened through its
`open_regular`), and neither torch
nor lmdb nor h5py until they are needed (`gridrun pack --help` stays fast).
The `[data]` extra installs lmdb, h5py and Pillow.
"""

from gridrun.data.index import FILES, SAMPLES, Index, PackError
from gridrun.data.pack import check, pack
from gridrun.data.readers import FolderDataset, PackedDataset, open_records

__all__ = ["FILES", "SAMPLES", "FolderDataset", "Index", "PackError", "PackedDataset", "check",
           "open_records", "pack"]
