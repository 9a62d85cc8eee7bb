"""What a gridrun run becomes in MLflow, and how far the mirror has sent it (no mlflow here).

A run is one MLflow run: its params are the resolved config (`params_of`: the task,
every trainer key and every task key, flat, each value as the run id hashes it: a
string as it is, anything else in JSON's spelling); its tags say which run it is
and what decides its bits (`tags_of`); its metrics are every finite value of its
train and validation lines (derived metrics too), named as `gridrun tensorboard`
names them (`train/loss`, `val/accuracy`, `throughput/samples_per_s`, ...), at the
line's step and time (`new_points`); its files are config.toml, summary.json and
each export folder that holds a model.json (`run_files`, read without following a
link, `copy_out`).

The cursor (`Cursor`, ROOT/.mirror-mlflow.json, keyed by tracking URI, written
atomically and never through a link) keeps per run its MLflow run, the byte offset
its metrics log was read to (with a hash of the bytes before it: a log cut by a
resume is read again from the start), the last step sent per metric, the store
row's `seq` last mirrored and the files sent. MLflow is the truth: the mirror
checks the cursor against it at start (mlflow_mirror.py), and a point is sent only
at a step past the last one MLflow holds for its metric, so nothing is sent twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import re
import secrets
import shutil
import stat
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gridrun.analysis.rowtable import spelled
from gridrun.analysis.tensorboard import scalars
from gridrun.runs import layout, nofollow, states
from gridrun.runs import records as rec
from gridrun.runs.layout import UnsafePath

CURSOR = ".mirror-mlflow.json"
CURSOR_MAX = 64 << 20
TAIL = 256  # bytes before the offset whose hash proves the log still starts the same
EXPORT_DIR, MODEL_JSON = "export", "model.json"  # as `gridrun export-model` writes them (deploy/)
# the environment fields that decide a run's bits (gridrun/train/environment.py REPRODUCE;
# named here: that module imports torch)
REPRODUCE = ("torch", "threads", "cpu_capability", "cpu", "blas", "onednn", "cuda", "cudnn", "gpu")
TAG_VALUE_MAX = 5000  # MLflow keeps 8000 characters of a tag
PARAM_VALUE_MAX = 6000  # and 6000 of a param

RUN_ID, SEARCH_ID, ROLE, PARENT = ("gridrun.run_id", "gridrun.search_id", "gridrun.role",
                                   "mlflow.parentRunId")
SEARCH_ROLE = "search"  # ROLE of a search's parent run
STATUS = {states.RUNNING: "RUNNING", states.COMPLETED: "FINISHED", states.STOPPED: "FINISHED",
          states.FAILED: "FAILED", states.DIVERGED: "FAILED", states.OOM: "FAILED",
          states.CANCELLED: "KILLED", states.QUEUED: "SCHEDULED",
          states.INTERRUPTED: "SCHEDULED", states.WAITING: "SCHEDULED"}


def param_value(value: Any) -> str:
    """A string as it is, anything else in JSON's spelling, as the CSV files write it
    (rowtable.spelled); cut at MLflow's 6000 characters (a longer value would refuse the
    whole run)."""
    return _text(value)[:PARAM_VALUE_MAX]


def _text(value: Any) -> str:
    text = spelled(value)
    return text if isinstance(text, str) else json.dumps(text)


def params_of(config: Mapping[str, Any]) -> dict[str, str]:
    """A store row's config (RunSpec.to_dict()) as MLflow params."""
    flat = {"task": config.get("task"), **(config.get("trainer") or {}),
            **(config.get("task_args") or {})}
    return {mlflow_key(str(k)): param_value(v) for k, v in flat.items()}


def search_params(search: Mapping[str, Any]) -> dict[str, str]:
    """A search's settings (RunSpec.search) as its parent run's params."""
    return {f"search.{k}": param_value(v) for k, v in search.items()}


