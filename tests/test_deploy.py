"""Deploying a result: `gridrun.load_run` gives back the run's own numbers bit for bit;
`gridrun export-model` exports each built-in task to ONNX and torch.export, and its
parity check holds on batch sizes (and sort lengths) not seen at export, and catches
a model that computes something else once exported."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import gridrun
from gridrun.checks.verify import same
from gridrun.cli import app
from gridrun.deploy.model import DeployError, export_model
from gridrun.runs import layout, states
from gridrun.spec import TRAINER_KEYS, RunSpec, write_run_config
from gridrun.train import checkpoint, worker
from gridrun.train.loop.trainer import train

TINY = {
    "spirals": {"train_size": 256, "val_size": 300},  # two validation batches
    "shapes": {"train_size": 64, "val_size": 32},
    "sort": {"train_size": 128, "val_size": 64},
    "deploy_tasks:branchy": {},
}


def make_run(root: Path, task: str, run_id: str, task_args: dict | None = None) -> Path:
    cfg = {k: key.default for k, key in TRAINER_KEYS.items()}
    cfg.update(epochs=1, batch_size=32, lr=3e-3, log_every=4)
    run = RunSpec(id=run_id, experiment="deploy", variant="", seed=1, task=task, trainer=cfg,
                  task_args=TINY[task] if task_args is None else task_args, axes={})
    folder = layout.make_private_dir(root / "deploy" / run_id)
    write_run_config(folder / layout.CONFIG, run)
    summary = worker.json_safe(train(run, folder, log=lambda s: None))
    worker.write_summary(folder, summary)
    assert summary["status"] == states.COMPLETED, summary["error"]
    return folder


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("root")
    for i, task in enumerate(TINY):
        make_run(root, task, f"r{i}{task.split(':')[-1]}")
    return root


def folder_of(root: Path, task: str) -> Path:
    return next((root / "deploy").glob(f"*{task.split(':')[-1]}"))


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


# ---- load_run ------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["spirals", "shapes", "sort"])
def test_load_run_gives_the_recorded_metrics_bit_for_bit(root, task):
    run = gridrun.load_run(folder_of(root, task).name[:4], root=root)  # an id prefix
    assert run.spec.task == task and run.config["task"] == task
    for which, recorded in (("best", run.summary.best), ("last", run.summary.final)):
        got = run.evaluate(which)
        assert got.keys() == recorded.keys()
        assert all(same(got[k], recorded[k]) for k in got), (which, got, recorded)
    model = run.model()
    assert not model.training
    assert {"step", "split"} <= set(run.metrics.columns)
    assert set(run.metrics["split"]) >= {"train", "val"}


def test_load_run_names_what_is_missing(root, tmp_path):
    with pytest.raises(DeployError, match="no run under"):
        gridrun.load_run("zzz", root=root)
    folder = folder_of(root, "spirals")
    run = gridrun.load_run(folder)
    with pytest.raises(DeployError, match="'best' or 'last'"):
        run.model("middle")


# ---- export-model --------------------------------------------------------------------------


def _onnx_or_skip(fmt: str) -> None:
    if fmt == "onnx":
        for module in ("onnx", "onnxscript", "onnxruntime"):
            pytest.importorskip(module)


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
@pytest.mark.parametrize("task", ["spirals", "shapes", "sort"])
def test_each_task_exports_with_parity_on_unseen_shapes(root, task, fmt, tmp_path):
    _onnx_or_skip(fmt)
    out = tmp_path / f"model.{fmt}"
    result = invoke("export-model", str(folder_of(root, task)), "--format", fmt, "-o", str(out),
                    "--batches", "2")
    assert result.exit_code == 0, result.output
    assert "parity ok" in result.output and out.is_file()
    report = json.loads((tmp_path / "parity.json").read_text())
    assert report["ok"] and all(o["max_abs"] <= o["atol"] + 1e-3 for o in report["outputs"].values())
    seen, unseen = report["batches"][0]["inputs"], report["batches"][-1]["inputs"]
    assert report["batches"][-1]["batch"] == "unseen shape"
    for name in seen:
        assert unseen[name][0] != seen[name][0]  # a batch size not seen at export
        if task == "sort":
            assert unseen[name][1] != seen[name][1]  # nor a length
    assert report["metrics"]["pytorch"].keys() == report["metrics"][fmt].keys() == {"loss", "accuracy"}
    card = json.loads((tmp_path / "model.json").read_text())
    assert card["run_id"] == folder_of(root, task).name and card["task"] == task
    assert card["inputs"][0]["shape"][0] == "batch" and card["parity_ok"]
    assert card["versions"]["torch"] and card["versions"]["gridrun"] == gridrun.__version__
    assert card["metrics"] == json.loads((folder_of(root, task) / "summary.json").read_text())["best"]
    if task == "sort":
        assert [i["name"] for i in card["inputs"]] == ["x", "mask"]
        assert card["dynamic_dims"]["length"]["max"] == 12


def test_default_output_is_inside_the_run(root):
    folder = folder_of(root, "spirals")
    result = invoke("export-model", str(folder), "--format", "pt2", "--checkpoint", "last",
                    "--json", "--batches", "1")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{"):])
    assert report["checkpoint"] == "last" and report["export_s"] > 0 and report["train_s"] > 0
    assert (folder / "export" / "last" / "model.pt2").is_file()


def test_a_model_that_changes_once_exported_is_caught_by_parity(root, tmp_path):
    folder = folder_of(root, "deploy_tasks:branchy")
    result = invoke("export-model", str(folder), "--format", "torchscript",
                    "-o", str(tmp_path / "m.ts.pt"))
    assert result.exit_code == 1, result.output
    assert "PARITY FAILED" in result.output and "unseen shape" in result.output
    assert "Traceback" not in result.output
    assert not json.loads((tmp_path / "parity.json").read_text())["ok"]
    assert json.loads((tmp_path / "model.json").read_text())["parity_ok"] is False


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_a_data_dependent_branch_is_refused_in_a_sentence(root, tmp_path, fmt):
    _onnx_or_skip(fmt)
    result = invoke("export-model", str(folder_of(root, "deploy_tasks:branchy")), "--format", fmt,
                    "-o", str(tmp_path / f"m.{fmt}"))
    assert result.exit_code == 2, result.output
    assert f"cannot export to {fmt}" in result.output and "torch.cond" in result.output
    assert "Traceback" not in result.output and len(result.output.splitlines()) <= 5


def test_a_run_without_best_pt_says_so(root, tmp_path):
    folder = make_run(tmp_path, "spirals", "nobest")
    (folder / layout.CHECKPOINTS / checkpoint.BEST).unlink()
    result = invoke("export-model", str(folder), "--format", "pt2")
    assert result.exit_code == 2
    assert "has no checkpoints/best.pt" in result.output and "--checkpoint last" in result.output


def test_onnx_without_the_extra_gives_the_install_hint(root, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    with pytest.raises(DeployError, match=r"pip install 'gridrun\[export\]'"):
        export_model(gridrun.load_run(folder_of(root, "spirals")), fmt="onnx")


def test_tolerances_can_be_tightened(root, tmp_path):
    result = invoke("export-model", str(folder_of(root, "sort")), "--format", "pt2",
                    "-o", str(tmp_path / "m.pt2"), "--atol", "0", "--rtol", "0", "--batches", "1")
    report = json.loads((tmp_path / "parity.json").read_text())
    assert report["outputs"]["output"]["atol"] == 0
    assert result.exit_code == (0 if report["outputs"]["output"]["max_abs"] == 0 else 1)


def test_load_run_finds_a_run_by_id_through_the_store(root, tmp_path, monkeypatch):
    from gridrun.runs.store import Store
    from gridrun.spec import read_run_config

    spec = read_run_config(folder_of(root, "spirals") / layout.CONFIG)
    with Store(root) as store:
        store.enqueue([spec])
    monkeypatch.setenv("GRIDRUN_ROOT", str(root))
    run = gridrun.load_run(spec.id[:3])  # the default root is $GRIDRUN_ROOT
    assert run.folder == folder_of(root, "spirals") and run.summary.status == states.COMPLETED
    with pytest.raises(DeployError, match="zz"):
        gridrun.load_run("zz")


def test_the_interface_exports_through_a_subprocess(root):
    """StoreSource.export_model (the detail screen's `x`) runs `gridrun export-model --json`."""
    from gridrun.tui.store_source import StoreSource

    run_id = folder_of(root, "spirals").name  # queued in the store by the test above
    source = StoreSource(root)
    try:
        message = source.export_model(run_id)
    finally:
        source.store.close()
    assert message.startswith(f"exported {run_id} to ") and "parity ok" in message
    assert (folder_of(root, "spirals") / "export" / "best" / "parity.json").is_file()


def test_predict_on_a_one_logit_binary_model_thresholds_it(tmp_path):
    """Argmax over an axis of size 1 is always 0: a one-logit output is decided by its sign,
    or by 0.5 when model.json declares it a probability (its range 0..1)."""
    import numpy as np

    folder = make_run(tmp_path, "deploy_tasks:binary", "bin", {})
    out = tmp_path / "export"
    result = invoke("export-model", str(folder), "--format", "pt2", "-o", str(out / "model.pt2"),
                    "--batches", "1")
    assert result.exit_code == 0, result.output
    np.save(tmp_path / "x.npy", np.array([[3, 0], [-3, 0], [2, 1], [0.05, 0]], dtype=np.float32))
    found = json.loads(invoke("predict", str(out), str(tmp_path / "x.npy"), "--json").output)[0]
    logits = np.array(found["outputs"]["output"])[:, 0]
    assert logits[0] > 0 > logits[1]
    assert found["decisions"]["output"] == {"rule": "logit > 0", "values": (logits > 0).astype(int).tolist()}
    text = invoke("predict", str(out), str(tmp_path / "x.npy"))
    assert text.exit_code == 0, text.output
    assert "argmax" not in text.output
    expected = " ".join(str(int(v)) for v in logits > 0)
    assert f"  logit > 0 (one output): [{expected}]" in text.output.splitlines()
    card = json.loads((out / "model.json").read_text())
    card["outputs"][0]["range"] = [0, 1]
    (out / "model.json").write_text(json.dumps(card))
    text = invoke("predict", str(out), str(tmp_path / "x.npy"))
    expected = " ".join(str(int(v)) for v in logits > 0.5)
    assert f"  probability > 0.5 (one output): [{expected}]" in text.output.splitlines(), text.output
