"""What the MLflow mirror's tests share (no tests here): a real MLflow tracking server
started and stopped by process group, `gridrun mirror mlflow` as a subprocess, a
spirals task that waits at a gate (so a test knows a run is training), and what
MLflow should hold of a run, read back with MLflow's own client.

Imports nothing heavy at the top: the engine's workers import this module for the
gated task."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import patience

HEALTH_WAIT = 120.0  # quiet seconds a server start may take (a busy machine stretches them)


def gated_spirals(gate: str = "", at: int = 5, **kwargs: Any) -> Any:
    """spirals whose `at`-th training batch waits until the file `gate` exists (at most
    five minutes): its first log lines are written, and it is still running."""
    from gridrun.tasks import resolve

    task = resolve("spirals")(**kwargs)
    inner, calls = task.loss, [0]

    def loss(model: Any, batch: Any) -> Any:
        calls[0] += 1
        if calls[0] == at and gate:
            deadline = time.monotonic() + 300
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.05)
        return inner(model, batch)

    task.loss = loss
    return task


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Any, timeout: float = 120.0, interval: float = 0.2, what: Any = "") -> Any:
    """`predicate()` once it is true, polling up to `timeout` quiet seconds (tests/patience.py:
    a busy machine stretches them); `what` (or what it returns, when callable: the state to
    show) is said when it never was."""
    return patience.wait_for(predicate, timeout, interval, what)


def _stop_group(proc: subprocess.Popen, wait: float = 20.0) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=wait)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # what its workers left
    proc.wait()


class Server:
    """`mlflow server` on a SQLite file and a local artifact folder it serves, at a fixed
    port: stopped and started again, it is the same server."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log = folder / "server.log"

    def start(self) -> None:
        mlflow = Path(sys.executable).with_name("mlflow")
        command = [str(mlflow) if mlflow.exists() else "mlflow", "server",
                   "--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}",
                   "--artifacts-destination", str(self.folder / "artifacts"),
                   "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.folder,
                                         start_new_session=True)
        wait_for(self.healthy, HEALTH_WAIT, 0.25, f"the MLflow server ({self.log})")

    def healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"mlflow server exited: {self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            _stop_group(self.proc)
            self.proc = None


class MirrorProcess:
    """`gridrun mirror mlflow --follow` on a root, its stdout and stderr in files."""

    def __init__(self, root: Path, uri: str, every: float = 0.5) -> None:
        self.out, self.err = root.parent / "mirror.out", root.parent / "mirror.err"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gridrun", "mirror", "mlflow", "--follow", "--every",
                 str(every), "--root", str(root), "--tracking-uri", uri],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for(lambda: "mirroring the runs" in self.stdout() or self.proc.poll() is not None,
                 120, what="the mirror to start")
        assert self.proc.poll() is None, self.stdout() + self.stderr()

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()

    def stop(self) -> int:
        """SIGTERM, as a service manager stops it: its exit code."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return patience.wait(self.proc, 60)
        finally:
            _stop_group(self.proc, wait=1)


def attempt(number: int, from_step: int, devices: int, threads: int = 1) -> dict[str, Any]:
    """One start of a run's training loop as summary.json's `attempts` holds it."""
    return {"attempt": number, "from_step": from_step, "started_at": time.time(),
            "threads": threads, "devices": devices, "world_size": devices,
            "reduce": "invariant", "torch": "2.5.1", "device_type": "cpu"}


def record_run(root: Path, spec: Any, losses: list[float], weights: str, *,
               status: str = "completed", attempts: list[dict[str, Any]] = (),
               error: str | None = None) -> None:
    """Run `spec` of the store as if trained: running, then `status`, with its folder's
    records (config.toml, a train and a val line per loss, summary.json with `weights`
    as its hash and `attempts`). No training: each root of a test gets values of its own."""
    from gridrun.runs import layout, runlog, states
    from gridrun.runs.store import Store
    from gridrun.spec.model import write_run_config

    folder = layout.make_run_dir(root, spec.experiment, spec.id)
    write_run_config(folder / layout.CONFIG, spec)
    start = time.time()
    lines = [{"t": start + i, "step": 2 * (i + 1), "epoch": i + 1, "split": split, "loss": loss,
              **({"lr": 0.001} if split == "train" else {})}
             for i, loss in enumerate(losses) for split in ("train", "val")]
    (folder / layout.METRICS).write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = {"run_id": spec.id, "experiment": spec.experiment, "variant": spec.variant,
               "seed": spec.seed, "task": spec.task, "status": status, "step": 2 * len(losses),
               "weights_sha256": weights, "randomness": {"seeds": {"init": spec.seed}},
               "environment": {"torch": "2.5.1", "threads": 1}, "attempts": list(attempts)}
    runlog.write_summary(folder, summary)
    with Store(root, create=False) as store:
        assert store.transition(spec.id, states.QUEUED, states.RUNNING, started_at=start,
                                slot="cpu0")
        assert store.transition(spec.id, states.RUNNING, status, ended_at=time.time(),
                                slot=None, summary=summary, error=error)


# ---- what MLflow holds ---------------------------------------------------------------------


def mlflow_runs(client: Any, experiment: str) -> list[Any]:
    from mlflow.entities import ViewType

    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    return list(client.search_runs([found.experiment_id], run_view_type=ViewType.ALL,
                                   max_results=1000))


def per_attempt(key: str) -> bool:
    """A trainer key an attempt may change under the same run id: one the id leaves out,
    and devices (left out under reduce = "invariant"). MLflow never changes a param."""
    from gridrun.spec.keys import TRAINER_KEYS

    return key == "devices" or (key in TRAINER_KEYS and not TRAINER_KEYS[key].affects_results)


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def expected_params(config: dict) -> dict[str, str]:
    """The resolved config, flat, but the keys an attempt may change: strings as they are,
    other values as JSON."""
    flat = {"task": config["task"], **{k: v for k, v in config["trainer"].items()
                                       if not per_attempt(k)}, **config["task_args"]}
    return {k: as_text(v) for k, v in flat.items()}


def expected_tags(run: Any, summary: dict | None) -> dict[str, str]:
    """The tags that say what its latest attempt ran with: the keys an attempt may change
    as the store's config has them now, and the latest attempt's record (summary.json)."""
    tags = {f"gridrun.config.{k}": as_text(v) for k, v in run.config["trainer"].items()
            if per_attempt(k) and v != ""}
    attempts = (summary or {}).get("attempts") or []
    if attempts:
        tags |= {f"gridrun.env.{k}": as_text(attempts[-1][k]) for k in
                 ("threads", "devices", "world_size", "reduce", "torch", "device_type")}
        tags["gridrun.attempts"] = str(len(attempts))
    return tags


def root_id(root: Path) -> str:
    from gridrun.runs.store import Store

    with Store(root, create=False) as store:
        return store.root_id()


def expected_points(metrics: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl's values, per MLflow metric, as (step, value)."""
    from gridrun.analysis.tensorboard import scalars
    from gridrun.runs import runlog

    out: dict[str, list[tuple[int, float]]] = {}
    for line in runlog.read_all(metrics):
        for key, value in scalars(line):
            out.setdefault(key, []).append((line["step"], value))
    return out


