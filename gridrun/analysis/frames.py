"""Runs -> one table, a row per run (ablation tables over it: analysis.py); as plain
rows (`RowTable`, what `gridrun compare` reads) or as a pandas DataFrame.

A run's row comes from the store when the root has one: its config, and once
it has ended its summary, are columns of the store's row, so an ended run
costs no file; only a run still going (queued, running, interrupted), or one
the store has no summary of, is read from its folder (summary.json, then what
its metrics log says so far). A root without a store, and a run folder the
store does not know, are read from the files: config.toml, summary.json,
metrics.jsonl. A frame can be of one experiment: nothing of the others is
read. `ExperimentFrame` (experiment_frame.py) keeps one experiment's frame
between refreshes and reads again only the runs that changed.

Metric directions are the task's own ("metrics": {name: "lower" | "higher"} in
summary.json, or in a live run's start line); where no run declares one,
`records.direction` guesses. Live runs go through `progress.fold`, as in the
interface.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gridrun.analysis.rowtable import RowTable
from gridrun.runs import layout, nofollow, progress, records, runlog, states
from gridrun.spec import RunSpec, parse_run_config
from gridrun.spec.search import bracket_of, rungs

if TYPE_CHECKING:
    import pandas as pd

    from gridrun.runs.store import Run

BASE = ["id", "experiment", "variant", "ablation", "seed", "task", "status"]
RUN_FIELDS = ["step", "total_steps", "best_step", "started_at", "ended_at", "wall_time_s",
              "train_loss", "samples_per_s", "tokens_per_s", "peak_memory_bytes", "device",
              "precision", "error"]
TRACKED = "tracked"  # the metric a run's best evaluation is best in (its resolved early-stop metric)
STAND_IN = "stand_in"  # "final": a run without a best evaluation, its best_ columns its last's
# a run's metric values by what they hold, and the prefix of their columns: the last
# evaluation; the evaluation best in the early-stop metric (what early stopping keeps);
# each metric's own best evaluation
KINDS = {"final": "final_", "best": "best_", "own_best": "own_"}
PENDING = (states.QUEUED, states.RUNNING, states.INTERRUPTED)
CONFIG_MAX = 1 << 20  # a config.toml bigger than this is not one gridrun wrote


def _checked(spec: RunSpec) -> RunSpec | None:
    names = (spec.id, spec.experiment, spec.variant, spec.task, spec.ablation)
    if not all(isinstance(n, str) for n in names) or not all(
            isinstance(k, str) for k in (*spec.trainer, *spec.task_args)):
        return None
    return spec


def _read_config(path: Path) -> RunSpec | None:
    """A run folder's config.toml, or None when it is not one gridrun wrote:
    unreadable, not TOML, nested too deep, or a field of the wrong type. A link
    (the file or its folders) is never followed: layout.UnsafePath."""
    try:
        spec = parse_run_config(nofollow.read_bytes(path, limit=CONFIG_MAX))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    return _checked(spec)


def _store_spec(run: Run) -> RunSpec | None:
    """A store row's config as a RunSpec, or None when it is not one (any JSON may
    have been stored; its keys are strings)."""
    try:
        spec = run.spec
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    names = (spec.id, spec.experiment, spec.variant, spec.task, spec.ablation)
    return spec if all(isinstance(n, str) for n in names) else None


def _hashable(value: Any) -> Any:
    if type(value) is not list:
        return value
    return tuple(_hashable(v) if type(v) is list else v for v in value)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Thousands of small dicts and rows hold no reference cycles, yet creating them
    sets off the cyclic garbage collector over and over (an eighth of the time of a
    10,000-run frame): it waits until they are built."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _live(path: Path, spec: RunSpec, notes: list[str]) -> dict[str, Any]:
    """What a run without summary.json has logged so far (torn last line skipped;
    lines that are not records are skipped and noted), through the one fold."""
    got = runlog.read(path)
    if got.refused:
        notes.append(got.refused)
    if got.skipped:
        notes.append(runlog.skipped_note(got.skipped, path))
    known = progress.Progress.known(early_stop_metric=spec.trainer.get("early_stop_metric"))
    p = progress.fold(got.records, previous=known)
    return {"step": p.step if p.lines else None, "train_loss": p.train_loss,
            "samples_per_s": p.mean_samples_per_s, "final": dict(p.last),
            "best": dict(p.best_values), "best_step": p.best_step, "metrics": dict(p.metrics),
            "own_best": dict(p.own_best), "early_stop_metric": p.metric if p.lines else None}


@dataclass
class _Entry:
    """One run's row of the frame, and what reading it found out."""

    row: dict[str, Any]
    config_keys: list[str]
    directions: dict[str, str] = field(default_factory=dict)  # declared by its summary
    axes: list[str] = field(default_factory=list)  # the keys its experiment's matrix varies
    notes: list[str] = field(default_factory=list)


