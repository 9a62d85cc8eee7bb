"""Budgets that hold (issue 36): `gridrun tune-loader --seconds` and the `num_workers =
"auto"` probe stop at their budget whatever the dataset does, a hang in the training
process or only in DataLoader workers included; a probe that times out says so in one
line and takes the safe choice (0 workers).

Every command runs in a process of its own session, killed with its group at the end
whatever happened, and is given a generous multiple of its budget: a test says that it
returned and what it said, never how fast."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import patience
import pytest

RETURNS_WITHIN = 60  # seconds, for a budget of 1: returned, however slow the machine

PROBE = """
import json, torch
from data_helpers import Blocks
from helper_tasks import augmented, mix_collate
from gridrun.train import loader_probe
cfg = {{"batch_size": 16, "num_workers": "auto", "pin_memory": "auto", "prefetch_factor": 2,
        "persistent_workers": False, "accumulate": 1}}
data = Blocks(augmented(train_size=256).train_data, where={where!r})
record = loader_probe.probe(data, cfg, seed=0, collate_fn=mix_collate, device=torch.device("cpu"),
                            total_samples=10**6, budget_s={budget})
print(json.dumps(record))
"""

SPEC = """
[experiments.hang]
task = "data_helpers:blocking"
where = "{where}"
train_size = 128
val_size = 32
batch_size = 16
epochs = 1
log_every = 4
num_workers = "auto"
"""


def run(args: list[str], cwd: Path, timeout: float = RETURNS_WITHIN) -> subprocess.CompletedProcess:
    """`args` to its end, or killed with everything it started after `timeout` seconds
    (a failed test, not a hung one)."""
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = patience.communicate(proc, timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s: {' '.join(args[:4])} ...")
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its DataLoader workers, a probe's process
        proc.wait()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.mark.parametrize("where", ["main", "workers"])
def test_the_probe_stops_at_its_budget_when_the_dataset_hangs(tmp_path, where):
    done = run([sys.executable, "-c", PROBE.format(where=where, budget=1.0)], tmp_path)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout.splitlines()[-1])
    assert record["chosen"]["num_workers"] == 0  # the safe choice
    assert record["timed_out"] and "timed out" in record["reason"], record["reason"]
    hung = [t for t in record["trials"] if t["timed_out"]]
    assert len(hung) == 1 and (hung[0]["num_workers"] == 0) == (where == "main")
    assert "gave no batch" in hung[0]["error"]


@pytest.mark.parametrize("where", ["main", "workers"])
def test_tune_loader_stops_at_its_budget_and_says_so(tmp_path, where):
    spec = tmp_path / "exp.toml"
    spec.write_text(SPEC.format(where=where))
    done = run([sys.executable, "-m", "gridrun", "tune-loader", str(spec), "--seconds", "1"],
               tmp_path)
    assert done.returncode == 1, (done.stdout, done.stderr)
    said = done.stderr.strip().splitlines()
    assert len(said) == 1 and "timed out" in said[0] and "Traceback" not in done.stderr, said
    assert "stopped at its budget" in said[0]
    assert done.stdout.splitlines()[-1].startswith("choice: num_workers = 0")
    assert "   timed out   " in done.stdout  # the hung trial's row of the table


def test_an_auto_run_whose_dataset_hangs_in_workers_trains_with_none(tmp_path):
    """The probe times out on the workers, says so in one line, and the run trains with 0."""
    spec = tmp_path / "exp.toml"  # 1,024 samples at 2 ms: worth probing (more than its floor)
    spec.write_text(SPEC.format(where="workers").replace("train_size = 128", "train_size = 512\n"
                                                         "sleep = 0.002\nepochs = 2")
                    .replace("epochs = 1\n", ""))
    root = tmp_path / "runs"
    done = run([sys.executable, "-m", "gridrun", "train", str(spec), "--root", str(root)],
               tmp_path, timeout=2 * RETURNS_WITHIN)
    assert done.returncode == 0, (done.stdout, done.stderr)
    printed = (done.stdout + done.stderr).splitlines()
    told = [line for line in printed if "timed out" in line]
    assert len(told) == 1 and told[0].startswith("warning: num_workers = \"auto\""), printed
    (summary,) = root.glob("hang/*/summary.json")
    recorded = json.loads(summary.read_text())
    loader = recorded["environment"]["loader"]
    assert loader["chosen"]["num_workers"] == 0 and loader["timed_out"]
    assert [w for w in recorded["warnings"] if "timed out" in w] == [told[0].removeprefix("warning: ")]
