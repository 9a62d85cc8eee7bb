"""Exports: a frame to CSV or Parquet, and every metrics line as long-format
rows streamed to disk, so memory stays bounded whatever the number of lines.

Every export goes through `atomic_file`, which is userfiles.atomic_write (the one
rule for the files gridrun writes on a user's request): a temporary file in the
target's folder, fsynced, then renamed onto the target. An existing target is
replaced only when asked (`force`), a symbolic link never written through nor
replaced, a system folder never written; a full disk leaves the old file whole.
Its refusals are AnalysisError (a ValueError) here, but for TargetExists.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

from gridrun import userfiles
from gridrun.analysis.ablation import AnalysisError
from gridrun.analysis.rowtable import spelled
from gridrun.runs import layout, runlog, states
from gridrun.runs import records as rec
from gridrun.runs.layout import UnsafePath

EXPORT_COLUMNS = ["run_id", "step", "epoch", "split", "metric", "value"]


def _parquet_module() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise AnalysisError("writing Parquet needs pyarrow: pip install pyarrow "
                            "(or write a .csv file)") from None
    return pyarrow


TargetExists = userfiles.TargetExists  # a FileExistsError: the target exists, no `force`


def check_target(out: str | os.PathLike, force: bool = False) -> Path:
    """`out`, if an export may write it (userfiles.check_target): TargetExists, or
    AnalysisError with the one line that says why not."""
    try:
        return userfiles.check_target(out, force=force)
    except TargetExists:
        raise
    except userfiles.RefusedFile as e:
        raise AnalysisError(str(e)) from None


@contextlib.contextmanager
def atomic_file(out: str | os.PathLike, *, force: bool = False,
                binary: bool = False) -> Iterator[IO[Any]]:
    """userfiles.atomic_write (text by default): on success the file becomes `out`, on any
    failure or interruption `out` is as it was. Refused or failed (a full disk): TargetExists,
    or AnalysisError in one line."""
    try:
        with userfiles.atomic_write(out, force=force, binary=binary) as f:
            yield f
    except TargetExists:
        raise
    except userfiles.RefusedFile as e:
        raise AnalysisError(str(e)) from None


def write_frame(frame: pd.DataFrame, out: str | os.PathLike, *, force: bool = False) -> int:
    """CSV, or Parquet when `out` ends in .parquet, written atomically (see
    `atomic_file`); returns the number of rows."""
    out = Path(out)
    frame = frame.copy()
    if out.suffix == ".parquet":
        _parquet_module()
        for c in [c for c in frame.columns if frame[c].dtype == object]:  # bool: Parquet's own
            frame[c] = frame[c].map(lambda v: None if v is None else str(spelled(v)))
        with atomic_file(out, force=force, binary=True) as f:
            frame.to_parquet(f, index=False)
    else:
        for c in [c for c in frame.columns if frame[c].dtype in (object, bool)]:
            frame[c] = frame[c].map(spelled)  # JSON's spelling, as MLflow's params have it
        with atomic_file(out, force=force) as f:
            frame.to_csv(f, index=False)
    return len(frame)


def _long(records: list[dict[str, Any]], run_ids: list[str]) -> pd.DataFrame:
    """Wide log lines -> (run_id, step, epoch, split, metric, value), in line order."""
    df = pd.DataFrame.from_records(records)
    names = [c for c in df.columns if c not in rec.PLACE]  # metrics and the loop's values
    values = df[names].apply(pd.to_numeric, errors="coerce").to_numpy(float)
    keep = ~np.isnan(values.ravel())
    n = int(keep.sum())

    def repeat(column: str | None, fill: Any) -> np.ndarray:
        if column is not None and column not in df:
            return np.full(n, fill)
        data = np.asarray(run_ids, dtype=object) if column is None else df[column].to_numpy()
        return np.repeat(data, len(names))[keep]

    return pd.DataFrame({
        "run_id": repeat(None, None), "step": repeat("step", np.nan),
        "epoch": repeat("epoch", np.nan), "split": repeat("split", None),
        "metric": np.tile(np.asarray(names, dtype=object), len(df))[keep],
        "value": values.ravel()[keep],
    })


def _run_folders(root: Path, experiment: str | None) -> Iterable[tuple[str, Path]]:
    """Real run folders (a link is never followed; its files' readers say so)."""
    for exp_dir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if experiment is not None and exp_dir.name != experiment:
            continue
        for folder in sorted(exp_dir.iterdir()):
            if os.path.lexists(folder / layout.CONFIG):
                yield folder.name, folder


def _status(folder: Path, statuses: Mapping[str, str]) -> str:
    if folder.name in statuses:
        return statuses[folder.name]
    summary = runlog.read_summary(folder / layout.SUMMARY)
    if summary and summary.status:
        return summary.status
    return states.RUNNING if (folder / layout.METRICS).exists() else states.QUEUED


def export_metrics(root: str | os.PathLike, out: str | os.PathLike, experiment: str | None = None,
                   status: str | None = None, statuses: Mapping[str, str] | None = None, *,
                   force: bool = False, skipped: dict[str, int] | None = None,
                   refused: list[str] | None = None,
                   chunk_bytes: int = 1 << 22, flush_lines: int = 100_000) -> int:
    """Every metrics line as long-format rows, streamed: memory stays around
    `flush_lines` log lines (plus one chunk) whatever the total. Written
    atomically (see `atomic_file`). Lines that are not records are left out and
    counted in `skipped` ({metrics.jsonl path: lines}); a log that is a link (or in a
    folder that is one) is never followed: one line for it in `refused`."""
    out = Path(out)
    parquet = out.suffix == ".parquet"
    pa = _parquet_module() if parquet else None
    # Lines of many small logs are converted together: one DataFrame per run
    # would cost more than the parsing for 10,000 short runs.
    records: list[dict[str, Any]] = []
    run_ids: list[str] = []
    total = 0
    writer: Any = None
    statuses = statuses or {}
    skipped = {} if skipped is None else skipped
    refused = [] if refused is None else refused

    with atomic_file(out, force=force, binary=parquet) as f:
        def flush() -> None:
            nonlocal writer, total
            if not records:
                return
            chunk = _long(records, run_ids)
            records.clear()
            run_ids.clear()
            if parquet:
                batch = pa.Table.from_pandas(chunk.astype({"step": "float64", "epoch": "float64"}),
                                             preserve_index=False)
                if writer is None:
                    writer = pa.parquet.ParquetWriter(f, batch.schema)
                writer.write_table(batch)
            else:
                chunk.to_csv(f, header=total == 0, index=False)
            total += len(chunk)

        for run_id, folder in _run_folders(Path(root), experiment):
            if status is not None and _status(folder, statuses) != status:
                continue
            path = folder / layout.METRICS
            if not os.path.lexists(path):
                continue
            chunks = runlog.iter_chunks(path, chunk_bytes)
            try:
                first = next(chunks, None)  # opens the file: a link is refused here
            except UnsafePath as e:
                refused.append(str(e))
                continue
            for got in itertools.chain([first] if first is not None else [], chunks):
                if got.skipped:
                    skipped[str(path)] = skipped.get(str(path), 0) + got.skipped
                lines = [r for r in got.records if r[rec.SPLIT] != rec.START]  # no values
                records.extend(lines)
                run_ids.extend([run_id] * len(lines))
                if len(records) >= flush_lines:
                    flush()
        flush()
        if writer is not None:
            writer.close()
        elif total == 0:
            if parquet:
                pd.DataFrame(columns=EXPORT_COLUMNS).to_parquet(f, index=False)
            else:
                f.write(",".join(EXPORT_COLUMNS) + "\n")
    return total
