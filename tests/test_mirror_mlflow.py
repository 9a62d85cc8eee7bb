"""`gridrun mirror mlflow` against a real MLflow tracking server: runs mirrored live while
the queue trains (params, every metric point at its step, tags, files), nothing added by a
second mirror; a server stopped mid-queue slows no run and is caught up with once it is
back; a search is one parent run with its trials as children."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import subprocess
import sys

import patience
import pytest

pytest.importorskip("mlflow", reason="needs the mlflow package (pip install 'gridrun[mlflow]')")

from mlflow_kit import (
    MirrorProcess,
    difference,
    mlflow_runs,
    points_held,
    wait_for,
)
from search_kit import SEARCH, search_runs
from test_engine_kit import TINY, make_run, metrics_without_timing

from gridrun.engine import daemon
from gridrun.runs import layout, states
from gridrun.runs.store import Store
from gridrun.spec import EngineConfig

SLOTS = EngineConfig(cpu_slots=2)
# a server, four mirrors and three queues: minutes on a loaded machine, so no timeout of
# its own (pytest-timeout's global hour guards a hang); the waits count quiet seconds
pytestmark = pytest.mark.slow


def gated_queue(folder, experiment: str) -> tuple:
    """4 runs (2 learning rates x 2 seeds) whose 5th batch waits for the file `gate`."""
    gate = folder / f"{experiment}.gate"
    runs = [make_run("mlflow_kit:gated_spirals", seed, experiment=experiment,
                     variant=f"lr={lr:g}", task_args={**TINY, "gate": str(gate)}, lr=lr,
                     epochs=3, threads=1)
            for lr in (1e-3, 3e-3) for seed in (0, 1)]
    return runs, gate


@contextlib.contextmanager
def engine(root):
    try:
        daemon.start(root, SLOTS)
        yield
    finally:
        daemon.stop(root, force=True)


def store_rows(root, status: str | None = None) -> list:
    with Store(root, create=False) as store:
        return store.list_runs(status=status)


def finished(root, count: int) -> bool:
    rows = store_rows(root)
    return len(rows) == count and all(r.status in states.FINISHED for r in rows)


def gridrun(*args: str) -> subprocess.CompletedProcess:
    return patience.run([sys.executable, "-m", "gridrun", *args], capture_output=True,
                        text=True, timeout=300)


def catch_up(client, root, rows, mirror) -> None:
    """Until MLflow holds what the records say (bounded); what differs, and what the mirror
    said, when it never does."""
    wait_for(lambda: difference(client, root, rows) is None,
             what=lambda: f"the mirror to catch up: {difference(client, root, rows)}; it said:\n"
                          f"{mirror.stdout()[-3000:]}{mirror.stderr()[-3000:]}")


def live_in_mlflow(client, root, experiment: str) -> bool:
    """Some run trains (store) while MLflow shows it running with points: mirrored live."""
    running = {r.id for r in store_rows(root, states.RUNNING)}
    return any(m.data.tags.get("gridrun.run_id") in running and m.info.status == "RUNNING"
               and "train/loss" in m.data.metrics for m in mlflow_runs(client, experiment))


@pytest.fixture(scope="module")
def live(tmp_path_factory, server, client):
    """A queue trained while `mirror --follow` runs; the reference for the outage test."""
    folder = tmp_path_factory.mktemp("live")
    root = folder / "runs"
    runs, gate = gated_queue(folder, "live")
    with Store(root) as store:
        store.enqueue(runs)
    mirror = MirrorProcess(root, server.uri)
    try:
        with engine(root):
            wait_for(lambda: live_in_mlflow(client, root, "live"), what="a run mirrored live")
            mirror.proc.kill()  # killed mid-run: the next one goes on from its cursor
            mirror.stop()
            mirror = MirrorProcess(root, server.uri)
            gate.touch()
            wait_for(lambda: finished(root, 4), 240, what="the queue")
            rows = store_rows(root)
            catch_up(client, root, rows, mirror)
    finally:
        code = mirror.stop()
    assert code == 0 and "mirror stopped" in mirror.stdout(), mirror.stdout() + mirror.stderr()
    assert not mirror.stderr().strip(), mirror.stderr()
    return root, runs


def test_every_run_is_mirrored_live_once_with_its_config_metrics_tags_and_files(live, server,
                                                                               client):
    root, runs = live
    rows = store_rows(root)
    assert {r.status for r in rows} == {states.COMPLETED}
    assert difference(client, root, rows) is None
    held = {m.data.tags["gridrun.run_id"]: m for m in mlflow_runs(client, "live")}
    assert set(held) == {r.id for r in runs}
    for row in rows:
        tags = held[row.id].data.tags
        assert (tags["gridrun.variant"], tags["gridrun.seed"]) == (row.variant, str(row.seed))
        assert tags["gridrun.env.torch"] and tags["gridrun.determinism.cpu_threads"] == "1"
    # the cursor is the one file the mirror wrote in the root
    assert sorted(p.name for p in root.iterdir() if p.is_file() and not p.name.startswith(
        ("gridrun.db", "engine."))) == [".mirror-mlflow.json"]

    # an export made after the run ended is sent by the next mirror, with its model.json
    export = gridrun("export-model", runs[0].id, "--format", "torchscript", "--root", str(root))
    assert export.returncode == 0, export.stdout + export.stderr
    before = points_held(client, "live")
    again = gridrun("mirror", "mlflow", "--root", str(root), "--tracking-uri", server.uri)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "4 runs" in again.stdout and "0 new, 0 metric points" in again.stdout, again.stdout
    assert points_held(client, "live") == before  # no run, no metric point added
    sent = {a.path for a in client.list_artifacts(held[runs[0].id].info.run_id, "export/best")}
    assert "export/best/model.json" in sent and "export/best/model.ts.pt" in sent
    twice = gridrun("mirror", "mlflow", "--root", str(root), "--tracking-uri", server.uri)
    assert "0 new, 0 metric points, 0 files" in twice.stdout, twice.stdout

    # a resumed run cuts its log at its checkpoint and writes the same steps again, at new
    # times: no step is sent twice
    log = layout.run_dir(root, "live", runs[1].id) / layout.METRICS
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    cut = len(lines) // 2
    log.write_text("".join(json.dumps(line if i < cut else {**line, "t": line["t"] + 60}) + "\n"
                           for i, line in enumerate(lines)))
    resumed = gridrun("mirror", "mlflow", "--root", str(root), "--tracking-uri", server.uri)
    assert "0 new, 0 metric points" in resumed.stdout, resumed.stdout + resumed.stderr
    assert points_held(client, "live") == before


def test_a_server_down_mid_queue_slows_no_run_and_is_caught_up_with(tmp_path, live, server,
                                                                    client):
    reference_root, reference_runs = live
    root = tmp_path / "runs"
    runs, gate = gated_queue(tmp_path, "outage")
    with Store(root) as store:
        store.enqueue(runs)
    mirror = MirrorProcess(root, server.uri)
    try:
        with engine(root):
            wait_for(lambda: live_in_mlflow(client, root, "outage"), what="a run mirrored live")
            server.stop()
            gate.touch()
            wait_for(lambda: "could not send to" in mirror.stderr(), what="the mirror to say so")
            wait_for(lambda: finished(root, 4), 240, what="the queue")
            assert mirror.proc.poll() is None, mirror.stderr()  # it waits for the server
            line = next(x for x in mirror.stderr().splitlines() if "could not send" in x)
            assert "no answer" in line and "trying again in" in line, line
            server.start()  # the same database, the same port
            rows = store_rows(root)
            catch_up(client, root, rows, mirror)
            wait_for(lambda: "answers again" in mirror.stdout(), 60, what="the mirror to say so")
    finally:
        if server.proc is None:
            server.start()
        assert mirror.stop() == 0
    # the runs trained as an undisturbed queue did
    assert {r.status for r in rows} == {states.COMPLETED}
    reference = {(r.variant, r.seed): r for r in reference_runs}
    for run in runs:
        twin = reference[(run.variant, run.seed)]
        mine = json.loads((layout.run_dir(root, run.experiment, run.id) / layout.SUMMARY).read_text())
        theirs = json.loads((layout.run_dir(reference_root, twin.experiment, twin.id)
                             / layout.SUMMARY).read_text())
        assert mine["weights_sha256"] == theirs["weights_sha256"]
        assert metrics_without_timing(root, run) == metrics_without_timing(reference_root, twin)


SEARCH_FAST = SEARCH.replace("max_epochs = 9", "max_epochs = 3")


def test_a_search_is_one_parent_run_with_its_trials_as_children(tmp_path, server, client):
    root = tmp_path / "runs"
    runs = search_runs(tmp_path, SEARCH_FAST)
    assert len(runs) == 9
    with Store(root) as store:
        store.enqueue(runs)
    mirror = MirrorProcess(root, server.uri)
    try:
        with engine(root):
            wait_for(lambda: finished(root, 9), 240, what="the search")
        rows = store_rows(root)
        statuses = {r.id: r.status for r in rows}
        assert states.STOPPED in statuses.values() and states.COMPLETED in statuses.values()

        seen = []

        def parent_and_children():
            held = mlflow_runs(client, "tune")
            parents = [m for m in held if m.data.tags.get("gridrun.role") == "search"]
            children = [m for m in held if parents and m.data.tags.get("mlflow.parentRunId")
                        == parents[0].info.run_id]
            seen[:] = [(m.data.tags, m.info.status) for m in held]
            if len(parents) != 1 or parents[0].info.status != "FINISHED" or len(held) != 10 or \
                    {m.data.tags.get("gridrun.run_id"): m.data.tags.get("gridrun.status")
                     for m in children} != statuses:
                return None
            return parents[0], children

        parent, children = wait_for(parent_and_children, what=lambda: (
            f"the search in MLflow: {seen}; the mirror said: {mirror.stderr()[-3000:]}"))
        catch_up(client, root, rows, mirror)
    finally:
        assert mirror.stop() == 0
    ls = json.loads(gridrun("ls", "--json", "--root", str(root)).stdout)
    assert {r["id"]: r["status"] for r in ls} == statuses
    assert len(children) == 9 and {m.data.tags["gridrun.search_id"] for m in children} == {
        parent.data.tags["gridrun.search_id"]} == {rows[0].config["search"]["id"]}
    assert parent.data.params["search.trials"] == "9"
    board = client.download_artifacts(parent.info.run_id, "leaderboard.csv", str(tmp_path))
    with open(board) as f:
        leaders = list(csv.DictReader(io.StringIO(f.read())))
    assert sorted(int(r["trial"]) for r in leaders) == list(range(9))
    assert {r["status"] for r in leaders} == set(statuses.values())
