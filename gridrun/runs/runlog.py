"""The per-run metrics log: one JSON object a line, append-only.

Each line is written whole with a single `write` and flushed, so a reader sees
either a complete line or a torn last line (a writer killed mid-write), which
it skips. Readers can follow a live log cheaply by keeping a byte offset.

The shape of a line is records.py's; every reader (analysis, exports, the CLI's
progress lines, the interface) goes through `read`/`parse` here, which treat
each line as untrusted: a line that is not a record (see `records.record`) is
skipped and counted, never a crash. `read_summary` does the same for
summary.json; `restate_summary` is how the engine changes a summary the worker
left (a search's trial stopped at its rung), through `write_summary`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridrun.runs import layout, nofollow, space
from gridrun.runs.layout import UnsafePath
from gridrun.runs.records import Summary, record

SUMMARY_MAX = 16 << 20  # a summary.json bigger than this is not one gridrun wrote


def _clean(value: Any) -> Any:
    # JSON has no NaN or Infinity; a diverged value is recorded as null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends records to `metrics.jsonl`. Use `truncate(offset)` on resume to
    drop lines written after the checkpoint being resumed from."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the run

    def write(self, record: dict[str, Any]) -> None:
        """Append one line, whole or not at all: a write cut short (a full disk) is
        taken back, so no torn line is left for a later line to be glued to, and
        raises space.NoSpace (or the OSError) for the trainer to stop on."""
        line = json.dumps({k: _clean(v) for k, v in record.items()}, separators=(",", ":"))
        data = memoryview(line.encode() + b"\n")
        start = self._file.tell()
        try:
            while data:
                data = data[self._file.write(data):]
        except OSError as e:
            with contextlib.suppress(OSError):
                self.truncate(start)
            if space.is_no_space(e):
                raise space.NoSpace(self.path, e) from e
            raise

    def offset(self) -> int:
        return self._file.tell()

    def truncate(self, offset: int) -> None:
        self._file.truncate(offset)
        self._file.seek(offset)

    def sync(self) -> None:
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NullWriter:
    """A sink that drops everything (so the loop never asks `if writer:`)."""

    def write(self, record: dict[str, Any]) -> None:
        pass

    def offset(self) -> int:
        return 0

    def truncate(self, offset: int) -> None:
        pass

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- reading

@dataclass
class Read:
    """What a read found: the records, the offset to go on from, and how many
    complete lines were not records (skipped: not JSON, not an object, or a
    field of the wrong type). `refused`: why the file was not read at all (a
    symbolic link, something else than a file: see nofollow.py), one line."""

    records: list[dict[str, Any]] = field(default_factory=list)
    offset: int = 0
    skipped: int = 0
    refused: str | None = None


def _null(_: str) -> None:
    return None


_DECODER = json.JSONDecoder(parse_constant=_null)  # NaN, Infinity: null, as the writer writes them


def parse(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The records of complete lines, and how many lines were skipped."""
    records, skipped = [], 0
    for line in data.splitlines():
        if not line:
            continue
        try:
            rec = record(_DECODER.decode(line.decode()))
        except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deep
            rec = None
        if rec is None:
            skipped += 1
        else:
            records.append(rec)
    return records, skipped


def read(path: str | os.PathLike, offset: int = 0) -> Read:
    """Complete records after byte `offset`, the offset to resume from, and the
    number of complete lines skipped.

    A torn last line (no trailing newline yet) is left for the next call; a
    missing file reads as empty; a link is not followed (`refused` says so).
    """
    try:
        with nofollow.open_file(path) as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return Read([], offset, 0)
    except UnsafePath as e:
        return Read([], offset, 0, refused=str(e))
    end = data.rfind(b"\n") + 1
    records, skipped = parse(data[:end])
    return Read(records, offset + end, skipped)


def read_from(path: str | os.PathLike, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """`read` without the count: (records, offset)."""
    got = read(path, offset)
    return got.records, got.offset


def read_all(path: str | os.PathLike) -> list[dict[str, Any]]:
    return read(path, 0).records


def iter_chunks(path: str | os.PathLike, chunk_bytes: int = 1 << 22) -> Iterator[Read]:
    """Records in chunks of about `chunk_bytes`, for streaming large logs. A link is
    not followed: layout.UnsafePath, one line."""
    offset = 0
    with nofollow.open_file(path) as f:
        while True:
            f.seek(offset)
            data = f.read(chunk_bytes)
            if not data:
                return
            end = data.rfind(b"\n") + 1
            if end == 0:
                if len(data) < chunk_bytes:
                    return  # a torn last line
                chunk_bytes *= 2  # a line longer than a chunk
                continue
            records, skipped = parse(data[:end])
            offset += end
            yield Read(records, offset, skipped)


def skipped_note(count: int, path: str | os.PathLike) -> str:
    """What a reader tells the user about lines it skipped."""
    return f"{count} unreadable line{'s' * (count != 1)} skipped in {path}"


# --------------------------------------------------------------------------- summary.json

def read_summary(path: str | os.PathLike) -> Summary | None:
    """`summary.json` through `Summary.from_json`; None when missing or unreadable
    (garbage, caught mid-write by a reader of a live run, or a link: never followed)."""
    try:
        with nofollow.open_file(path) as f:
            return Summary.from_json(json.loads(f.read(SUMMARY_MAX)))
    except (OSError, ValueError, RecursionError, UnsafePath):
        return None


def write_summary(run_dir: str | os.PathLike, summary: Mapping[str, Any]) -> None:
    """RUN_DIR/summary.json, atomically and never through a link: a new temporary file
    (O_EXCL, 0600) in the run folder opened by descriptor, fsynced, renamed over
    summary.json (a link there is replaced, not written through), the folder fsynced.
    On any failure summary.json is as it was and no temporary file is left."""
    data = json.dumps(dict(summary), indent=1, allow_nan=False, default=str).encode()
    dir_fd = nofollow.open_folder(run_dir)  # the run and experiment folders: no link
    try:
        tmp = f".{layout.SUMMARY}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, layout.SUMMARY, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def restate_summary(run_dir: str | os.PathLike, status: str) -> bool:
    """RUN_DIR/summary.json with its `status` set (every other field as the worker wrote
    it), through `write_summary`; False where there is nothing to change: it says so
    already, or there is no summary (missing, not one) to restate. A link at
    summary.json raises layout.UnsafePath (never read, never written through); a
    write that fails, OSError."""
    try:
        raw = nofollow.read_bytes(Path(run_dir) / layout.SUMMARY, limit=SUMMARY_MAX)
        data = _DECODER.decode(raw.decode())
    except FileNotFoundError:
        return False
    except (ValueError, RecursionError):  # garbage: not a summary to restate
        return False
    if not isinstance(data, dict) or data.get("status") == status:
        return False
    write_summary(run_dir, {**data, "status": status})
    return True