MLFLOW_STATUS = {"running": "RUNNING", "completed": "FINISHED", "stopped": "FINISHED",
                 "failed": "FAILED", "diverged": "FAILED", "oom": "FAILED",
                 "cancelled": "KILLED", "queued": "SCHEDULED", "waiting": "SCHEDULED",
                 "interrupted": "SCHEDULED"}


def difference(client: Any, root: Path, runs: list[Any]) -> str | None:
    """The first way MLflow differs from the runs' records (store rows of `root`), or None:
    each run is one MLflow run tagged with its id and its root's."""
    from gridrun.runs import layout, states

    mine = root_id(root)
    by_id: dict[str, list[Any]] = {}
    for experiment in {r.experiment for r in runs}:
        for m in mlflow_runs(client, experiment):
            if "gridrun.run_id" in m.data.tags and m.data.tags.get("gridrun.root_id") == mine:
                by_id.setdefault(m.data.tags["gridrun.run_id"], []).append(m)
    for run in runs:
        found = by_id.get(run.id, [])
        if len(found) != 1:
            return f"{run.id}: {len(found)} MLflow runs of root {mine}"
        m = found[0]
        if m.data.params != expected_params(dict(run.config)):
            return f"{run.id}: params {m.data.params}"
        tags = m.data.tags
        summary_path = run.run_dir(root) / layout.SUMMARY
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
        want_tags = expected_tags(run, summary if run.status in states.FINISHED else None)
        if {k: tags.get(k) for k in want_tags} != want_tags:
            return f"{run.id}: tags {tags}, not {want_tags}"
        if (tags.get("gridrun.status"), m.info.status) != (run.status, MLFLOW_STATUS[run.status]):
            return f"{run.id}: status {tags.get('gridrun.status')} {m.info.status}, not {run.status}"
        want = expected_points(run.run_dir(root) / layout.METRICS)
        if set(m.data.metrics) != set(want):
            return f"{run.id}: metrics {sorted(m.data.metrics)}, not {sorted(want)}"
        for key, points in want.items():
            got = [(p.step, p.value) for p in client.get_metric_history(m.info.run_id, key)]
            if sorted(got) != sorted(points) or not all(math.isfinite(v) for _, v in got):
                return f"{run.id}: {key} {got[:5]}... not {points[:5]}..."
        if run.status in states.FINISHED:
            summary = json.loads((run.run_dir(root) / layout.SUMMARY).read_text())
            if tags.get("gridrun.weights_sha256") != summary["weights_sha256"]:
                return f"{run.id}: weights tag {tags.get('gridrun.weights_sha256')}"
            if {k: int(tags.get(f"gridrun.seeds.{k}", -1)) for k in summary["randomness"]["seeds"]} \
                    != summary["randomness"]["seeds"]:
                return f"{run.id}: seed tags {tags}"
            files = {a.path for a in client.list_artifacts(m.info.run_id)}
            if not {"config.toml", "summary.json"} <= files:
                return f"{run.id}: artifacts {files}"
            with tempfile.TemporaryDirectory() as tmp:  # as it is now (a stopped trial's is restated)
                sent = json.loads(Path(client.download_artifacts(m.info.run_id, "summary.json",
                                                                 tmp)).read_text())
            if sent != summary:
                return f"{run.id}: summary.json in MLflow says {sent.get('status')}"
    return None


def points_held(client: Any, experiment: str) -> tuple[int, int]:
    """(MLflow runs, metric points) of an experiment."""
    runs = mlflow_runs(client, experiment)
    return len(runs), sum(len(client.get_metric_history(r.info.run_id, key))
                          for r in runs for key in r.data.metrics)
