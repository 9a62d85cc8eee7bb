"""Every promise under the defaults (issue 44): a user's own task, in their own
folder, with no `threads` key, trained under `reduce = "invariant"` on 1 and 2 CPU
devices of this machine gives one weights hash and the same metrics lines;
cancelled on 2 devices and resumed on 1 it ends with that hash again. Four devices
add nothing the defaults decide over two ("auto" is one thread a process whatever
the device count; the invariant sum over 4 ranks is test_devices.py's), and a
resume that cannot keep a field deciding the bits is test_threads_on_resume.py's.

The task is a newcomer's: a GRU classifier with LayerNorm, BatchNorm and Dropout,
whose `__getitem__` masks tokens with Python's `random` and `torch.rand` (the
global generators: gridrun seeds them per batch).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_engine_kit import make_run, metrics_without_timing, prepare
from user_folder import user_package

from gridrun.runs import layout, states
from gridrun.spec import write_run_config

GRU_TASK = '''\
"""A GRU over token sequences: is the count of token 1 even? Tokens are masked at
random in __getitem__ (Python's random and torch.rand: the global generators)."""
import os
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from gridrun import Task


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, length, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(2, vocab, (n, length), generator=g)
        self.x[torch.rand(n, length, generator=g) < 0.2] = 1
        self.y = ((self.x == 1).sum(1) % 2).long()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i].clone()
        if random.random() < 0.5:  # augmentation: mask a tenth of the tokens
            x[torch.rand(len(x)) < 0.1] = 0
        return x, self.y[i]


class Classifier(nn.Module):
    def __init__(self, vocab, hidden):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.norm = nn.LayerNorm(hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.drop = nn.Dropout(0.2)
        self.out = nn.Linear(hidden, 2)

    def forward(self, x):
        h = self.gru(self.embed(x))[0].mean(1)
        return self.out(self.drop(self.bn(self.norm(h))))


def make(hidden: int = 32, train_size: int = 512, gate: str = "", at: int = 0):
    calls = [0]

    def loss(model, batch):
        calls[0] += 1
        if calls[0] == at and gate:  # the test stops the run here: GATE.reached, then GATE
            Path(f"{gate}.reached").touch()
            while not os.path.exists(gate):
                time.sleep(0.05)
        x, y = batch
        return F.cross_entropy(model(x), y)

    def evaluate(model, batch):
        x, y = batch
        logits = model(x)
        return {"loss": (F.cross_entropy(logits, y, reduction="sum"), y.numel()),
                "accuracy": ((logits.argmax(-1) == y).sum(), y.numel())}

    return Task(model=Classifier(12, hidden), train_data=Tokens(train_size, 24, 12, 0),
                val_data=Tokens(128, 24, 12, 1), loss=loss, evaluate=evaluate,
                metrics={"loss": "lower", "accuracy": "higher"})
'''
MACHINE = {"rss", "step_time"}  # wall-clock and machine fields of a metrics line
# 6 steps an epoch (micro-batches of 32, accumulate 4), 12 in all: the stop at step 5
# (each rank's 9th micro-batch on 2 devices) has an epoch's end and 7 steps after it
TRAIN_SIZE = 768


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The user's folder: their task package, the working directory of every process;
    one for the module, so its tests share the reference run on one device."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRIDRUN_LEDGER", str(tmp_path_factory.mktemp("ledger") / "gpu-ledger"))
        with user_package(tmp_path_factory.mktemp("lab"), mp, "grulab", {"gru": GRU_TASK}) as folder:
            yield folder


def cell(devices: int, experiment: str, **trainer):
    """The cell under the defaults: no `threads` key, only what the user chose."""
    args = {"hidden": 32, "train_size": TRAIN_SIZE,
            **{k: trainer.pop(k) for k in ("gate", "at") if k in trainer}}
    run = make_run("grulab.gru:make", experiment=experiment, task_args=args,
                   **{"epochs": 2, "batch_size": 32, "accumulate": 4, "log_every": 2,
                      "reduce": "invariant", "devices": devices, **trainer})
    assert run.trainer["threads"] == "auto"
    return run


def worker(run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gridrun.train.worker", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finished(run_dir: Path) -> str:
    proc = worker(run_dir)
    out, _ = proc.communicate()
    assert proc.returncode == 0, out
    return out


def summary(root: Path, run) -> dict:
    return json.loads((layout.run_dir(root, run.experiment, run.id) / layout.SUMMARY).read_text())


def lines(root: Path, run) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in MACHINE}
            for r in metrics_without_timing(root, run)]


@pytest.fixture(scope="module")
def alone(lab):
    """The cell trained on one device, start to end: what every other way must give."""
    run = cell(1, "d1")
    finished(prepare(lab / "runs", run))
    return run


def test_a_users_task_under_the_defaults_gives_one_hash_on_1_and_2_devices(lab, alone):
    root = lab / "runs"
    runs = [alone, cell(2, "d2")]
    assert len({cell(d, "same").id for d in (1, 2, 4)}) == 1  # devices is not in its id
    for run in runs[1:]:
        finished(prepare(root, run))
    assert len({summary(root, r)["weights_sha256"] for r in runs}) == 1
    one = lines(root, runs[0])
    assert sum(r.get("split") == "train" for r in one) >= 4 and any(r.get("split") == "val" for r in one)
    assert all(lines(root, r) == one for r in runs[1:])
    for run in runs:  # what the default resolved to, recorded attempt by attempt
        (attempt,) = summary(root, run)["attempts"]
        assert attempt["threads"] == 1 and attempt["world_size"] == run.trainer["devices"]
        assert summary(root, run)["environment_changes"] == []


def test_cancelled_on_2_devices_and_resumed_on_1_under_the_defaults_gives_the_same_hash(lab, alone):
    root = lab / "runs"
    # each rank's 9th micro-batch (step 5 on 2 ranks) waits at a gate: stopped there
    gate = lab / "gate"
    moved = cell(2, "moved", gate=str(gate), at=9, checkpoint_every=2)
    run_dir = prepare(root, moved)
    proc = worker(run_dir)
    while not Path(f"{gate}.reached").exists() and proc.poll() is None:  # bounded by its end
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    gate.touch()
    out, _ = proc.communicate()
    assert proc.returncode == states.EXIT_CODES[states.INTERRUPTED], out
    stopped_at = summary(root, moved)["step"]
    assert 4 <= stopped_at < summary(root, alone)["step"] - 4
    write_run_config(run_dir / layout.CONFIG, type(moved)(**{
        **moved.__dict__, "trainer": {**moved.trainer, "devices": 1}}))
    out = finished(run_dir)
    assert f"resumed from step {stopped_at}" in out and "another environment" not in out
    resumed = summary(root, moved)
    assert resumed["weights_sha256"] == summary(root, alone)["weights_sha256"]
    assert lines(root, moved) == lines(root, alone)
    first, second = resumed["attempts"]
    assert (first["world_size"], second["world_size"]) == (2, 1)
    assert first["threads"] == second["threads"] == 1 and second["from_step"] == stopped_at
    assert resumed["environment_changes"] == []  # invariant: the device count decides nothing
