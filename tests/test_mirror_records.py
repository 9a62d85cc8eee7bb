"""What a run becomes in MLflow, without a server (gridrun/analysis/mlflow/records.py,
cursor.py): its name, which
values are params and which are tags an attempt may change, and which MLflow runs are
this root's. The mirror itself, against a real server: test_mirror_mlflow*.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

from gridrun.analysis.mlflow import records as mr
from gridrun.analysis.mlflow.cursor import Cursor, Mirrored


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
