"""What a run becomes in MLflow, without a server (gridrun/analysis/mlflow/records.py):
its name, which values are params and which are tags an attempt may change, and which
MLflow runs are this root's; the cursor, whatever its file holds (cursor.py); a tracking
URI as it is shown (uri.py); what a failed request means (client.py). The mirror
itself, against a real server and a hostile one: test_mirror_mlflow*.py,
test_mirror_hostile.py."""

from __future__ import annotations

import errno
import json
from dataclasses import asdict
from types import SimpleNamespace

import pytest

from gridrun.analysis.mlflow import records as mr
from gridrun.analysis.mlflow import uri as mu
from gridrun.analysis.mlflow.cursor import CURSOR, Cursor, Mirrored


def row(**fields):
    """A store row as the mirror reads it (the fields it uses)."""
    base = dict(id="a1b2c3d4e5", experiment="tricks", variant="", ablation="", seed=0,
                status="completed", attempt=1, error=None, adjustments=[],
                config={"task": "spirals", "trainer": {"lr": 0.001}, "task_args": {}})
    return SimpleNamespace(**{**base, **fields})


def test_a_run_with_no_variant_is_named_by_its_experiment_and_seed():
    assert mr.run_name(row()) == "tricks s0"
    assert mr.run_name(row(variant="lr=0.001", seed=2)) == "lr=0.001 s2"
    assert mr.run_name(row(variant="baseline", ablation="baseline")) == "baseline s0"


def test_an_mlflow_run_is_this_roots_by_its_root_tag_or_else_by_this_roots_cursor():
    mine = {"r00t", "rebuilt"}  # the store's id, and one from before a rebuild
    assert mr.owned({mr.ROOT_ID: "r00t"}, "m1", mine, None)
    assert mr.owned({mr.ROOT_ID: "rebuilt"}, "m1", mine, "m2")
    assert not mr.owned({mr.ROOT_ID: "other"}, "m1", mine, "m1")  # another root's, whatever is named
    # sent before runs carried their root: this root's only where its cursor names it
    assert mr.owned({}, "m1", mine, "m1")
    assert not mr.owned({}, "m1", mine, None) and not mr.owned({}, "m1", mine, "m2")


def test_params_never_change_between_attempts_and_what_an_attempt_may_change_is_tags():
    trainer = {"lr": 0.001, "batch_size": 32, "accumulate": 2, "devices": 1, "threads": "auto",
               "betas": [0.9, 0.999], "checkpoint_modules": []}
    oom = [{"kind": "oom", "t": 1.0, "batch_size": [64, 32], "accumulate": [1, 2]}]
    config = {"task": "spirals", "trainer": trainer, "task_args": {"hidden": 16}}
    params = mr.params_of(config, oom)
    # what the run id was made from: the batch as queued, before the retry halved it
    assert params == {"task": "spirals", "lr": "0.001", "batch_size": "64", "accumulate": "1",
                      "betas": "[0.9, 0.999]", "hidden": "16"}
    assert mr.config_tags(config, oom) == {
        "gridrun.config.batch_size": "32", "gridrun.config.accumulate": "2",
        "gridrun.config.devices": "1", "gridrun.config.threads": "auto",
        "gridrun.config.checkpoint_modules": "[]"}
    assert {"devices", "threads", "checkpoint_every", "num_workers"} <= mr.PER_ATTEMPT
    assert not {"lr", "batch_size", "reduce", "seed_init"} & mr.PER_ATTEMPT


def test_the_latest_attempt_is_tagged_and_the_history_kept_in_a_tag_mlflow_takes():
    from gridrun.runs.records import Summary

    def record(n: int, devices: int) -> dict:
        return {"attempt": n, "from_step": 4 * (n - 1), "started_at": 1.0 + n, "threads": 2,
                "devices": devices, "world_size": devices, "reduce": "ddp", "torch": "2.5.1",
                "device_type": "cpu", "changed": {}}

    summary = Summary.from_json({"attempts": [record(1, 2), record(2, 1)], "environment_changes": [
        {"field": "devices", "from": 2, "to": 1, "step": 4}]})
    tags = mr.attempt_tags(summary)
    assert (tags["gridrun.env.devices"], tags["gridrun.env.world_size"], tags["gridrun.attempts"],
            tags["gridrun.env.reduce"]) == ("1", "1", "2", "ddp")
    assert tags["gridrun.env_changes"] == "devices 2 -> 1 at step 4"
    assert '"devices":2' in tags["gridrun.attempt_history"]
    many = mr.attempt_tags(Summary.from_json({"attempts": [record(n, 1) for n in range(1, 200)]}))
    kept = json.loads(many["gridrun.attempt_history"])
    assert len(many["gridrun.attempt_history"]) <= mr.TAG_VALUE_MAX and kept[-1]["attempt"] == 199
    assert mr.attempt_tags(Summary.from_json({})) == {}  # a run from before attempts were kept


def test_the_cursor_keeps_the_root_ids_and_each_runs_tags(tmp_path):
    cursor = Cursor(tmp_path, "http://x")
    cursor.roots.append("r00t")
    cursor.runs["a1"] = Mirrored("m1", tags=["gridrun.error"])
    cursor.save()
    again, note = Cursor.load(tmp_path, "http://x")
    assert note is None and again.roots == ["r00t"] and again.runs["a1"].tags == ["gridrun.error"]
    assert Cursor.load(tmp_path, "http://y")[0].roots == []


