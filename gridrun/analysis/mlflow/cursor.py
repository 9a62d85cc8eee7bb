"""How far `gridrun mirror mlflow` has sent each run: the cursor (no mlflow here).

The cursor (`Cursor`, ROOT/.mirror-mlflow.json, keyed by tracking URI, written
atomically and never through a link) keeps per run its MLflow run, the byte offset
its metrics log was read to (with a hash of the bytes before it, `tail`: a log cut by a
resume is read again from the start), the last step sent per metric, the store row's
`seq` last mirrored, the files and tags sent; and the root ids this root sent runs
under. MLflow is the truth: the mirror checks the cursor against it at start
(mirror.py), and a point is sent only at a step past the last one MLflow holds for its
metric, so nothing is sent twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gridrun.runs import nofollow
from gridrun.runs.layout import UnsafePath

CURSOR = ".mirror-mlflow.json"
CURSOR_MAX = 64 << 20
TAIL = 256  # bytes before the offset whose hash proves the log still starts the same


def tail(path: Path, offset: int) -> str:
    """The hash of the TAIL bytes before `offset`, read without following a link; ""
    when it cannot be read (a log now shorter than the offset: cut)."""
    if not offset:
        return ""
    try:
        with nofollow.open_file(path) as f:
            f.seek(max(0, offset - TAIL))
            data = f.read(min(offset, TAIL))
    except (OSError, UnsafePath):
        return ""
    return hashlib.sha256(data).hexdigest() if len(data) == min(offset, TAIL) else ""



@dataclass
class Mirrored:
    """How far one run is in MLflow."""

    mlflow: str | None = None  # its MLflow run id
    offset: int = 0  # its metrics log read up to here
    tail: str = ""  # the hash of the TAIL bytes before offset
    last: dict[str, int] = field(default_factory=dict)  # metric -> the last step sent
    seq: int = -1  # the store row's seq whose tags, status and files were sent
    params: bool = False  # its params were sent
    files: dict[str, list[int]] = field(default_factory=dict)  # artifact -> [size, mtime_ns]
    points: int = 0  # metric points sent in all
    tags: list[str] = field(default_factory=list)  # the tags of OURS its MLflow run holds

    @classmethod
    def of(cls, data: Any) -> Mirrored:
        try:
            mlflow = data.get("mlflow")
            return cls(mlflow if isinstance(mlflow, str) else None, int(data["offset"]),
                       str(data.get("tail", "")),
                       {str(k): int(v) for k, v in (data.get("last") or {}).items()},
                       int(data.get("seq", -1)), bool(data.get("params")),
                       {str(k): [int(x) for x in v] for k, v in (data.get("files") or {}).items()},
                       int(data.get("points", 0)), [str(k) for k in data.get("tags") or ()])
        except (AttributeError, KeyError, TypeError, ValueError):
            return cls()  # MLflow says where it is (the check at start)


class Cursor:
    """ROOT/.mirror-mlflow.json: per tracking URI, each run's `Mirrored`, each search's
    parent run and the root ids this root has sent runs under (its store's, and an earlier
    store's before a rebuild). The entries of other URIs are kept as they are."""

    def __init__(self, root: Path, uri: str, data: dict[str, Any] | None = None) -> None:
        self.path, self.uri = Path(root) / CURSOR, uri
        self.data = data if isinstance(data, dict) else {}
        mine = self.data.get(uri) if isinstance(self.data.get(uri), dict) else {}
        runs, parents = mine.get("runs"), mine.get("parents")  # untrusted: what is not of
        self.runs = {str(k): Mirrored.of(v)  # the shape reads as nothing sent
                     for k, v in (runs.items() if isinstance(runs, dict) else ())}
        self.parents = {str(k): str(v)
                        for k, v in (parents.items() if isinstance(parents, dict) else ())}
        roots = mine.get("roots")
        self.roots = [str(r) for r in roots] if isinstance(roots, list) else []

    @classmethod
    def load(cls, root: Path, uri: str) -> tuple[Cursor, str | None]:
        """The cursor and, when the file could not be used, why (a link is never
        followed: UnsafePath is raised). A damaged file reads as empty."""
        path = Path(root) / CURSOR
        try:
            data = json.loads(nofollow.read_bytes(path, folders=0, limit=CURSOR_MAX))
        except FileNotFoundError:
            return cls(root, uri), None
        except (OSError, ValueError, RecursionError) as e:
            return cls(root, uri), f"{path} could not be read ({e}): MLflow says where each run is"
        return cls(root, uri, data), None

    def save(self) -> None:
        """Atomically: a new file (O_EXCL, 0600, no link) renamed over the cursor."""
        self.data[self.uri] = {"runs": {k: asdict(v) for k, v in self.runs.items()},
                               "parents": self.parents, "roots": self.roots}
        blob = json.dumps(self.data, separators=(",", ":")).encode()
        tmp = self.path.with_name(f"{CURSOR}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
