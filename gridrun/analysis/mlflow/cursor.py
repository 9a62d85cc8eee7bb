"""How far `gridrun mirror mlflow` has sent each run: the cursor (no mlflow here).

The cursor (`Cursor`, ROOT/.mirror-mlflow.json, keyed by the tracking URI as it is shown,
its credentials hidden: uri.redacted; written atomically and never through a link)
keeps per run its MLflow run, the byte offset its metrics log was read to (with a hash
of the bytes before it, `tail`: a log cut by a resume is read again from the start), the
last step sent per metric, the store row's `seq` last mirrored, the files and tags sent;
and the root ids this root sent runs under. MLflow is the truth: the mirror checks the
cursor against it at start (mirror.py), and a point is sent only at a step past
the last one MLflow holds for its metric, so nothing is sent twice.

The file is untrusted input (a person or a program may have written anything in it): a
value not of its shape (Infinity, NaN, a negative offset, a string for a number) makes its
run's entry read as nothing sent, which costs a read of MLflow's state and of the run's
log, never a point sent twice.
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

from gridrun.analysis.mlflow.uri import redacted
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
        """An entry as the cursor file holds it; one whose any value is not of its shape
        (Infinity, NaN, a negative offset, a string for a number) reads as nothing sent:
        MLflow then says where the run is, and a step it holds is never sent again."""
        try:
            if not isinstance(data, dict):
                raise TypeError(data)
            files, last = data.get("files") or {}, data.get("last") or {}
            tags, mlflow = data.get("tags") or [], data.get("mlflow")
            if not (isinstance(files, dict) and isinstance(last, dict) and isinstance(tags, list)
                    and isinstance(data.get("tail", ""), str) and isinstance(mlflow, str | None)
                    and isinstance(data.get("params", False), bool)
                    and all(isinstance(t, str) for t in tags)):
                raise TypeError(data)
            return cls(mlflow, _whole(data["offset"], 0), data.get("tail", ""),
                       {str(k): _whole(v, -_WHOLE_MAX) for k, v in last.items()},
                       _whole(data.get("seq", -1), -1), data.get("params", False),
                       {str(k): _stamp(v) for k, v in files.items()},
                       _whole(data.get("points", 0), 0), list(tags))
        except (KeyError, TypeError, ValueError):
            return cls()  # MLflow says where it is (the check at start)


_WHOLE_MAX = 1 << 62  # past any offset, step or count a run reaches; what a seek takes


def _whole(value: Any, least: int) -> int:
    """`value`, a JSON integer from `least` to _WHOLE_MAX; else ValueError (a float, a bool,
    Infinity, NaN, a string: a damaged cursor)."""
    if type(value) is not int or not least <= value < _WHOLE_MAX:
        raise ValueError(value)
    return value


def _stamp(value: Any) -> list[int]:
    """A file's [size, mtime_ns] as sent."""
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(value)
    return [_whole(v, -_WHOLE_MAX) for v in value]


class Cursor:
    """ROOT/.mirror-mlflow.json: per tracking URI, each run's `Mirrored`, each search's
    parent run and the root ids this root has sent runs under (its store's, and an earlier
    store's before a rebuild). The entries of other URIs are kept as they are."""

    def __init__(self, root: Path, uri: str, data: dict[str, Any] | None = None) -> None:
        # keyed by the URI as shown: a password or a token is never written (an entry an
        # older gridrun keyed with one is kept under the shown URI, and the secret dropped)
        self.path, self.uri = Path(root) / CURSOR, redacted(uri)
        self.data: dict[str, Any] = {}
        for key, value in (data.items() if isinstance(data, dict) else ()):
            self.data.setdefault(redacted(str(key)), value)
        mine = self.data.get(self.uri) if isinstance(self.data.get(self.uri), dict) else {}
        runs, parents = mine.get("runs"), mine.get("parents")  # untrusted: what is not of
        self.runs = {str(k): Mirrored.of(v)  # the shape reads as nothing sent
                     for k, v in (runs.items() if isinstance(runs, dict) else ())}
        self.parents = {str(k): v for k, v in (parents.items() if isinstance(parents, dict)
                                               else ()) if isinstance(v, str)}
        roots = mine.get("roots")
        self.roots = [r for r in roots if isinstance(r, str)] if isinstance(roots, list) else []

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