GOOD = asdict(Mirrored("m1", offset=120, tail="ab" * 32, last={"train/loss": 4}, seq=3,
                       params=True, files={"config.toml": [10, 20]}, points=8,
                       tags=["gridrun.error"]))


@pytest.mark.parametrize("damage", [
    {"offset": float("inf")}, {"offset": float("nan")}, {"offset": -7}, {"offset": "120"},
    {"offset": 1.5}, {"offset": True}, {"offset": 10 ** 30}, {"offset": None},
    {"seq": float("inf")}, {"seq": -2}, {"last": {"train/loss": float("-inf")}},
    {"last": ["train/loss"]}, {"files": {"config.toml": [10]}},
    {"files": {"config.toml": ["10", 20]}}, {"points": -1}, {"tags": "gridrun.error"},
    {"tags": [3]}, {"mlflow": 7}, {"params": "yes"}, {"tail": 5}])
def test_a_damaged_cursor_value_reads_as_nothing_sent(tmp_path, damage):
    (tmp_path / CURSOR).write_text(json.dumps({"http://x": {
        "runs": {"a1": {**GOOD, **damage}, "b2": GOOD, "c3": "garbage"},
        "parents": {"s1": {"id": 5}, "s2": "m9"}, "roots": ["r00t", 3, None]}}))
    cursor, note = Cursor.load(tmp_path, "http://x")
    assert note is None
    assert cursor.runs["a1"] == Mirrored() and cursor.runs["c3"] == Mirrored()
    assert asdict(cursor.runs["b2"]) == GOOD  # the others as they were
    assert cursor.parents == {"s2": "m9"} and cursor.roots == ["r00t"]


def test_a_uri_is_shown_and_kept_without_its_credentials(tmp_path):
    assert mu.redacted("http://alice:pw@host:5000/x?token=abc&b=1") == \
        "http://***@host:5000/x?token=***&b=***"
    assert mu.redacted("https://T0KEN@host") == "https://***@host"
    for plain in ("http://127.0.0.1:5000", "sqlite:////tmp/x.db", "databricks", "/tmp/mlruns"):
        assert mu.redacted(plain) == plain
    assert mu.redacted("postgresql://u:p@db:5432/mlflow") == "postgresql://***@db:5432/mlflow"
    scrub = mu.Scrubber("http://alice:pa%24%24word@host:5000?token=t0ken9")
    said = scrub("API request to http://alice:pa%24%24word@host:5000?token=t0ken9/api/2.0/x "
                 "failed (auth pa$$word; https://bob:other@proxy:3128 ?api_key=k3y&run_id=r1)")
    assert said == "API request to http://***@host:5000?token=***/api/2.0/x failed (auth ***; " \
                   "https://***@proxy:3128 ?api_key=***&run_id=r1)"
    cursor = Cursor(tmp_path, "http://alice:pw@host:5000")
    cursor.save()
    assert json.loads((tmp_path / CURSOR).read_text()) == {
        "http://***@host:5000": {"runs": {}, "parents": {}, "roots": []}}


def test_where_a_local_store_writes():
    assert mu.local_store("sqlite:////etc/x.db") == (mu.Path("/etc/x.db"), False)
    assert mu.local_store("sqlite:///x.db") == (mu.Path("x.db"), False)
    assert mu.local_store("sqlite://") is None and mu.local_store("sqlite:///:memory:") is None
    assert mu.local_store("file:///tmp/ml%20runs") == (mu.Path("/tmp/ml runs"), True)
    assert mu.local_store("./mlruns") == (mu.Path("mlruns"), True)
    for server in ("http://h:5000", "https://h", "databricks", "postgresql://u@h/db"):
        assert mu.local_store(server) is None


def test_a_failed_request_is_said_as_what_it_is():
    pytest.importorskip("mlflow")
    from mlflow.exceptions import MlflowException, RestException

    from gridrun.analysis.mlflow import client as mc

    def raised(inner: BaseException, outer: BaseException) -> BaseException:
        try:
            try:
                raise inner
            except BaseException:
                raise outer  # noqa: B904 - MLflow wraps as this, its context kept
        except BaseException as e:
            return e

    assert mc.reason(RestException({"error_code": "INTERNAL_ERROR", "message": "boom"})) == \
        "HTTP 500 (Internal Server Error): INTERNAL_ERROR: boom"
    assert mc.reason(MlflowException(
        "API request to endpoint /api/2.0/mlflow/runs/search failed with error code 502 != 200. "
        "Response body: '<html><h1>Bad gateway</h1>\nnginx</html>'")) == \
        "HTTP 502 (Bad Gateway): Bad gateway"
    assert mc.reason(MlflowException("API request to http://h/api failed with exception "
                                      "HTTPConnectionPool(host='h', port=80): Max retries "
                                      "exceeded (Caused by ResponseError('too many 503 error "
                                      "responses'))")).startswith("HTTP 503 (Service Unavailable)")
    full = raised(OSError(errno.ENOSPC, "No space left on device"), MlflowException("copy failed"))
    assert mc.reason(full) == "the disk is full"
    assert mc.reason(MlflowException("(sqlite3.OperationalError) database or disk is full")) == \
        "the disk is full"
    assert mc.reason(MlflowException("API request to http://h/api failed with exception "
                                      "HTTPConnectionPool(host='h', port=80): Max retries exceeded "
                                      "(Caused by NewConnectionError('Connection refused'))")) == \
        "no answer (connection refused)"
