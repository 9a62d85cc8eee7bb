"""Runs' metrics as TensorBoard event files, written with TensorBoard's own writer.

Each run gets a folder under the log directory, named by what tells it apart:
`LOGDIR/<experiment>/<variant>/s<seed> <run id>` (TensorBoard's run name), and
a scalar per value of its metrics lines: `train/loss`, `train/lr`,
`val/<metric>`, `throughput/samples_per_s`, `diagnostics/grad_norm`,
`memory/rss`, ... at the line's step and wall time. Lines are read with the
one reader (runs/runlog.py), so what does not parse is skipped and counted.

Incremental: each run's folder keeps how far its metrics log has been written
(`SYNCED`: the byte offset and a hash of the bytes before it), and a sync
writes only the lines after it. A log that no longer has those bytes (a run
resumed from a checkpoint cuts the lines after it, or a fresh start) is
written again from the start, in a clean folder.

Event files are written in the calling thread (`EventFile`, a TensorBoard
`Output`): a full disk is an OSError there, never a traceback from a writer's thread,
and what a failed sync had written of a run is cut off again (`EventFile.rollback`),
so the next sync writes each point once. A metrics log that is a link (or a FIFO,
anything but a file) is not read: `Sync.run` says why, in one line.

Needs the `tensorboard` package (the `tensorboard` extra); no torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import math
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridrun.runs import layout, nofollow, runlog
from gridrun.runs import records as rec
from gridrun.runs.layout import UnsafePath

SYNCED = ".gridrun-synced.json"
TAIL = 256  # bytes before the offset whose hash proves the log still starts the same
# where each value of a metrics line goes (train lines; val lines: val/<metric>)
GROUPS = {rec.LOSS: "train", rec.LR: "train", rec.SAMPLES_PER_S: "throughput",
          rec.TOKENS_PER_S: "throughput", rec.STEP_TIME: "throughput",
          rec.GRAD_NORM: "diagnostics", rec.CLIPPED: "diagnostics", rec.DATA_WAIT: "diagnostics",
          rec.MEM_ALLOCATED: "memory", rec.MEM_RESERVED: "memory", rec.MEM_PEAK: "memory",
          rec.RSS: "memory"}


class TensorBoardMissing(ImportError):
    """The tensorboard package is not installed; str() says how to get it."""


def writer_class() -> Any:
    """TensorBoard's own summary writer (`tensorboard.summary.Writer`)."""
    try:
        from tensorboard.summary import Writer
    except ImportError:
        raise TensorBoardMissing("gridrun tensorboard needs the tensorboard package: "
                                 "pip install 'gridrun[tensorboard]'") from None
    return Writer


def tag(split: str, name: str) -> str:
    if split == rec.VAL:
        return f"val/{name}"
    return f"{GROUPS.get(name, 'train')}/{name}"


def scalars(line: dict[str, Any]) -> list[tuple[str, float]]:
    """(tag, value) of each finite number a train or val line holds."""
    split = line.get(rec.SPLIT)
    if split not in (rec.TRAIN, rec.VAL):
        return []
    return [(tag(split, k), float(v)) for k, v in rec.values(line).items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)]


def _part(text: str) -> str:
    """A label as one folder name: no slashes, no leading dot, never empty."""
    text = text.replace("/", "_").replace(os.sep, "_").strip() or "-"
    return "_" + text if text.startswith(".") else text


def run_folder(logdir: Path, experiment: str, variant: str, seed: int, run_id: str) -> Path:
    return logdir / _part(experiment) / _part(variant or "baseline") / f"s{seed} {run_id}"


@dataclass
class Synced:
    """How far a run's log is in its event files."""

    offset: int = 0
    tail: str = ""  # sha256 of the TAIL bytes before offset
    points: int = 0  # scalars written in all

    @classmethod
    def read(cls, folder: Path) -> Synced:
        try:
            data = json.loads((folder / SYNCED).read_text())
            return cls(int(data["offset"]), str(data["tail"]), int(data.get("points", 0)))
        except (OSError, ValueError, KeyError, TypeError):
            return cls()

    def write(self, folder: Path) -> None:
        tmp = folder / (SYNCED + ".tmp")
        tmp.write_text(json.dumps({"offset": self.offset, "tail": self.tail,
                                   "points": self.points}))
        os.replace(tmp, folder / SYNCED)


def _tail(path: Path, offset: int) -> str:
    """The hash of the TAIL bytes before `offset`; a link is never followed (UnsafePath)."""
    try:
        with nofollow.open_file(path) as f:
            f.seek(max(0, offset - TAIL))
            return hashlib.sha256(f.read(min(offset, TAIL))).hexdigest()
    except OSError:
        return ""


