"""One owner for a run's records, one fold over them: every view shows the same best.

A real run (the real worker and trainer) tracks a metric that the old guesses got
wrong; the interface's runs table (while the log grows, and once finished),
`gridrun compare`, analysis of a live run and summary.json must all agree.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gridrun.analysis import frames
from gridrun.cli import app
from gridrun.runs import layout, progress, records, runlog, states
from gridrun.runs.progress import Progress, fold
from gridrun.runs.records import Summary
from gridrun.runs.runlog import MetricsWriter
from gridrun.runs.store import Store
from gridrun.spec import TRAINER_KEYS, RunSpec, run_id, write_run_config
from gridrun.train import worker
from gridrun.tui.store_source import StoreSource


def run_spec(task: str, task_args: dict, **trainer) -> RunSpec:
    cfg = {k: key.default for k, key in TRAINER_KEYS.items()}
    cfg.update(epochs=4, batch_size=32, log_every=2, eval_every=4, **trainer)
    return RunSpec(id=run_id("exp", task, cfg, task_args, 0), experiment="exp", variant="",
                   seed=0, task=task, trainer=cfg, task_args=task_args, axes={})


def trained(root, run: RunSpec) -> tuple[list[dict], Summary]:
    """The run trained by the worker in ROOT/exp/ID; its metrics lines and summary."""
    layout.make_private_dir(root)
    folder = layout.make_run_dir(root, run.experiment, run.id)
    write_run_config(folder / layout.CONFIG, run)
    assert worker.main(folder) == states.EXIT_CODES[states.COMPLETED]
    summary = runlog.read_summary(folder / layout.SUMMARY)
    Summary.from_json(json.loads((folder / layout.SUMMARY).read_text()), strict=True)  # its shape
    return runlog.read_all(folder / layout.METRICS), summary


def compare_json(root) -> list[dict]:
    result = CliRunner().invoke(app, ["compare", "exp", "--format", "json", "--root", str(root)])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


CASES = {
    # the old live views took the first validation metric (loss) and a name's guess
    "accuracy": ("spirals", {"train_size": 256, "val_size": 64, "hidden": 16},
                 {"early_stop_metric": "accuracy"}),
    # declared "lower"; the guess maximises it
    "score": ("helper_tasks:scored", {"train_size": 128, "dim": 4}, {"lr": 0.02}),
}


@pytest.mark.parametrize("metric", list(CASES))
def test_every_view_shows_the_best_the_trainer_kept(tmp_path, metric):
    task, args, trainer = CASES[metric]
    run = run_spec(task, args, **trainer)
    lines, summary = trained(tmp_path / "done", run)
    assert summary.early_stop_metric == metric and summary.best_value is not None
    way = summary.metrics[metric]
    vals = [r[metric] for r in lines if r["split"] == records.VAL]
    assert len(set(vals)) > 1 and vals[-1] != vals[0]
    # the run's own best is not what a guess of the direction would pick
    assert summary.best_value == (min if way == "lower" else max)(vals)
    assert summary.best_value != (max if way == "lower" else min)(vals)
    start = lines[0]
    assert start["split"] == records.START and start["metrics"] == summary.metrics
    assert start["early_stop_metric"] == metric

    # the interface, while the run is live: its log grows line by line
    root = tmp_path / "live"
    with Store(root) as store:
        store.enqueue([run])
        store.transition(run.id, states.QUEUED, states.RUNNING, slot="cpu0", started_at=1.0)
    folder = layout.make_run_dir(root, run.experiment, run.id)
    write_run_config(folder / layout.CONFIG, run)
    src = StoreSource(root)
    src.poll()
    seen = []
    with MetricsWriter(folder / layout.METRICS) as w:
        for line in lines:
            w.write(line)
            row = {r.id: r for r in src.poll().runs}.get(run.id)
            if line["split"] == records.VAL:
                seen.append(line[metric])
                pick = min if way == "lower" else max
                assert (row.best_name, row.best) == (metric, pick(seen))
    assert row.best == summary.best_value and row.step == summary.step

    # analysis of the live run (no summary.json yet): the same fold
    frame = frames.runs_frame(root)
    assert frame.iloc[0][f"best_{metric}"] == summary.best_value
    assert frame.attrs["directions"][metric] == way

    # finished: the interface's row from the store, compare and summary.json
    with Store(root) as store:
        store.transition(run.id, states.RUNNING, states.COMPLETED, summary=summary.to_json(),
                         ended_at=2.0)
    row = {r.id: r for r in src.poll().runs}[run.id]
    assert (row.best_name, row.best) == (metric, summary.best_value)
    (table,) = compare_json(tmp_path / "done")
    assert table[f"{metric}_mean"] == pytest.approx(summary.best_value, rel=1e-9)  # JSON: 10 digits
    assert table[f"{metric}_best"]


# --------------------------------------------------------------------------- the fold

def log(*, declared: bool = True) -> list[dict]:
    start = {"t": 100.0, "step": 0, "epoch": 0, "split": "start", "total_steps": 40}
    if declared:
        start.update(metrics={"loss": "lower", "score": "lower"}, early_stop_metric="score")
    out = [start]
    for i, (loss, score) in enumerate([(0.9, 5.0), (0.7, 3.0), (0.8, 4.0), (0.6, None)], 1):
        step = 10 * i
        out.append({"t": 100.0 + 2 * step, "step": step, "epoch": i // 2, "split": "train",
                    "loss": loss + 0.1, "lr": 0.1, "samples_per_s": 100.0 * i, "step_time": 0.2})
        out.append({"t": 100.0 + 2 * step + 1, "step": step, "epoch": i // 2, "split": "val",
                    "loss": loss, "score": score})
    return out


def test_fold_incremental_is_one_shot():
    lines = log()
    whole = fold(lines)
    for cut in range(len(lines) + 1):
        assert fold(lines[cut:], previous=fold(lines[:cut])) == whole
    p = Progress()
    for line in lines:
        p = fold([line], previous=p)
    assert p == whole and fold([], previous=whole) is whole


def test_fold_follows_the_declared_direction_and_skips_non_finite_evaluations():
    p = fold(log())
    assert (p.step, p.epoch, p.total_steps, p.train_loss) == (40, 2, 40, pytest.approx(0.7))
    assert (p.metric, p.direction) == ("score", "lower")  # the guess says "higher" for score
    assert (p.best, p.best_step) == (3.0, 20)
    assert p.best_values == {"loss": 0.7, "score": 3.0}
    assert p.last == {"loss": 0.6, "score": None}  # a non-finite evaluation is shown, never best
    assert p.mean_samples_per_s == 250.0 and p.samples_per_s == 400.0
    assert records.metric_items(log()[1]) == {"loss": 1.0}


def test_fold_eta_from_the_pace():
    p = fold(log()[:5])  # train lines at steps 10 and 20, 20 s apart
    assert p.s_per_step == 2.0
    assert p.eta() == 40.0  # 20 steps left
    assert p.eta(now=p.t + 15) == 25.0 and p.eta(now=p.t + 100) == 0.0
    assert p.ends_at == p.t + 40.0
    assert p.fraction() == 0.5
    paused = {**log()[3], "t": 10_000.0, "step": 30}  # a stop and a resume: not the pace
    assert fold([paused], previous=p).s_per_step == 2.0
    assert fold(log()[:2]).eta() is None  # one log point: no pace yet


def test_an_old_log_without_declarations():
    old = log(declared=False)
    p = fold(old)
    assert (p.metric, p.direction, p.best) == ("loss", "lower", 0.7)  # the first metric, guessed
    # what the caller knows (an earlier summary, the config) seeds the fold
    earlier = Summary(metrics={"loss": "lower", "score": "lower"}, early_stop_metric="score",
                      total_steps=40)
    p = fold(old[1:], previous=Progress.known(earlier))
    assert (p.metric, p.best, p.total_steps) == ("score", 3.0, 40)
    p = fold(old, previous=Progress.known(early_stop_metric="score"))
    assert (p.metric, p.direction, p.best) == ("score", "higher", 5.0)  # guessed: nothing declared
    assert p.fraction() == 1.0 and fold(old[1:]).fraction(epochs=4) == 0.5


def test_the_start_line_is_read_as_untrusted():
    good = log()[0]
    assert records.record(dict(good)) == good
    bad = {**good, "metrics": {"score": "down", "loss": "lower", "x": 3}, "early_stop_metric": 7}
    got = records.record(bad)  # declarations of the wrong shape are dropped, the line kept
    assert got["metrics"] == {"loss": "lower"} and "early_stop_metric" not in got
    assert got["total_steps"] == 40
    assert records.record({**good, "split": "train"}) is None  # only a start line declares
    assert records.record({**good, "metrics": [1], "other": "x"}) is None
    assert fold([{**good, "metrics": "lower"}]).metrics == {}
    assert progress.fold([records.record({**good, "metrics": {"score": "higher"}})]).metrics == {
        "score": "higher"}
