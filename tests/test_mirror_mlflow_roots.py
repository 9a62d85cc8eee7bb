"""`gridrun mirror mlflow` against a real MLflow tracking server, for what a run is in it:
the run in its root (two roots holding the same run id are two MLflow runs; runs mirrored
before roots had an id are found from their own root only), values an attempt changed
never left stale, `--follow` started before the root has a store, and values spelled as
the CSV files spell them. The runs' records are written without training
(mlflow_kit.record_run), so that each root holds values of its own; the live queue is
test_mirror_mlflow.py's."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import pytest

pytest.importorskip("mlflow", reason="needs the mlflow package (pip install 'gridrun[mlflow]')")

from mlflow_kit import (
    MirrorProcess,
    attempt,
    difference,
    mlflow_runs,
    record_run,
    root_id,
    wait_for,
)
from search_kit import SEARCH, search_runs
from test_engine_kit import make_run
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.runs import states
from gridrun.runs.store import Store

# a server and a dozen mirrors: no timeout of its own (the waits count quiet seconds)
pytestmark = pytest.mark.slow


def mirror(root, uri: str) -> str:
    """`gridrun mirror mlflow` once, in this process: what it said."""
    result = CliRunner().invoke(app, ["mirror", "mlflow", "--root", str(root),
                                      "--tracking-uri", uri])
    assert result.exit_code == 0, result.output
    return result.output


def rows(root) -> list:
    with Store(root, create=False) as store:
        return store.list_runs()


def queued(root, runs) -> None:
    with Store(root) as store:
        store.enqueue(runs)


def held(client, experiment: str, run_id: str) -> list:
    return [m for m in mlflow_runs(client, experiment) if m.data.tags.get("gridrun.run_id") == run_id]


def test_two_roots_holding_the_same_run_id_are_two_mlflow_runs(tmp_path, server, client):
    spec = make_run(seed=0, experiment="twins", threads=1)
    one, two = tmp_path / "one", tmp_path / "two"
    for root, losses, weights in ((one, [0.9, 0.7, 0.5], "a" * 64), (two, [0.8, 0.6, 0.4], "b" * 64)):
        queued(root, [spec])
        record_run(root, spec, losses, weights, attempts=[attempt(1, 0, devices=1)])
    assert "1 new" in mirror(one, server.uri)
    assert "1 new" in mirror(two, server.uri)
    found = held(client, "twins", spec.id)
    assert len(found) == 2
    assert {m.data.tags["gridrun.root_id"] for m in found} == {root_id(one), root_id(two)}
    assert {m.data.tags["gridrun.weights_sha256"] for m in found} == {"a" * 64, "b" * 64}
    assert difference(client, one, rows(one)) is None
    assert difference(client, two, rows(two)) is None
    for root in (one, two):  # each goes on in its own run
        assert "0 new, 0 metric points, 0 files" in mirror(root, server.uri)
    assert len(held(client, "twins", spec.id)) == 2


def test_two_roots_holding_the_same_search_are_two_parent_runs(tmp_path, server, client):
    one, two = tmp_path / "one", tmp_path / "two"
    trials = search_runs(tmp_path, SEARCH.replace("trials = 9", "trials = 2"))
    for root, weights in ((one, "a"), (two, "b")):
        queued(root, trials)
        for trial in trials:
            record_run(root, trial, [0.9, 0.7], weights * 64)
        mirror(root, server.uri)
    runs = mlflow_runs(client, "tune")
    parents = {m.data.tags.get("gridrun.root_id"): m for m in runs
               if m.data.tags.get("gridrun.role") == "search"}
    assert set(parents) == {root_id(one), root_id(two)}
    for root in (one, two):
        children = [m for m in runs if m.data.tags.get("mlflow.parentRunId")
                    == parents[root_id(root)].info.run_id]
        assert sorted(m.data.tags["gridrun.run_id"] for m in children) == sorted(
            t.id for t in trials)
        assert {m.data.tags["gridrun.root_id"] for m in children} == {root_id(root)}
        assert difference(client, root, rows(root)) is None


def test_runs_mirrored_before_roots_had_an_id_are_found_from_their_own_root_only(
        tmp_path, server, client):
    spec = make_run(seed=0, experiment="legacy", threads=1)
    old, new = tmp_path / "old", tmp_path / "new"
    queued(old, [spec])
    record_run(old, spec, [0.9, 0.7, 0.5], "a" * 64)
    mirror(old, server.uri)
    (before,) = held(client, "legacy", spec.id)
    for key in ("gridrun.root_id", "gridrun.root"):  # as a mirror before root ids left it
        client.delete_tag(before.info.run_id, key)
    queued(new, [spec])
    record_run(new, spec, [0.8, 0.6, 0.4], "b" * 64)
    # the other root's cursor never named that run: it gets its own, and leaves that one be
    assert "1 new" in mirror(new, server.uri)
    untouched = client.get_run(before.info.run_id)
    assert "gridrun.root_id" not in untouched.data.tags
    assert untouched.data.tags["gridrun.weights_sha256"] == "a" * 64
    # its own root's cursor names it: found, tagged with the root, nothing made twice
    said = mirror(old, server.uri)
    assert "0 new, 0 metric points" in said, said
    assert client.get_run(before.info.run_id).data.tags["gridrun.root_id"] == root_id(old)
    assert len(held(client, "legacy", spec.id)) == 2
    assert difference(client, old, rows(old)) is None
    assert difference(client, new, rows(new)) is None


def test_a_store_rebuilt_with_another_root_id_goes_on_in_its_runs(tmp_path, server, client):
    from gridrun.checks.rebuild import rebuild

    spec = make_run(seed=0, experiment="rebuilt", threads=1)
    root = tmp_path / "runs"
    queued(root, [spec])
    record_run(root, spec, [0.9, 0.7], "a" * 64)
    mirror(root, server.uri)
    before = root_id(root)
    rebuild(root, force=True)  # a new store: another root id; its cursor remembers the first
    assert root_id(root) != before
    said = mirror(root, server.uri)
    assert "0 new, 0 metric points" in said, said
    (m,) = held(client, "rebuilt", spec.id)
    assert m.data.tags["gridrun.root_id"] == root_id(root)  # tagged again, with the new id
    assert difference(client, root, rows(root)) is None


def test_a_resume_on_another_device_count_leaves_no_stale_value(tmp_path, server, client):
    two = make_run(seed=0, experiment="resumed", reduce="invariant", devices=2, accumulate=2,
                   threads=1)
    one = make_run(seed=0, experiment="resumed", reduce="invariant", devices=1, accumulate=2,
                   threads=1)
    assert one.id == two.id  # under reduce = "invariant" the device count is not in the id
    root = tmp_path / "runs"
    queued(root, [two])
    first = attempt(1, 0, devices=2)
    record_run(root, two, [0.9, 0.7], "a" * 64, status=states.CANCELLED, attempts=[first],
               error="cancelled at step 4")
    mirror(root, server.uri)
    (m,) = held(client, "resumed", one.id)
    assert m.data.tags["gridrun.config.devices"] == "2" and m.data.tags["gridrun.env.devices"] == "2"
    assert m.data.tags["gridrun.error"] == "cancelled at step 4"
    queued(root, [one])  # cancelled on 2 devices, queued again on 1: it resumes
    record_run(root, one, [0.9, 0.7, 0.5], "b" * 64,
               attempts=[first, attempt(2, 4, devices=1, threads=2)])
    mirror(root, server.uri)
    (m,) = held(client, "resumed", one.id)
    assert "devices" not in m.data.params and "threads" not in m.data.params
    tags = m.data.tags
    assert "gridrun.error" not in tags  # the attempt that ended so is not this one
    assert (tags["gridrun.config.devices"], tags["gridrun.env.devices"],
            tags["gridrun.env.world_size"], tags["gridrun.env.threads"]) == ("1", "1", "1", "2")
    history = json.loads(tags["gridrun.attempt_history"])
    assert [(a["attempt"], a["from_step"], a["devices"]) for a in history] == [(1, 0, 2), (2, 4, 1)]
    assert difference(client, root, rows(root)) is None


def test_the_csv_and_mlflow_write_arrays_and_booleans_alike(tmp_path, server, client):
    spec = replace(make_run(seed=0, experiment="spelled", betas=[0.9, 0.999], nesterov=True,
                            threads=1), variant="")  # an experiment with nothing varying
    root = tmp_path / "runs"
    queued(root, [spec])
    record_run(root, spec, [0.9, 0.7], "a" * 64)
    mirror(root, server.uri)
    (m,) = held(client, "spelled", spec.id)
    out = tmp_path / "runs.csv"
    assert CliRunner().invoke(app, ["export", "-o", str(out), "--root", str(root)]).exit_code == 0
    with open(out, newline="") as f:
        (row,) = csv.DictReader(f)
    assert m.data.params["betas"] == row["betas"] == "[0.9, 0.999]"
    assert m.data.params["nesterov"] == row["nesterov"] == "true"
    shared = [k for k in m.data.params if k in row and row[k] != ""]
    assert len(shared) > 20 and {k: m.data.params[k] for k in shared} == {k: row[k] for k in shared}
    assert m.info.run_name == "spelled s0"  # nothing varies: its experiment names it


def test_follow_started_before_the_root_has_a_store_mirrors_its_first_runs(tmp_path, server,
                                                                           client):
    root = tmp_path / "runs"  # not made yet: the first `gridrun queue` makes it
    follower = MirrorProcess(root, server.uri)
    try:
        wait_for(lambda: "no store yet" in follower.stderr(), 60, what="the mirror to say so")
        spec = make_run(seed=0, experiment="first", threads=1)
        queued(root, [spec])
        record_run(root, spec, [0.9, 0.7], "a" * 64)
        wait_for(lambda: difference(client, root, rows(root)) is None,
                 what=lambda: f"the first run in MLflow: {difference(client, root, rows(root))}; "
                              f"the mirror said: {follower.stdout()}{follower.stderr()}")
    finally:
        assert follower.stop() == 0, follower.stderr()
    assert follower.stderr().count("no store yet") == 1, follower.stderr()
