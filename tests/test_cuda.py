"""CUDA-only checks: skipped cleanly on machines without a GPU."""

import pytest
import torch

from gridrun.runs import layout, records, runlog, states
from gridrun.spec import TRAINER_KEYS, RunSpec
from gridrun.train import checkpoint
from gridrun.train.loop.trainer import train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
TIMING = records.TIMING  # what differs between identical replays


def run(precision: str, task: str = "shapes") -> RunSpec:
    cfg = {k: key.default for k, key in TRAINER_KEYS.items()}
    cfg.update(epochs=2, batch_size=32, precision=precision, checkpoint_every=4, log_every=2)
    return RunSpec(id="c", experiment="cuda", variant="", seed=0, task=task, trainer=cfg,
                   task_args={"train_size": 256, "val_size": 64}, axes={})


def lines(d):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in runlog.read_all(d / layout.METRICS)]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_deterministic_on_cuda(tmp_path, precision):
    a = train(run(precision), tmp_path / "a", log=lambda s: None)
    b = train(run(precision), tmp_path / "b", log=lambda s: None)
    assert a["status"] == b["status"] == states.COMPLETED, a["error"]
    assert a["precision"] == precision and a["device"] != "cpu"
    assert lines(tmp_path / "a") == lines(tmp_path / "b")


def test_checkpoint_holds_cuda_rng_and_scaler(tmp_path):
    train(run("fp16"), tmp_path, log=lambda s: None)
    state = checkpoint.load(tmp_path / layout.CHECKPOINTS / "last.pt", "cuda")
    assert "cuda" in state["rng"] and state["scaler"]["scale"] > 0


def test_auto_precision_is_bf16_where_supported(tmp_path):
    s = train(run("auto", "spirals"), tmp_path, log=lambda s: None)
    assert s["precision"] == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")
