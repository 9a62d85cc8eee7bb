"""What a run becomes in MLflow, without a server (mlflow_records.py): its name, which
values are params and which are tags an attempt may change, and which MLflow runs are
this root's. The mirror itself, against a real server: test_mirror_mlflow*.py."""

from __future__ import annotations

from types import SimpleNamespace

from gridrun.analysis import mlflow_records as mr


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