_UID = itertools.count()


class EventFile:
    """A TensorBoard `Output` (for its `Writer`) that writes one event file in the calling
    thread: records are kept in memory until `flush`, which writes them all or, failing
    (a full disk), cuts the file back to what it held and raises the OSError."""

    def __init__(self, folder: Path):
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        self.path = folder / (f"events.out.tfevents.{int(time.time()):010d}."
                              f"{socket.gethostname()}.{os.getpid()}.{next(_UID)}")
        self.pending = io.BytesIO()
        self.records = RecordWriter(self.pending)
        self.size = 0  # bytes on disk
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, 0o600)
        try:
            self.records.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
                               .SerializeToString())
            self.flush()
        except BaseException:
            os.close(self.fd)
            self.path.unlink(missing_ok=True)
            raise

    def emit_scalar(self, *, plugin_name: str, tag: str, data: Any, step: Any, wall_time: float,
                    tag_metadata: bytes | None = None, description: str | None = None) -> None:
        """As TensorBoard's DirectoryOutput makes the event."""
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.util import tensor_util

        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin_name,
                                                               content=tag_metadata),
            summary_description=description, data_class=summary_pb2.DataClass.DATA_CLASS_SCALAR)
        event = event_pb2.Event(wall_time=wall_time, step=step)
        event.summary.value.add(tag=tag, tensor=tensor_util.make_tensor_proto(data),
                                metadata=metadata)
        self.records.write(event.SerializeToString())

    def flush(self) -> None:
        data = left = memoryview(self.pending.getvalue())
        try:
            while left:
                left = left[os.write(self.fd, left):]
        except OSError:
            self.rollback(self.size)
            raise
        self.size += len(data)
        self.pending.seek(0)
        self.pending.truncate()

    def rollback(self, size: int) -> None:
        """Forget what is pending and cut the file back to `size` bytes."""
        self.pending.seek(0)
        self.pending.truncate()
        os.ftruncate(self.fd, size)
        self.size = size

    def close(self) -> None:
        try:
            self.flush()
        finally:
            os.close(self.fd)


@dataclass
class Sync:
    """Writes runs' new lines into `logdir`; keeps one writer per run open (so a
    followed run grows one event file, not one per sync). Close it when done."""

    logdir: Path
    writers: dict[str, tuple[Any, EventFile]] = field(default_factory=dict)

    def run(self, root: Path, run: Any) -> tuple[int, int, str | None]:
        """Write what is new in `run`'s metrics log: (scalars written, lines skipped, why
        the log was not read at all or None). An OSError (a full disk) leaves the run's
        event files as the last sync left them."""
        metrics = layout.run_dir(root, run.experiment, run.id) / layout.METRICS
        folder = run_folder(self.logdir, run.experiment, run.variant, run.seed, run.id)
        synced = Synced.read(folder)
        try:
            cut = synced.offset and _tail(metrics, synced.offset) != synced.tail
        except UnsafePath as e:  # a link, a FIFO: never followed, never read
            return 0, 0, str(e)
        if cut:
            self.close(run.id)  # the log was cut or started over: write it again, cleanly
            shutil.rmtree(folder, ignore_errors=True)
            synced = Synced()
        got = runlog.read(metrics, synced.offset)
        if got.refused:
            return 0, 0, got.refused
        points = [(name, value, line[rec.STEP], line.get(rec.T)) for line in got.records
                  for name, value in scalars(line)]
        if points or got.offset != synced.offset:
            layout.make_private_dir(folder)
            writer = out = None
            if points:
                if run.id not in self.writers:
                    out = EventFile(folder)
                    self.writers[run.id] = (writer_class()(_as_output(out)), out)
                writer, out = self.writers[run.id]
            mark = out.size if out else 0
            try:
                for name, value, step, t in points:
                    writer.add_scalar(name, value, step,
                                      wall_time=t if isinstance(t, int | float) else None)
                if out:
                    writer.flush()  # on disk before the offset says so
                Synced(got.offset, _tail(metrics, got.offset),
                       synced.points + len(points)).write(folder)
            except OSError:
                if out:
                    out.rollback(mark)  # what the offset does not count is written again
                raise
        return len(points), got.skipped, None

    def close(self, run_id: str | None = None) -> None:
        for key in [run_id] if run_id is not None else list(self.writers):
            writer, _ = self.writers.pop(key, (None, None))
            if writer is not None:
                with contextlib.suppress(OSError):  # a failed write was said already
                    writer.close()


def _as_output(out: EventFile) -> EventFile:
    """`out`, known to TensorBoard's Writer as one of its outputs."""
    from tensorboard.summary import Output

    Output.register(EventFile)
    return out
