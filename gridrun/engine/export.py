"""Exports: a frame to CSV or Parquet, and every metrics line as long-format
rows streamed to disk, so memory stays bounded whatever the number of lines."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gridrun.engine import layout, runlog, states
from gridrun.engine.analysis import AnalysisError, _read_json

EXPORT_COLUMNS = ["run_id", "step", "epoch", "split", "metric", "value"]


def _parquet_module() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise AnalysisError("writing Parquet needs pyarrow: pip install pyarrow "
                            "(or write a .csv file)") from None
    return pyarrow


def write_frame(frame: pd.DataFrame, out: str | os.PathLike) -> int:
    """CSV, or Parquet when `out` ends in .parquet; returns the number of rows."""
    out = Path(out)
    if out.suffix == ".parquet":
        _parquet_module()
        frame = frame.copy()
        for c in frame.select_dtypes(include="object").columns:
            frame[c] = frame[c].map(lambda v: None if v is None else str(v))
        frame.to_parquet(out, index=False)
    else:
        frame.to_csv(out, index=False)
    return len(frame)


def _long(records: list[dict[str, Any]], run_ids: list[str]) -> pd.DataFrame:
    """Wide log lines -> (run_id, step, epoch, split, metric, value), in line order."""
    df = pd.DataFrame.from_records(records)
    names = [c for c in df.columns if c not in ("t", "step", "epoch", "split")]
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
    for exp_dir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if experiment is not None and exp_dir.name != experiment:
            continue
        for folder in sorted(exp_dir.iterdir()):
            if (folder / layout.CONFIG).is_file():
                yield folder.name, folder


def _status(folder: Path, statuses: Mapping[str, str]) -> str:
    if folder.name in statuses:
        return statuses[folder.name]
    summary = _read_json(folder / layout.SUMMARY)
    if summary and summary.get("status"):
        return summary["status"]
    return states.RUNNING if (folder / layout.METRICS).exists() else states.QUEUED


def export_metrics(root: str | os.PathLike, out: str | os.PathLike, experiment: str | None = None,
                   status: str | None = None, statuses: Mapping[str, str] | None = None, *,
                   chunk_bytes: int = 1 << 22, flush_lines: int = 100_000) -> int:
    """Every metrics line as long-format rows, streamed: memory stays around
    `flush_lines` log lines (plus one chunk) whatever the total. Written to
    OUT.tmp, then renamed."""
    out = Path(out)
    parquet = out.suffix == ".parquet"
    pa = _parquet_module() if parquet else None
    tmp = out.with_name(out.name + ".tmp")
    # Lines of many small logs are converted together: one DataFrame per run
    # would cost more than the parsing for 10,000 short runs.
    records: list[dict[str, Any]] = []
    run_ids: list[str] = []
    total = 0
    writer: Any = None
    statuses = statuses or {}

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
                writer = pa.parquet.ParquetWriter(tmp, batch.schema)
            writer.write_table(batch)
        else:
            chunk.to_csv(tmp, mode="a", header=total == 0, index=False)
        total += len(chunk)

    try:
        tmp.unlink(missing_ok=True)
        for run_id, folder in _run_folders(Path(root), experiment):
            if status is not None and _status(folder, statuses) != status:
                continue
            path = folder / layout.METRICS
            if not path.exists():
                continue
            for lines in runlog.iter_chunks(path, chunk_bytes):
                lines = [r for r in lines if r.get("split") != "start"]  # total_steps: not a metric
                records.extend(lines)
                run_ids.extend([run_id] * len(lines))
                if len(records) >= flush_lines:
                    flush()
        flush()
        if writer is not None:
            writer.close()
        elif total == 0:
            if parquet:
                pd.DataFrame(columns=EXPORT_COLUMNS).to_parquet(tmp, index=False)
            else:
                tmp.write_text(",".join(EXPORT_COLUMNS) + "\n")
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return total
