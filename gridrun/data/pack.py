"""Packing a dataset into one file, atomically, and checking a packed file.

`pack` writes into a temporary file beside the target (`.NAME.tmp-PID-XXXX`),
fsyncs it and renames it into place, then fsyncs the folder: the target is
either absent, the file that was there before, or the complete new one. The
index is the last thing written inside the file too, so even a temporary file
left by a crash never reads as a packed dataset (and the next pack of the same
target removes it once its process is gone).

A folder source is scanned before anything is written (`folder.scan_folder`:
links, FIFOs, devices and names that are not UTF-8 are refused, all named at
once), and each image is read through `userfiles.open_regular`. A Dataset
whose `__getitem__` raises ends the pack in one line naming the sample. A
write that fails (a full disk, a quota, an LMDB map that does not fit the
address space) is one line too, and leaves no temporary file.

`check` reads every record back and compares it with the CRC-32 recorded when
it was packed, all of them with the content hash of the source, and the class
names with the source's: for a folder, each record's class is the folder its
file lies in, and the classes are those folders in sorted order; for samples,
the class names' hash recorded when packing.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gridrun.data import stores
from gridrun.data.folder import read_image, scan_folder, shown_path
from gridrun.data.index import FILES, SAMPLES, ContentHash, Index, PackError
from gridrun.data.readers import (
    CRC,
    INDEX,
    LABELS,
    NAMES,
    read_array,
    read_index,
    read_names,
    shared_reader,
)
from gridrun.data.sources import SampleCodec, image_facts, same_image
from gridrun.data.writers import WRITERS
from gridrun.userfiles import RefusedFile, check_target, write_error

Progress = Callable[[int, int], None]  # (records done, records in all)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("gridrun")
    except Exception:
        return "unknown"


@dataclass
class _Plan:
    """What one source gives: its records in order, and what the index says of them."""

    kind: str
    length: int
    source: str
    records: Iterator[tuple[str, int, bytes]]  # (name, label, bytes)
    class_names: list[str]
    skipped: list[str]
    facts: dict[str, Any]  # filled while the records are read: image, structure, fields
    expected_bytes: int = 0  # the records' bytes, when known before they are read


def _folder_plan(root: Path, any_size: bool) -> _Plan:
    folder = scan_folder(root)
    facts: dict[str, Any] = {}

    def records() -> Iterator[tuple[str, int, bytes]]:
        first: tuple[str, dict[str, Any]] | None = None
        for name, label in zip(folder.names, folder.labels, strict=True):
            path = folder.root / name
            data = read_image(path)
            image = image_facts(path, data)
            if first is None:
                first = (str(path), image)
                facts["image"] = dict(image)
            elif not any_size:
                same_image(first, str(path), image)
            elif facts["image"] is not None and image != first[1]:
                facts["image"] = None  # sizes, modes or formats differ
            if facts["image"] is not None and image["format"] != facts["image"]["format"]:
                facts["image"]["format"] = "mixed"
            yield name, label, data

    return _Plan(FILES, len(folder.names), str(folder.root.resolve()), records(),
                 folder.class_names, folder.skipped, facts, folder.bytes)


def _raised(what: str, e: BaseException) -> PackError:
    first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    return PackError(f"{what} raised {type(e).__name__}{': ' + first if first else ''}")


def _dataset_plan(dataset: Any, source: str | None) -> _Plan:
    name = source or f"a {type(dataset).__name__}"
    if not hasattr(type(dataset), "__len__"):
        raise PackError(f"{type(dataset).__name__} has no len(): pack takes a folder or a "
                        "map-style Dataset")
    try:
        length = len(dataset)
    except Exception as e:  # the user's code: one line, whatever it raised
        raise _raised(f"len() of {name}", e) from e
    codec = SampleCodec()
    facts: dict[str, Any] = {}

    def records() -> Iterator[tuple[str, int, bytes]]:
        for i in range(length):
            try:
                sample = dataset[i]
            except Exception as e:  # the user's code: one line naming the sample
                raise _raised(f"sample {i} of {name}", e) from e
            yield "", 0, codec.encode(i, sample)
        facts.update(structure=codec.structure, fields=codec.fields)

    names = getattr(dataset, "classes", None)
    class_names = list(names) if isinstance(names, list | tuple) and all(
        isinstance(n, str) for n in names) else []
    return _Plan(SAMPLES, length, name, records(), class_names, [], facts)


def target_format(out: Path, fmt: str | None) -> str:
    fmt = fmt or stores.SUFFIXES.get(out.suffix.lower())
    if fmt not in stores.FORMATS:
        raise PackError(f"{out}: which format? --format lmdb or --format hdf5 (or name the file "
                        ".lmdb or .h5)")
    return fmt


def remove_stale_temps(out: Path) -> None:
    """Temporary files of packs into `out` whose process is gone (a crash, a kill)."""
    for tmp in out.parent.glob(f".{out.name}.tmp-*"):
        pid = tmp.name.split(".tmp-", 1)[1].split("-", 1)[0]
        with contextlib.suppress(ValueError, OSError):
            if int(pid) != os.getpid():
                try:
                    os.kill(int(pid), 0)
                except ProcessLookupError:
                    tmp.unlink()


def _fsync(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _free_bytes(folder: Path) -> int | None:
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _not_written(e: BaseException, out: Path) -> PackError:
    """One line for a failed write of `out` (taken while the temporary still holds its
    space: a full disk reads as one even when the store says only 'Input/output error')."""
    free = _free_bytes(out.parent)
    code = getattr(e, "errno", None)
    lmdb = sys.modules.get("lmdb")
    hint = "free space or pick another -o"
    if code in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(e) or (
            free is not None and free < 4 << 20):
        reason = ("the disk quota is exceeded" if code == errno.EDQUOT else
                  f"the disk is full ({free:,} bytes free)" if free is not None
                  else "the disk is full")
    elif lmdb is not None and isinstance(e, lmdb.MemoryError):
        reason = "its LMDB map does not fit this process's address space"
        hint = "raise `ulimit -v`, or pack into .h5"
    elif isinstance(e, OSError) and code:
        reason, hint = write_error(e), "pick another -o"
    else:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        reason, hint = f"{type(e).__name__}{': ' + first if first else ''}", "pick another -o"
    return PackError(f"cannot write {out}: {reason}; nothing was written ({hint})")


def _target(out: Path, force: bool) -> None:
    """`out` may be written (userfiles' rule: no link, no folder, no system folder, an
    existing file only with `force`, its folder there), said as the pack's one line."""
    try:
        check_target(out, force=force)
    except RefusedFile as e:
        raise PackError(str(e)) from None


