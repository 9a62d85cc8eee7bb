"""Views agree with the records: one definition of `epoch` (epochs completed) in every
line, log line and summary; metric columns from the task's declared metrics as soon as
a run has started; derived metrics recorded, tracked, shown and compared like any other;
every metric column says what it holds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gridrun.checks.verify import verify
from gridrun.runs import layout, records, runlog
from gridrun.spec import load_runs, write_run_config
from gridrun.train import worker
from gridrun.train.trainer import train

CELL = """
[experiments.ep]
task = "spirals"
epochs = 3
train_size = 256
val_size = 64
batch_size = 64
log_every = 2
"""


def trained(tmp_path: Path, body: str = CELL) -> tuple[Path, dict, list[str]]:
    file = tmp_path / "e.toml"
    file.write_text(body)
    (run,) = load_runs(file)
    run_dir = tmp_path / run.experiment / run.id
    layout.make_private_dir(run_dir.parent)
    layout.make_private_dir(run_dir)
    write_run_config(run_dir / layout.CONFIG, run)
    printed: list[str] = []
    summary = worker.json_safe(train(run, run_dir, log=printed.append))
    worker.write_summary(run_dir, summary)
    return run_dir, summary, printed


def test_epoch_is_epochs_completed_in_every_line_the_log_and_the_summary(tmp_path):
    run_dir, summary, printed = trained(tmp_path)
    lines = runlog.read_all(run_dir / layout.METRICS)
    assert lines[0][records.SPLIT] == records.START
    by_step: dict[int, set[int]] = {}
    for line in lines[1:]:
        by_step.setdefault(line["step"], set()).add(line["epoch"])
    assert all(len(epochs) == 1 for epochs in by_step.values()), by_step
    per_epoch = summary["total_steps"] // 3
    # after an epoch's last step, one more epoch is complete; a step before, not yet
    assert by_step[per_epoch] == {1} and by_step[per_epoch - 1] == {0}
    assert by_step[summary["total_steps"]] == {3}
    assert summary["epoch"] == 3 == lines[-1]["epoch"]
    said = {int(m.group(1)): int(m.group(2)) for text in printed
            if (m := re.search(r"train step\s+(\d+)/\d+\s+epoch (\d+)", text))}
    assert said == {s: e for s, (e,) in by_step.items() if s in said} and said[per_epoch] == 1


def test_verify_accepts_a_log_written_with_the_epoch_in_progress(tmp_path):
    """Before this release a train line at an epoch's last step said the epoch it
    belonged to (one less than its val line): verify of such a run still passes."""
    run_dir, _, _ = trained(tmp_path)
    path = run_dir / layout.METRICS
    old = []
    for line in map(json.loads, path.read_text().splitlines()):
        if line["split"] == records.START:
            line.pop(records.FORMAT)
        elif line["split"] == records.TRAIN and line["step"] % 3 == 0:  # 3 steps an epoch
            line["epoch"] -= 1
        old.append(json.dumps(line))
    path.write_text("\n".join(old) + "\n")
    assert verify(run_dir)["ok"]
    # a real difference in the epoch still shows
    tampered = [json.loads(x) for x in old]
    tampered[1]["epoch"] += 5
    path.write_text("\n".join(map(json.dumps, tampered)) + "\n")
    result = verify(run_dir)
    assert not result["ok"] and result["difference"]["field"] == "epoch"


@pytest.fixture
def runner():
    return CliRunner()
