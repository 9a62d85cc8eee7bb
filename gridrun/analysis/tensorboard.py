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

Needs the `tensorboard` package (the `tensorboard` extra); no torch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridrun.runs import layout, runlog
from gridrun.runs import records as rec

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
    try:
        with open(path, "rb") as f:
            f.seek(max(0, offset - TAIL))
            return hashlib.sha256(f.read(min(offset, TAIL))).hexdigest()
    except OSError:
        return ""


@dataclass
class Sync:
    """Writes runs' new lines into `logdir`; keeps one writer per run open (so a
    followed run grows one event file, not one per sync). Close it when done."""

    logdir: Path
    writers: dict[str, Any] = field(default_factory=dict)

    def run(self, root: Path, run: Any) -> tuple[int, int]:
        """Write what is new in `run`'s metrics log: (scalars written, lines skipped)."""
        metrics = layout.run_dir(root, run.experiment, run.id) / layout.METRICS
        folder = run_folder(self.logdir, run.experiment, run.variant, run.seed, run.id)
        synced = Synced.read(folder)
        if synced.offset and _tail(metrics, synced.offset) != synced.tail:
            self.close(run.id)  # the log was cut or started over: write it again, cleanly
            shutil.rmtree(folder, ignore_errors=True)
            synced = Synced()
        got = runlog.read(metrics, synced.offset)
        points = [(name, value, line[rec.STEP], line.get(rec.T)) for line in got.records
                  for name, value in scalars(line)]
        if points or got.offset != synced.offset:
            layout.make_private_dir(folder)
            if points:
                writer = self.writers.get(run.id)
                if writer is None:
                    writer = self.writers[run.id] = writer_class()(str(folder))
                for name, value, step, t in points:
                    writer.add_scalar(name, value, step,
                                      wall_time=t if isinstance(t, int | float) else None)
                writer.flush()  # on disk before the offset says so
            Synced(got.offset, _tail(metrics, got.offset), synced.points + len(points)).write(folder)
        return len(points), got.skipped

    def close(self, run_id: str | None = None) -> None:
        for key in [run_id] if run_id is not None else list(self.writers):
            writer = self.writers.pop(key, None)
            if writer is not None:
                writer.close()
