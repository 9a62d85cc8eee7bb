"""Packing a dataset into one file, atomically, and checking a packed file.

`pack` writes into a temporary file beside the target (`.NAME.tmp-PID-XXXX`),
fsyncs it and renames it into place, then fsyncs the folder: the target is
either absent, the file that was there before, or the complete new one. The
index is the last thing written inside the file too, so even a temporary file
left by a crash never reads as a packed dataset (and the next pack of the same
target removes it once its process is gone).

`check` reads every record back and compares it with the CRC-32 recorded when
it was packed, and all of them with the content hash of the source.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gridrun.data import stores
from gridrun.data.index import FILES, SAMPLES, ContentHash, Index, PackError
from gridrun.data.readers import (
    CRC,
    INDEX,
    LABELS,
    NAMES,
    read_array,
    read_index,
    shared_reader,
)
from gridrun.data.sources import SampleCodec, image_facts, same_image, scan_folder

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


def _folder_plan(root: Path, any_size: bool) -> _Plan:
    folder = scan_folder(root)
    facts: dict[str, Any] = {}

    def records() -> Iterator[tuple[str, int, bytes]]:
        first: tuple[str, dict[str, Any]] | None = None
        for name, label in zip(folder.names, folder.labels, strict=True):
            path = folder.root / name
            try:
                data = path.read_bytes()
            except OSError as e:
                raise PackError(f"{path}: cannot read it ({e.strerror})") from None
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
                 folder.class_names, folder.skipped, facts)


def _dataset_plan(dataset: Any, source: str | None) -> _Plan:
    try:
        length = len(dataset)
    except TypeError:
        raise PackError(f"{type(dataset).__name__} has no len(): pack takes a folder or a "
                        "map-style Dataset") from None
    codec = SampleCodec()
    facts: dict[str, Any] = {}

    def records() -> Iterator[tuple[str, int, bytes]]:
        for i in range(length):
            yield "", 0, codec.encode(i, dataset[i])
        facts.update(structure=codec.structure, fields=codec.fields)

    names = getattr(dataset, "classes", None)
    class_names = list(names) if isinstance(names, list | tuple) and all(
        isinstance(n, str) for n in names) else []
    return _Plan(SAMPLES, length, source or f"a {type(dataset).__name__}", records(), class_names,
                 [], facts)


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
    if out.is_dir():
        raise PackError(f"{out} is a folder: name the file to write")
    if out.exists() and not force:
        raise PackError(f"{out} exists: --force replaces it")
    if not out.parent.is_dir():
        raise PackError(f"{out.parent}: no such folder")
    started = time.perf_counter()
    if isinstance(source, str | os.PathLike):
        plan = _folder_plan(Path(source), any_size)
    else:
        plan = _dataset_plan(source, source_name)
    if plan.length == 0:
        raise PackError(f"{plan.source}: nothing to pack (no samples)")
    remove_stale_temps(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    writer = stores.WRITERS[fmt](tmp)
    crcs = np.empty(plan.length, dtype=np.uint32)
    labels = np.empty(plan.length, dtype=np.int64)
    names: list[str] = []
    content = ContentHash()
    total, done = 0, False
    try:
        for i, (name, label, data) in enumerate(plan.records):
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
                      structure=plan.facts.get("structure"), fields=plan.facts.get("fields") or [],
                      created=time.time(), gridrun=_version())
        meta = {CRC: crcs.tobytes()}
        if plan.kind == FILES:
            meta.update({LABELS: labels.tobytes(), NAMES: json.dumps(names).encode()})
        meta[INDEX] = index.to_bytes()  # last: a file without it is not a packed dataset
        done = True
        writer.finish(meta)
        _fsync(tmp)
        os.replace(tmp, out)
        _fsync(out.parent, directory=True)
    except BaseException:
        if not done:
            with contextlib.suppress(Exception):
                writer.abort()
        tmp.unlink(missing_ok=True)
        raise
    return {"out": str(out), "format": fmt, "records": plan.length, "bytes": total,
            "file_bytes": out.stat().st_size, "seconds": time.perf_counter() - started,
            "source": plan.source, "source_sha256": index.source_sha256,
            "describe": index.describe(), "skipped": plan.skipped}


def check(path: str | Path, progress: Progress | None = None) -> dict[str, Any]:
    """Read every record of a packed file and compare it with what was packed:
    its CRC-32, and all of them with the source's content hash."""
    path = Path(path)
    started = time.perf_counter()
    reader = shared_reader(path)
    index = read_index(reader)
    crcs = read_array(reader, CRC, np.uint32, index.length)
    labels = (read_array(reader, LABELS, np.int64, index.length) if index.kind == FILES
              else np.zeros(index.length, dtype=np.int64))
    names = json.loads(reader.meta(NAMES) or b"[]") if index.kind == FILES else []
    if index.kind == FILES and len(names) != index.length:
        raise PackError(f"{path}: its names hold {len(names)} entries for {index.length} "
                        "records: " + stores.REPACK.format(path=path))
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
    classes = len(index.class_names)
    bad_labels = int(((labels < 0) | (labels >= classes)).sum()) if index.kind == FILES else 0
    same_hash = content.hexdigest() == index.source_sha256
    return {"path": str(path), "format": reader.format, "ok": not bad and same_hash
            and not bad_labels and total == index.bytes, "records": index.length,
            "bad_records": len(bad), "first_bad": [names[i] if names else i for i in bad[:5]],
            "bad_labels": bad_labels, "sha256_matches": same_hash, "bytes": total,
            "source": index.source, "source_sha256": index.source_sha256,
            "describe": index.describe(), "seconds": time.perf_counter() - started}