def search_of(run: Any) -> str | None:
    """The id of the search `run` is a trial of, or None."""
    search = run.config.get("search") if isinstance(run.config, Mapping) else None
    sid = search.get("id") if isinstance(search, Mapping) else None
    return sid if isinstance(sid, str) and run.config.get("trial") is not None else None


def mlflow_key(text: str) -> str:
    """`text` as a key MLflow takes (a metric, param or tag name): letters, digits, `_-. /`,
    at most 250 characters, and no path that would resolve to another name."""
    key = re.sub(r"[^\w\-. /]", "_", text)[:250]
    if not key or posixpath.normpath(key) != key or key.startswith(("..", "/")):
        key = "_" + key.replace("/", "_").lstrip(".")
    return key


def _flat(prefix: str, values: Any, out: dict[str, str]) -> None:
    if isinstance(values, Mapping):
        for k, v in values.items():
            if not isinstance(v, Mapping | list):
                _flat(f"{prefix}.{mlflow_key(str(k))}", v, out)
    elif values is not None and values != "":
        out[prefix] = _text(values)


def tags_of(run: Any, summary: rec.Summary | None) -> dict[str, str]:
    """Which run it is (id, experiment, variant, ablation, seed, status, attempt, trial)
    and, once it has a summary, what decides its bits: its weights' hash, each source's
    seed, the environment facts of REPRODUCE and the determinism settings."""
    tags: dict[str, str] = {}
    _flat("gridrun", {"run_id": run.id, "experiment": run.experiment, "variant": run.variant,
                      "ablation": run.ablation, "seed": run.seed, "status": run.status,
                      "attempt": run.attempt, "task": run.config.get("task")}, tags)
    if (sid := search_of(run)) is not None:
        tags.update({SEARCH_ID: sid, "gridrun.trial": str(run.config["trial"])})
    if run.error and run.status in states.FINISHED:
        tags["gridrun.error"] = run.error.strip().splitlines()[0] if run.error.strip() else ""
    if summary is not None:
        _flat("gridrun", {"weights_sha256": summary.weights_sha256, "device": summary.device,
                          "precision": summary.precision}, tags)
        randomness = summary.randomness or {}
        _flat("gridrun.seeds", randomness.get("seeds"), tags)
        _flat("gridrun.randomness", {"separate": randomness.get("separate"),
                                     "switched_off": ",".join(map(str, randomness.get(
                                         "switched_off") or []))}, tags)
        environment = summary.environment or {}
        _flat("gridrun.env", {k: environment.get(k) for k in REPRODUCE}, tags)
        _flat("gridrun.determinism", summary.determinism or environment.get("determinism"), tags)
    return {k: v[:TAG_VALUE_MAX] for k, v in tags.items() if v}


def run_name(run: Any) -> str:
    """`lr=0.001 s0`; a run of an experiment with nothing varying (no variant) is named
    by its experiment: `tricks s0` (an ablation's unchanged run is its variant `baseline`)."""
    return f"{run.variant or run.experiment} s{run.seed}"


def millis(t: Any) -> int:
    return int(t * 1000) if isinstance(t, int | float) and not isinstance(t, bool) else 0


def new_points(lines: list[dict[str, Any]], last: Mapping[str, int]
               ) -> tuple[list[tuple[str, float, int, int]], dict[str, int]]:
    """(key, value, timestamp in ms, step) of each value of `lines` at a step past the last
    one sent for its key, and the last steps with them. A log rewritten after a resume
    repeats steps already sent: they are left out."""
    after = dict(last)
    out = []
    for line in lines:
        step = line[rec.STEP]
        for name, value in scalars(line):
            key = mlflow_key(name)
            if step > after.get(key, -1):
                out.append((key, value, millis(line.get(rec.T)), step))
                after[key] = step
    return out, after


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


def leaderboards(root: Path, rows: list[Any], experiment: str) -> dict[str, str]:
    """A search's leaderboard as `gridrun compare` writes it: {file name: text}, csv and table."""
    from gridrun.analysis import frames, tables

    table = frames.run_rows(root, runs=[r for r in rows if r.experiment == experiment],
                            experiment=experiment)
    texts = {name: tables.search_text(root, table, experiment, fmt)
             for fmt, name in (("csv", "leaderboard.csv"), ("table", "leaderboard.txt"))}
    return {name: text for name, text in texts.items() if text is not None}


