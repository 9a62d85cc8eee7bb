"""Views agree with the records: one definition of `epoch` (epochs completed) in every
line, log line and summary; metric columns from the task's declared metrics as soon as
a run has started; derived metrics recorded, tracked, shown and compared like any other;
every metric column says what it holds."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gridrun.checks.verify import verify
from gridrun.cli import app
from gridrun.runs import layout, records, runlog
from gridrun.spec import load_runs, write_run_config
from gridrun.train import worker
from gridrun.train.loop.trainer import train

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


PERPLEXITY = """
[experiments.lm]
task = "helper_tasks:perplexity"
epochs = 4
batch_size = 32
lr = 0.01
early_stop_metric = "perplexity"
seeds = 2
"""


@pytest.fixture(scope="module")
def lm_root(tmp_path_factory, backend):
    """Two seeds of a task that reports its loss and a derived perplexity, tracked by
    perplexity, trained by the engine."""
    from test_engine_kit import drain, engine_for

    from gridrun.runs.store import Store

    root = tmp_path_factory.mktemp("lm")
    file = root.parent / f"{root.name}.toml"
    file.write_text(PERPLEXITY)
    runs = load_runs(file)
    with Store(root) as store:
        store.enqueue(runs)
        drain(engine_for(root, backend))
        assert {r.status for r in store.list_runs()} == {"completed"}
    return root, runs


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_a_derived_metric_is_recorded_and_tracked_for_early_stopping(lm_root):
    root, runs = lm_root
    for run in runs:
        run_dir = layout.run_dir(root, run.experiment, run.id)
        lines = runlog.read_all(run_dir / layout.METRICS)
        assert lines[0][records.METRICS] == {"loss": "lower", "perplexity": "lower"}
        vals = [x for x in lines if x["split"] == records.VAL]
        assert vals and all(x["perplexity"] == math.exp(x["loss"]) for x in vals)
        summary = json.loads((run_dir / layout.SUMMARY).read_text())
        assert summary["early_stop_metric"] == "perplexity"
        best = min(vals, key=lambda x: x["perplexity"])
        assert summary["best_step"] == best["step"]
        assert summary["best"] == {"loss": best["loss"], "perplexity": best["perplexity"]}
        assert summary["own_best"] == {"loss": min(x["loss"] for x in vals),
                                       "perplexity": best["perplexity"]}


def test_a_derived_metric_shows_in_ls_compare_and_csv(lm_root, tmp_path):
    root, _ = lm_root
    listed = cli("ls", "--root", str(root))
    assert listed.count("perplexity↓ ") == 2
    table = cli("compare", "--root", str(root))
    header = table.splitlines()[0]
    assert "loss ↓ at best perplexity" in header and "perplexity ↓" in header
    assert "evaluation with the best perplexity" in table
    csv_text = cli("compare", "--root", str(root), "--format", "csv")
    assert "perplexity_mean" in csv_text.splitlines()[0]
    out = tmp_path / "runs.csv"
    cli("export", "--root", str(root), "-o", str(out))
    head = out.read_text().splitlines()[0].split(",")
    assert {"best_perplexity", "final_perplexity", "own_perplexity"} <= set(head)


def test_the_interface_tracks_the_derived_metric(lm_root):
    from gridrun.tui.store_source import StoreSource

    root, runs = lm_root
    rows = {r.id: r for r in StoreSource(root).poll().runs}
    for run in runs:
        row = rows[run.id]
        summary = json.loads((layout.run_dir(root, run.experiment, run.id)
                              / layout.SUMMARY).read_text())
        assert (row.best_name, row.best_direction) == ("perplexity", "lower")
        assert row.best == summary["best"]["perplexity"]


def test_own_best_is_each_metrics_own_best_and_says_so(lm_root):
    root, runs = lm_root
    table = cli("compare", "--root", str(root), "--own-best", "--format", "json")
    (row,) = json.loads(table)
    owns = [json.loads((layout.run_dir(root, r.experiment, r.id) / layout.SUMMARY).read_text())
            ["own_best"]["loss"] for r in runs]
    assert row["loss_mean"] == pytest.approx(sum(owns) / 2)
    text = cli("compare", "--root", str(root), "--own-best")
    assert "each metric's own best validation value" in text
    assert "at best" not in text.splitlines()[0]


def test_metric_columns_come_from_the_start_line_before_any_evaluation(tmp_path):
    """A language model reporting loss and bits per character: while its first run has
    only its start line, compare shows exactly those columns (bpc lower is better)."""
    from gridrun.runs.runlog import MetricsWriter
    from gridrun.runs.store import Store

    file = tmp_path / "e.toml"
    file.write_text(PERPLEXITY.replace("seeds = 2", "seeds = 1"))
    (run,) = load_runs(file)
    root = tmp_path / "runs"
    with Store(root) as store:
        store.enqueue([run])
        store.transition(run.id, "queued", "running", slot="cpu0", started_at=1.0)
    folder = layout.make_private_dir(layout.run_dir(root, run.experiment, run.id))
    with MetricsWriter(folder / layout.METRICS) as w:
        w.write(records.start_line(1.0, 40, {"loss": "lower", "bpc": "lower"}, "loss"))
        w.write({"t": 2, "step": 10, "epoch": 0, "split": "train", "loss": 2.5, "lr": 0.01,
                 "samples_per_s": 900.0, "step_time": 0.01})
    header = cli("compare", "--root", str(root)).splitlines()[0]
    assert "loss ↓" in header and "bpc ↓" in header and "accuracy" not in header
