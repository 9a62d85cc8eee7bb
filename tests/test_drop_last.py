"""`drop_last`: the training loader leaves out an epoch's last partial batch (the
default, as every run did before the key), or trains on it with `drop_last = false`,
which is part of the run id; validation never drops."""

from __future__ import annotations

from gridrun.spec import load_runs
from gridrun.train.loop.trainer import train

CELL = """
[experiments.d]
task = "spirals"
epochs = 2
train_size = 100
val_size = 40
batch_size = 32
log_every = 1
"""


def test_drop_last_is_the_default_and_only_false_changes_the_run_id(tmp_path):
    file = tmp_path / "e.toml"
    file.write_text(CELL)
    (default,) = load_runs(file)
    file.write_text(CELL + "drop_last = true\n")
    (explicit,) = load_runs(file)
    file.write_text(CELL + "drop_last = false\n")
    (kept,) = load_runs(file)
    assert default.trainer["drop_last"] is True and default.id == explicit.id
    assert kept.id != default.id


def test_the_last_partial_batch_trains_with_drop_last_false(tmp_path):
    file = tmp_path / "e.toml"
    steps = {}
    for drop in ("true", "false"):
        file.write_text(CELL + f"drop_last = {drop}\n")
        (run,) = load_runs(file)
        samples = []
        summary = train(run, tmp_path / drop, log=samples.append)
        assert summary["status"] == "completed", summary.get("error")
        steps[drop] = summary["total_steps"]
    assert steps == {"true": 2 * 3, "false": 2 * 4}  # 100 samples: 3 whole batches + 4 left