def _entry(spec: RunSpec, folder: Path | None, status: str | None,
           provenance: Mapping[str, Any] | None, summary: Mapping[str, Any] | None = None) -> _Entry:
    """A run's row; `summary` (the store's) spares reading the folder's summary.json,
    which is read otherwise, and without one, what the metrics log says so far."""
    config = spec.config
    lists = [k for k, v in config.items() if type(v) is list]  # e.g. betas: tuples, to group by
    if lists:
        config = {**config, **{k: _hashable(config[k]) for k in lists}}
    # the frame orders its columns itself: only the names of a run's own keys win
    row: dict[str, Any] = {**config, "id": spec.id, "experiment": spec.experiment,
                           "variant": spec.variant, "ablation": spec.ablation, "seed": spec.seed,
                           "task": spec.task}
    entry = _Entry(row, list(config), axes=list(spec.axes))
    if summary is None and folder is not None:
        read = runlog.read_summary(folder / layout.SUMMARY)
        summary = read.to_json() if read is not None else None
    metrics_path = folder / layout.METRICS if folder else None
    if summary is not None:
        data, file_status = summary, summary.get("status")
    elif metrics_path is not None and os.path.lexists(metrics_path):
        data, file_status = _live(metrics_path, spec, entry.notes), states.RUNNING
    else:
        data, file_status = {}, states.QUEUED
    entry.directions = dict(data.get("metrics") or {})  # as the task declares them
    row["status"] = status or file_status or states.QUEUED
    row.update(zip(RUN_FIELDS, map(data.get, RUN_FIELDS), strict=True))
    row[TRACKED] = data.get("early_stop_metric")
    if spec.trial is not None and spec.search:  # a search's trial: its rung and budget used
        row.update(search_fields(spec, data.get("epoch")))
    for kind, prefix in KINDS.items():
        for name, value in (data.get(kind) or {}).items():
            row[prefix + name] = value
    if row["status"] == states.COMPLETED and not data.get("best") and data.get("final"):
        # its early-stop metric was never finite: no best evaluation, its last stands in
        row.update({KINDS["best"] + k: v for k, v in data["final"].items()} | {STAND_IN: "final"})
    # a summary is a cleaned Summary (no git keys of its own): its provenance, and the store's
    for source in ((summary or {}).get("provenance"), provenance):
        if isinstance(source, dict | Mapping):  # dict first: the common case, without the ABC
            for key, value in source.items():
                if key.startswith("git"):
                    row[key] = value
                elif source is provenance and not isinstance(value, dict | list | Mapping):
                    row[f"git_{key}"] = value  # the store's {"commit", "dirty", ...}
    return entry


