"""What a gridrun run becomes in MLflow (no mlflow here).

A run in its root is one MLflow run: its params are what its run id was made from, the
same on every attempt (`params_of`: the task, every trainer key but those an attempt may
change, PER_ATTEMPT, and every task key, flat: a string as it is, anything else in
JSON's spelling, as the CSV files write it); its tags say which run of which root it is
(`tags_of`, `owned`), what an attempt may change as the run has it now
(`config_tags`), and what decided its bits, its latest attempt's included
(`attempt_tags`); its metrics are every finite value of its train and validation
lines (derived metrics too), named as `gridrun tensorboard` names them (`train/loss`,
`val/accuracy`, `throughput/samples_per_s`, ...), at the line's step and time
(`new_points`); its files are config.toml, summary.json and each export folder that
holds a model.json (`run_files`, read without following a link, `copy_out`).

How far the mirror has sent each run is the cursor's (cursor.py). MLflow is the
truth: a point is sent only at a step past the last one MLflow holds for its metric
(`new_points`), so nothing is sent twice.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridrun.analysis.rowtable import spelled
from gridrun.analysis.tensorboard import scalars
from gridrun.runs import layout, nofollow, states
from gridrun.runs import records as rec
from gridrun.runs.layout import UnsafePath
from gridrun.spec.keys import TRAINER_KEYS

EXPORT_DIR, MODEL_JSON = "export", "model.json"  # as `gridrun export-model` writes them (deploy/)
# the environment fields that decide a run's bits (gridrun/train/environment.py REPRODUCE;
# named here: that module imports torch)
REPRODUCE = ("torch", "threads", "cpu_capability", "cpu", "blas", "onednn", "cuda", "cudnn", "gpu")
TAG_VALUE_MAX = 5000  # MLflow keeps 8000 characters of a tag
PARAM_VALUE_MAX = 6000  # and 6000 of a param

RUN_ID, SEARCH_ID, ROLE, PARENT = ("gridrun.run_id", "gridrun.search_id", "gridrun.role",
                                   "mlflow.parentRunId")
# the root a run is of: two roots may hold the same run id (one root per device count), and
# an MLflow run is one run in one root (its store's root_id; its path, for people)
ROOT_ID, ROOT = "gridrun.root_id", "gridrun.root"
OURS = "gridrun."  # the tags the mirror owns: one it no longer sends is deleted, never left stale
# the trainer keys an attempt may change under the same run id: those the id leaves out
# (threads, checkpoint_every, num_workers, ...) and devices (left out under reduce =
# "invariant"). MLflow never changes a param: these are tags (CONFIG), rewritten as they change
PER_ATTEMPT = frozenset({k for k, key in TRAINER_KEYS.items() if not key.affects_results}
                        | {"devices"})
CONFIG = "gridrun.config."
# what summary.json's `attempts` records of each start of the training loop (FIELDS of
# train/loop/attempts.py; named here: that module imports torch), the latest's as
# gridrun.env.<field>
ATTEMPT_FIELDS = ("threads", "devices", "world_size", "reduce", "torch", "device_type")
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


def as_queued(trainer: Mapping[str, Any], adjustments: Any = ()) -> dict[str, Any]:
    """The trainer keys as the run was queued, before the engine adjusted them for a retry
    (an out-of-memory retry halves batch_size and doubles accumulate, under the same id):
    each adjustment holds {key: [before, after]}."""
    out = dict(trainer)
    for change in reversed(list(adjustments or ())):
        for key, values in (change.items() if isinstance(change, Mapping) else ()):
            if key in out and isinstance(values, list) and len(values) == 2:
                out[key] = values[0]
    return out


def params_of(config: Mapping[str, Any], adjustments: Any = ()) -> dict[str, str]:
    """A store row's config (RunSpec.to_dict()) as MLflow params: what its run id was made
    from, the same on every attempt (a param never changes in MLflow): the task, the trainer
    keys as queued but those of PER_ATTEMPT, and the task keys."""
    trainer = as_queued(config.get("trainer") or {}, adjustments)
    flat = {"task": config.get("task"),
            **{k: v for k, v in trainer.items() if k not in PER_ATTEMPT},
            **(config.get("task_args") or {})}
    return {mlflow_key(str(k)): param_value(v) for k, v in flat.items()}


def config_tags(config: Mapping[str, Any], adjustments: Any = ()) -> dict[str, str]:
    """gridrun.config.<key>: the values an attempt may change, as the run has them now
    (the keys of PER_ATTEMPT, and those an adjustment changed)."""
    trainer = config.get("trainer") or {}
    queued = as_queued(trainer, adjustments)
    return {CONFIG + mlflow_key(str(k)): _text(v) for k, v in trainer.items()
            if (k in PER_ATTEMPT or queued[k] != v) and v is not None and v != ""}


def attempt_tags(summary: rec.Summary) -> dict[str, str]:
    """What its latest attempt ran with (gridrun.env.<field>), how many attempts it took,
    each one's record (gridrun.attempt_history, JSON: the newest that fit in a tag) and
    the changes of environment a resume could not keep (gridrun.env_changes)."""
    attempts = [a for a in summary.attempts if isinstance(a, Mapping)]
    if not attempts:  # a run from before attempts were recorded
        return {}
    tags = {f"gridrun.env.{k}": _text(attempts[-1][k]) for k in ATTEMPT_FIELDS
            if attempts[-1].get(k) is not None}
    tags["gridrun.attempts"] = str(len(attempts))
    history = [{k: a.get(k) for k in ("attempt", "from_step", *ATTEMPT_FIELDS)} for a in attempts]
    while history and len(text := json.dumps(history, separators=(",", ":"))) > TAG_VALUE_MAX:
        history = history[1:]
    tags["gridrun.attempt_history"] = text if history else ""
    tags["gridrun.env_changes"] = "; ".join(
        f"{c.get('field')} {c.get('from')} -> {c.get('to')} at step {c.get('step')}"
        for c in summary.environment_changes if isinstance(c, Mapping))
    return tags


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


def tags_of(run: Any, summary: rec.Summary | None, root_id: str, root: str) -> dict[str, str]:
    """Which run it is (id, its root, experiment, variant, ablation, seed, status, attempt,
    trial), the values an attempt may change (`config_tags`) and, once it has a summary,
    what decides its bits: its weights' hash, each source's seed, the environment facts of
    REPRODUCE and of its latest attempt (`attempt_tags`) and the determinism settings."""
    tags: dict[str, str] = {ROOT_ID: root_id, ROOT: root,
                            **config_tags(run.config, run.adjustments)}
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
        tags.update(attempt_tags(summary))
        _flat("gridrun.determinism", summary.determinism or environment.get("determinism"), tags)
    return {k: v[:TAG_VALUE_MAX] for k, v in tags.items() if v}


def owned(tags: Mapping[str, str], mlflow_id: str, mine: set[str], named: str | None) -> bool:
    """Whether an MLflow run is this root's: tagged with one of its ids (`mine`: its
    store's, and those its cursor recorded before, as a store rebuilt by `doctor --rebuild`
    draws another), or, sent before runs carried their root, named by this root's cursor
    (`named`: the MLflow run its cursor holds for that run id). A run of no root that the
    cursor does not name may be another root's: it is left as it is."""
    root = tags.get(ROOT_ID)
    return root in mine if root else named is not None and mlflow_id == named


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