@contextlib.contextmanager
def _writing(out: Path) -> Iterator[None]:
    """What the store or the file system raise while `out` is written, as one line."""
    lmdb = sys.modules.get("lmdb")
    try:
        yield
    except PackError:
        raise
    except (OSError, RuntimeError) as e:  # h5py raises both
        raise _not_written(e, out) from None
    except Exception as e:
        if lmdb is None or not isinstance(e, lmdb.Error):
            raise
        raise _not_written(e, out) from None


def pack(source: str | Path | Any, out: str | Path, *, format: str | None = None,
         any_size: bool = False, force: bool = False, progress: Progress | None = None,
         source_name: str | None = None) -> dict[str, Any]:
    """Pack `source` (a folder of images, or a map-style Dataset) into `out`.

    `format`: "lmdb" or "hdf5" (default: from out's suffix, .lmdb or .h5).
    `any_size`: accept images of different sizes and modes. `force`: replace an
    existing `out`. `progress(done, total)` is called after each record.
    Returns what was done: records, bytes, file size, seconds, hash, skipped files.
    """
    out = Path(out)
    fmt = target_format(out, format)
    _target(out, force)
    started = time.perf_counter()
    if isinstance(source, str | os.PathLike):
        plan = _folder_plan(Path(source), any_size)
    else:
        plan = _dataset_plan(source, source_name)
    if plan.length == 0:
        raise PackError(f"{shown_path(plan.source)}: nothing to pack (no samples)")
    remove_stale_temps(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    crcs = np.empty(plan.length, dtype=np.uint32)
    labels = np.empty(plan.length, dtype=np.int64)
    names: list[str] = []
    content = ContentHash()
    total = 0
    writer = None
    try:
        with _writing(out):
            writer = WRITERS[fmt](tmp, plan.expected_bytes, plan.length)
        for i, (name, label, data) in enumerate(plan.records):
            with _writing(out):
                writer.add(i, data)
            crcs[i], labels[i] = zlib.crc32(data), label
            content.update(name, label, data)
            names.append(name)
            total += len(data)
            if progress:
                progress(i + 1, plan.length)
        index = Index(kind=plan.kind, length=plan.length, source=plan.source,
                      source_sha256=content.hexdigest(), bytes=total,
                      class_names=plan.class_names, image=plan.facts.get("image"),
                      structure=plan.facts.get("structure"),
                      fields=plan.facts.get("fields") or [], created=time.time(),
                      gridrun=_version(), class_names_sha256=names_hash(plan.class_names))
        meta = {CRC: crcs.tobytes()}
        if plan.kind == FILES:
            meta.update({LABELS: labels.tobytes(), NAMES: json.dumps(names).encode()})
        meta[INDEX] = index.to_bytes()  # last: a file without it is not a packed dataset
        with _writing(out):
            writer.finish(meta)
            _fsync(tmp)
            _target(out, force)  # again: the target may have appeared meanwhile
            os.replace(tmp, out)
            _fsync(out.parent, directory=True)
    except BaseException:
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.abort()
        tmp.unlink(missing_ok=True)
        raise
    return {"out": str(out), "format": fmt, "records": plan.length, "bytes": total,
            "file_bytes": out.stat().st_size, "seconds": time.perf_counter() - started,
            "source": plan.source, "source_sha256": index.source_sha256,
            "describe": index.describe(), "skipped": plan.skipped}


def names_hash(class_names: list[str]) -> str:
    """The SHA-256 of a list of class names, as the index records it."""
    return hashlib.sha256(json.dumps(class_names).encode()).hexdigest()


def class_names_problem(index: Index, names: list[str], labels: np.ndarray) -> str | None:
    """How the class names stored differ from the source's, or None: for a folder, each
    record's class must be the folder its file lies in, and the classes those folders in
    sorted order; for samples, the names must hash as they did when packed."""
    if index.kind == FILES:
        folders = [n.split("/", 1)[0] for n in names]
        stored, want = index.class_names, sorted(set(folders))
        if stored != want:
            k = next((k for k, (a, b) in enumerate(zip(stored, want, strict=False)) if a != b),
                     None)
            if k is None:
                return (f"{len(stored)} class names are stored for the source's {len(want)} "
                        "class folders")
            return (f"class {k} is stored as {stored[k]!r} but the source's class folder {k} "
                    f"is {want[k]!r}")
        wrong = sum(1 for f, y in zip(folders, labels.tolist(), strict=True)
                    if not 0 <= y < len(index.class_names) or index.class_names[y] != f)
        return f"{wrong} records are labelled with another class than their folder" if wrong else None
    if index.class_names_sha256 and names_hash(index.class_names) != index.class_names_sha256:
        return "the class names stored differ from the dataset's when it was packed"
    return None


def check(path: str | Path, progress: Progress | None = None) -> dict[str, Any]:
    """Read every record of a packed file and compare it with what was packed:
    its CRC-32, all of them with the source's content hash, and the class names
    with the source's (`class_names_problem`)."""
    path = Path(path)
    started = time.perf_counter()
    reader = shared_reader(path)
    index = read_index(reader)
    crcs = read_array(reader, CRC, np.uint32, index.length)
    labels = (read_array(reader, LABELS, np.int64, index.length) if index.kind == FILES
              else np.zeros(index.length, dtype=np.int64))
    names = read_names(reader, index) if index.kind == FILES else []
    bad: list[int] = []
    content = ContentHash()
    total = 0
    for i in range(index.length):
        data = reader.get(i)
        total += len(data)
        if zlib.crc32(data) != int(crcs[i]):
            bad.append(i)
        content.update(names[i] if names else "", int(labels[i]), data)
        if progress:
            progress(i + 1, index.length)
    count = len(index.class_names)
    bad_labels = int(((labels < 0) | (labels >= count)).sum()) if index.kind == FILES else 0
    same_hash = content.hexdigest() == index.source_sha256
    classes = class_names_problem(index, names, labels)
    return {"path": str(path), "format": reader.format, "ok": not bad and same_hash
            and not bad_labels and not classes and total == index.bytes, "records": index.length,
            "bad_records": len(bad), "first_bad": [names[i] if names else i for i in bad[:5]],
            "bad_labels": bad_labels, "class_names": classes, "sha256_matches": same_hash,
            "bytes": total, "source": index.source, "source_sha256": index.source_sha256,
            "describe": index.describe(), "seconds": time.perf_counter() - started}