def search_fields(spec: RunSpec, epoch: Any) -> dict[str, Any]:
    """trial, search, rung (0 first; None without a scheduler), epochs_used, search_metric."""
    search = spec.search or {}
    rung = None
    if search.get("scheduler") and isinstance(epoch, int):
        steps = rungs(search["min_epochs"], search["max_epochs"], search["eta"],
                      bracket_of(spec.trial or 0, search.get("brackets", 1)))
        rung = max(sum(1 for e in steps if e <= epoch) - 1, 0)
    return {"trial": spec.trial, "search": search.get("id"), "rung": rung,
            "epochs_used": epoch if isinstance(epoch, int) else 0,
            "search_metric": search.get("metric")}


def _stamp(path: Path) -> tuple[int, int] | None:
    """(size, mtime) of a file, to see that it changed without reading it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _in_order(summary: dict[str, Any], root: Path, run: Run,
              orders: dict[str, dict[str, list[str]]]) -> dict[str, Any]:
    """A store summary with its metrics in the task's order: the store keeps JSON
    keys sorted, so the order (the table's columns) is taken from one ended run's
    summary.json per experiment."""
    if all(len(summary.get(kind) or ()) < 2 for kind in KINDS):
        return summary  # nothing to order
    order = orders.get(run.experiment)
    if order is None:  # one try per experiment: without a readable file, the sorted order
        read = runlog.read_summary(run.run_dir(root) / layout.SUMMARY)
        file = read.to_json() if read is not None else {}
        order = orders[run.experiment] = {k: list(file.get(k) or {}) for k in (*KINDS, "metrics")}
    out = summary
    for kind in (*KINDS, "metrics"):
        values, keys = summary.get(kind), order[kind]
        if keys and isinstance(values, dict) and list(values) != keys:
            if out is summary:
                out = dict(summary)
            if len(values) == len(keys) and all(k in values for k in keys):
                out[kind] = {k: values[k] for k in keys}
            else:
                known = [k for k in keys if k in values]
                out[kind] = {k: values[k] for k in [*known, *(k for k in values if k not in known)]}
    return out


def _run_entry(root: Path, run: Run, status: str | None, cache: dict[str, tuple[Any, _Entry]] | None,
               orders: dict[str, dict[str, list[str]]]) -> _Entry | None:
    """A store row's entry: its config and, once it has ended, its summary from the
    row; the folder only for a run still going or one without a summary. With a
    `cache`, an entry is reused while the row's seq (and a running run's metrics
    log) are unchanged."""
    status = status or run.status
    stamp = None
    if status == states.RUNNING:
        stamp = _stamp(layout.run_dir(root, run.experiment, run.id) / layout.METRICS)
    key = (run.seq, status, stamp)
    if cache is not None and (hit := cache.get(run.id)) is not None and hit[0] == key:
        return hit[1]
    spec = _store_spec(run)
    if spec is None:
        return None
    stored = None if status in PENDING else records.Summary.from_json(run.summary)
    summary = vars(stored) if stored is not None else None  # its fields, read only: no copy
    if summary is None:
        entry = _entry(spec, run.run_dir(root), status, run.provenance)
    else:
        entry = _entry(spec, None, status, run.provenance, _in_order(summary, root, run, orders))
    if cache is not None:
        cache[run.id] = (key, entry)
    return entry


def _experiment_folders(root: Path, experiment: str | None,
                        refused: list[str] | None = None) -> Iterator[tuple[str, list[str]]]:
    """(experiment, its entries' names, sorted) for each folder of the root, or only
    `experiment`'s. A link is never followed (noted in `refused`)."""
    if not root.is_dir():
        return
    if experiment is None:
        names = sorted(p.name for p in root.iterdir() if p.is_dir())
    elif experiment and "/" not in experiment and experiment not in (".", "..") \
            and (root / experiment).is_dir():
        names = [experiment]
    else:
        names = []
    for name in names:
        if not nofollow.is_dir(root / name):
            if refused is not None:
                refused.append(f"{root / name} is a symbolic link: gridrun never follows a "
                               "link inside its root, so it was not read")
            continue
        with contextlib.suppress(OSError):
            yield name, sorted(os.listdir(root / name))


def _folder_entry(folder: Path, statuses: Mapping[str, str], provenance: Mapping[str, Any],
                  skipped: list[str], refused: list[str]) -> _Entry | None:
    """A run read from its folder alone; None when it is not a run folder (no
    config.toml) or its config.toml cannot be read (then listed in `skipped`), or
    when the folder or its config.toml is a link (then said in `refused`)."""
    config = folder / layout.CONFIG
    if not os.path.lexists(config):
        return None
    try:
        spec = _read_config(config)
    except layout.UnsafePath as e:
        refused.append(str(e))
        return None
    if spec is None:
        skipped.append(str(folder))
        return None
    return _entry(spec, folder, statuses.get(spec.id), provenance.get(spec.id))


def runs_frame(root: str | os.PathLike, statuses: Mapping[str, str] | None = None,
               **options: Any) -> pd.DataFrame:
    """`run_rows` as a pandas DataFrame (its `attrs` the same)."""
    return run_rows(root, statuses, **options).to_frame()


def run_rows(root: str | os.PathLike, statuses: Mapping[str, str] | None = None, *,
             queued: Iterable[RunSpec] = (),
             provenance: Mapping[str, Mapping[str, Any]] | None = None,
             runs: Iterable[Run] | None = None, experiment: str | None = None,
             cache: dict[str, tuple[Any, _Entry]] | None = None,
             orders: dict[str, dict[str, list[str]]] | None = None) -> RowTable:
    """One row per run: the store's `runs` (see the module doc), or without them
    each run folder ROOT/<experiment>/<run_id>/ holding a config.toml.

    A run folder the store's rows do not hold (a run trained in the foreground,
    a folder copied in) is read from its files and comes in folder order with
    the others; store rows without a folder come after them, in queue order.
    `experiment` reads only that experiment's folder and rows.
    `statuses` ({run_id: state}) overrides what the rows or files say; without
    `runs`, `queued` adds runs the store knows that have no folder yet and
    `provenance` ({run_id: {"git_commit": ..., ...}}) adds provenance columns.
    `cache` and `orders` keep entries and each experiment's metric order between
    calls (see `ExperimentFrame`).
    Folders whose config.toml cannot be read are skipped and listed in
    `attrs["skipped"]`; "notes" says what else was left out (metrics
    lines that are not records). `attrs` also holds "directions"
    ({metric: "lower"|"higher"}), "metrics" and "config_columns".
    """
    with collector_paused():
        return _run_rows(Path(root), statuses or {}, queued, provenance or {}, runs, experiment,
                           cache, {} if orders is None else orders)


def _run_rows(root: Path, statuses: Mapping[str, str], queued: Iterable[RunSpec],
                provenance: Mapping[str, Mapping[str, Any]], runs: Iterable[Run] | None,
                experiment: str | None, cache: dict[str, tuple[Any, _Entry]] | None,
                orders: dict[str, dict[str, list[str]]]) -> RowTable:
    entries: list[_Entry] = []
    skipped: list[str] = []
    refused: list[str] = []  # links, never followed
    if runs is not None:
        rows = [r for r in runs if experiment is None or r.experiment == experiment]
        by_id = {r.id: r for r in rows}
        placed: set[str] = set()
        for exp, names in _experiment_folders(root, experiment, refused):
            for name in names:
                run = by_id.get(name)
                got = None
                if run is not None and run.experiment == exp:
                    got = _run_entry(root, run, statuses.get(name), cache, orders)
                if got is not None:
                    placed.add(name)
                else:
                    got = _folder_entry(root / exp / name, statuses, {}, skipped, refused)
                if got is not None:
                    entries.append(got)
        for run in rows:
            if run.id not in placed and (got := _run_entry(root, run, statuses.get(run.id), cache,
                                                           orders)) is not None:
                entries.append(got)
        if cache is not None:
            for stale in set(cache) - set(by_id):
                del cache[stale]
    else:
        seen = set()
        for exp, names in _experiment_folders(root, experiment, refused):
            for name in names:
                got = _folder_entry(root / exp / name, statuses, provenance, skipped, refused)
                if got is not None:
                    seen.add(got.row["id"])
                    entries.append(got)
        for spec in queued:
            if spec.id not in seen and (experiment is None or spec.experiment == experiment):
                entries.append(_entry(spec, None, statuses.get(spec.id), provenance.get(spec.id)))
    return _table(entries, skipped, refused)


def _table(entries: list[_Entry], skipped: list[str], refused: list[str] = ()) -> RowTable:
    directions: dict[str, str] = {}
    notes: list[str] = list(refused)
    config_columns: dict[str, None] = {}
    columns: dict[str, None] = {}
    axes: dict[str, None] = {}
    for e in entries:
        config_columns.update(dict.fromkeys(e.config_keys))
        columns.update(dict.fromkeys(e.row))
        axes.update(dict.fromkeys(e.axes))
        for name, direction in e.directions.items():
            directions.setdefault(name, direction)
        notes.extend(e.notes)
    if stand_in := [e.row for e in entries if e.row.get(STAND_IN)]:
        its = "their" if len(stand_in) > 1 else "its"
        notes.append(f"{len(stand_in)} run{'s' * (its == 'their')} whose early-stop metric was never finite "
                     f"({', '.join(sorted({str(r.get(TRACKED)) for r in stand_in}))}): {its} best values "
                     f"are {its} last evaluation's values")
    if not entries:
        columns = dict.fromkeys(BASE)
    metrics: dict[str, None] = {}
    for column in columns:
        for kind in KINDS.values():
            if column.startswith(kind) and column != "best_step":
                metrics[column[len(kind):]] = None
    # a run that has started declares its metrics (its start line) before any evaluation:
    # its columns come from there, never from a guess
    for e in entries:
        metrics.update(dict.fromkeys(e.directions))
    for name in metrics:
        directions.setdefault(name, records.direction(name))
    front = [c for c in BASE if c in columns]
    config_cols = [c for c in config_columns if c not in BASE]
    rest = [c for c in columns if c not in front and c not in config_cols]
    return RowTable([e.row for e in entries], front + config_cols + rest,
                    {"directions": directions, "metrics": list(metrics), "skipped": skipped,
                     "config_columns": config_cols, "notes": notes, "axes": list(axes)})


def store_runs(root: str | os.PathLike, experiment: str | None = None) -> list[Run] | None:
    """The store's runs (of one experiment), or None when the root has no store or
    it cannot be read: the folders alone then tell. Never creates a store:
    reading must not write into a root."""
    if not (Path(root) / layout.DB_NAME).is_file():
        return None
    try:
        from gridrun.runs.store import Store

        with Store(root, create=False, create_store=False) as store, collector_paused():
            return store.list_runs(experiment=experiment)
    except Exception:
        return None  # files alone still give a table


def load_rows(root: str | os.PathLike, experiment: str | None = None) -> RowTable:
    """`run_rows` of a root as it is: from its store when it has one, else its folders."""
    return run_rows(root, runs=store_runs(root, experiment), experiment=experiment)


def load_frame(root: str | os.PathLike, experiment: str | None = None) -> pd.DataFrame:
    """`load_rows` as a pandas DataFrame."""
    return load_rows(root, experiment).to_frame()


def experiments(root: str | os.PathLike) -> list[str]:
    """The experiments a root has runs of (in its store, or a folder with a run folder)."""
    root = Path(root)
    names: set[str] = set()
    if (root / layout.DB_NAME).is_file():
        with contextlib.suppress(Exception):
            from gridrun.runs.store import Store

            with Store(root, create=False, create_store=False) as store:
                names.update(store.experiments())
    for exp, entries in _experiment_folders(root, None):
        if exp not in names and any((root / exp / e / layout.CONFIG).is_file() for e in entries):
            names.add(exp)
    return sorted(names)