# ---- files -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunFile:
    """A file of a run folder to send: where it goes among the run's artifacts (`key`),
    where it is, how many folders above it are opened without following a link, and
    its (size, mtime_ns) to tell whether it changed since it was sent."""

    key: str
    path: Path
    folders: int
    stamp: tuple[int, int]


def _regular(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _listing(folder: Path, folders: int) -> tuple[int, list[str]] | None:
    try:
        fd = nofollow.open_folder(folder, folders=folders)
    except (OSError, UnsafePath):
        return None
    try:
        return fd, sorted(os.listdir(fd))
    except OSError:
        os.close(fd)
        return None


def run_files(run_dir: Path) -> list[RunFile]:
    """config.toml, summary.json and each export folder (export/best, export/last) with a
    model.json, every file in it: regular files only, no link followed (a link, or a
    folder that is one, is left out). A run folder that is a link: UnsafePath; none: []."""
    out = []
    try:
        fd = nofollow.open_folder(run_dir)
    except FileNotFoundError:  # a run cancelled before it ever started
        return []
    try:
        for name in (layout.CONFIG, layout.SUMMARY):
            if (st := _regular(fd, name)) is not None:
                out.append(RunFile(name, run_dir / name, 2, (st.st_size, st.st_mtime_ns)))
    finally:
        os.close(fd)
    found = _listing(run_dir / EXPORT_DIR, 3)
    if found is None:
        return out
    fd, names = found
    try:
        for which in names:
            inner = _listing(run_dir / EXPORT_DIR / which, 4)
            if inner is None:
                continue
            wfd, files = inner
            try:
                stats = {n: st for n in files if (st := _regular(wfd, n)) is not None}
            finally:
                os.close(wfd)
            if MODEL_JSON in stats:
                out += [RunFile(f"{EXPORT_DIR}/{which}/{n}", run_dir / EXPORT_DIR / which / n, 4,
                                (st.st_size, st.st_mtime_ns)) for n, st in stats.items()]
    finally:
        os.close(fd)
    return out


def copy_out(file: RunFile, target: Path) -> None:
    """`file` copied to `target` (outside the root), read without following a link."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with nofollow.open_file(file.path, folders=file.folders) as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


# ---- the cursor ------------------------------------------------------------------------


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

    @classmethod
    def of(cls, data: Any) -> Mirrored:
        try:
            mlflow = data.get("mlflow")
            return cls(mlflow if isinstance(mlflow, str) else None, int(data["offset"]),
                       str(data.get("tail", "")),
                       {str(k): int(v) for k, v in (data.get("last") or {}).items()},
                       int(data.get("seq", -1)), bool(data.get("params")),
                       {str(k): [int(x) for x in v] for k, v in (data.get("files") or {}).items()},
                       int(data.get("points", 0)))
        except (AttributeError, KeyError, TypeError, ValueError):
            return cls()  # MLflow says where it is (the check at start)


class Cursor:
    """ROOT/.mirror-mlflow.json: per tracking URI, each run's `Mirrored` and each search's
    parent run. The entries of other URIs are kept as they are."""

    def __init__(self, root: Path, uri: str, data: dict[str, Any] | None = None) -> None:
        self.path, self.uri = Path(root) / CURSOR, uri
        self.data = data if isinstance(data, dict) else {}
        mine = self.data.get(uri) if isinstance(self.data.get(uri), dict) else {}
        runs, parents = mine.get("runs"), mine.get("parents")  # untrusted: what is not of
        self.runs = {str(k): Mirrored.of(v)  # the shape reads as nothing sent
                     for k, v in (runs.items() if isinstance(runs, dict) else ())}
        self.parents = {str(k): str(v)
                        for k, v in (parents.items() if isinstance(parents, dict) else ())}

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
                               "parents": self.parents}
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
