"""The per-run metrics log: one JSON object a line, append-only.

Each line is written whole with a single `write` and flushed, so a reader sees
either a complete line or a torn last line (a writer killed mid-write), which
it skips. Readers can follow a live log cheaply by keeping a byte offset.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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
        line = json.dumps({k: _clean(v) for k, v in record.items()}, separators=(",", ":"))
        self._file.write(line.encode() + b"\n")

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


def _parse(data: bytes) -> list[dict[str, Any]]:
    """The records of complete lines; a corrupt line is skipped."""
    records = []
    for line in data.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def read_from(path: str | os.PathLike, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Complete records after byte `offset`, and the offset to resume from.

    A torn last line (no trailing newline yet) is left for the next call; a
    corrupt complete line is skipped. A missing file reads as empty.
    """
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return _parse(data[:end]), offset + end


def read_all(path: str | os.PathLike) -> list[dict[str, Any]]:
    return read_from(path, 0)[0]


def iter_chunks(path: str | os.PathLike, chunk_bytes: int = 1 << 22) -> Iterator[list[dict[str, Any]]]:
    """Records in chunks of about `chunk_bytes`, for streaming large logs."""
    offset = 0
    with open(path, "rb") as f:
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
            yield _parse(data[:end])
            offset += end
