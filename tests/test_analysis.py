"""Analysis on run folders written here: real config.toml, summary.json and metrics.jsonl.

Every number is checked against a hand computation (or scipy for the t quantile).
"""

import json
import math
import statistics

import pytest
from scipy import stats

from gridrun.analysis import ablation as analysis
from gridrun.analysis.ablation import ablation_table
from gridrun.analysis.frames import runs_frame
from gridrun.analysis.tables import format_table
from gridrun.runs import layout, records
from gridrun.runs.runlog import MetricsWriter
from gridrun.spec import TRAINER_KEYS, RunSpec, run_id, write_run_config

DIRS = {"loss": "lower", "accuracy": "higher"}


def make_run(root, experiment, seed, *, status="completed", best=None, final=None,
             ablation="", variant="", trainer=None, task_args=None, axes=None, log=None,
             summary=True, torn=False):
    """One run folder; `best`/`final` are {metric: value}; `log` is a list of metrics lines."""
    tr = {k: key.default for k, key in TRAINER_KEYS.items()} | (trainer or {})
    ta = {"hidden": 64} | (task_args or {})
    rid = run_id(experiment, "spirals", tr, ta, seed)
    spec = RunSpec(id=rid, experiment=experiment, variant=variant, seed=seed, task="spirals",
                   trainer=tr, task_args=ta, axes=axes or {}, ablation=ablation)
    folder = layout.make_private_dir(layout.run_dir(root, experiment, rid))
    write_run_config(folder / layout.CONFIG, spec)
    if log is not None:
        with MetricsWriter(folder / layout.METRICS) as w:
            for record in log:
                w.write(record)
        if torn:
            with open(folder / layout.METRICS, "ab") as f:
                f.write(b'{"t": 5, "step": 9, "split": "val", "loss": 0.0')
    if summary:
        (folder / layout.SUMMARY).write_text(json.dumps({
            "run_id": rid, "experiment": experiment, "variant": variant, "ablation": ablation,
            "seed": seed, "task": "spirals", "status": status, "step": 100, "epoch": 5,
            "total_steps": 100, "metrics": DIRS, "early_stop_metric": "loss",
            "final": final if final is not None else (best or {}), "best": best or {},
            "best_step": 80, "train_loss": 0.1, "samples_per_s": 1000.0 + seed,
            "tokens_per_s": None, "peak_memory_bytes": 1 << 20, "started_at": 1.0,
            "ended_at": 11.0, "wall_time_s": 10.0, "device": "cpu", "provenance": {"git_commit": "abc123"},
        }))
    return rid


GRID = {0.1: ([0.30, 0.32, 0.34], [0.96, 0.95, 0.97]),
        0.01: ([0.20, 0.25, 0.27], [0.90, 0.91, 0.89])}


def build_grid(tmp_path):
    for lr, (losses, accs) in GRID.items():
        for seed, (loss, acc) in enumerate(zip(losses, accs, strict=True)):
            make_run(tmp_path, "grid", seed, trainer={"lr": lr}, axes={"lr": lr},
                     variant=f"lr={lr}", best={"loss": loss, "accuracy": acc},
                     final={"loss": loss + 0.01, "accuracy": acc - 0.01})
    return tmp_path


ABL = {"baseline": ({}, [0.50, 0.52, 0.54]), "no-warmup": ({"warmup": 0.0}, [0.60, 0.58, 0.62, 0.61]),
       "sgd": ({"optimizer": "sgd"}, [0.40])}


def build_abl(tmp_path):
    for name, (trainer, losses) in ABL.items():
        for seed, loss in enumerate(losses):
            make_run(tmp_path, "abl", seed, trainer={"warmup": 0.05} | trainer, ablation=name,
                     variant=name, best={"loss": loss, "accuracy": 1 - loss})
    make_run(tmp_path, "abl", 7, trainer={"optimizer": "sgd"}, ablation="sgd", variant="sgd",
             status="failed")
    return tmp_path


@pytest.fixture
def grid_root(tmp_path):
    return build_grid(tmp_path)


@pytest.fixture
def abl_root(tmp_path):
    return build_abl(tmp_path)


def test_runs_frame_one_row_per_run_with_config_and_metrics(grid_root):
    frame = runs_frame(grid_root)
    assert len(frame) == 6
    assert {"id", "experiment", "variant", "ablation", "seed", "status", "lr", "hidden", "optimizer",
            "best_loss", "final_accuracy", "samples_per_s", "peak_memory_bytes", "wall_time_s",
            "git_commit"} <= set(frame.columns)
    assert frame.attrs["directions"] == DIRS
    assert set(frame["status"]) == {"completed"}
    assert frame.attrs["metrics"] == ["loss", "accuracy"] or set(frame.attrs["metrics"]) == set(DIRS)


def test_grouped_by_the_varying_axis_only_with_hand_numbers(grid_root):
    table = ablation_table(runs_frame(grid_root))
    assert table.attrs["keys"] == ["lr"]  # hidden is constant, seed never a key
    assert list(table["lr"]) == [0.01, 0.1]
    for lr, (losses, accs) in GRID.items():
        row = table[table["lr"] == lr].iloc[0]
        assert row["n"] == 3 and row["seeds"] == "3"
        mean, sd = sum(losses) / 3, statistics.stdev(losses)
        assert row["loss_mean"] == pytest.approx(mean)
        assert row["loss_std"] == pytest.approx(sd)
        # t(0.975, 2 dof) = 4.302652729911275 (printed tables)
        assert row["loss_ci95"] == pytest.approx(4.302652729911275 * sd / math.sqrt(3))
        assert (row["loss_min"], row["loss_max"]) == (min(losses), max(losses))
        assert row["accuracy_mean"] == pytest.approx(sum(accs) / 3)
    # direction-aware: lowest loss at lr=0.01, highest accuracy at lr=0.1
    assert list(table["loss_best"]) == [True, False]
    assert list(table["accuracy_best"]) == [False, True]
    assert "loss_delta" not in table


def test_final_values_on_request(grid_root):
    table = ablation_table(runs_frame(grid_root), final=True, metric="loss")
    row = table[table["lr"] == 0.1].iloc[0]
    assert row["loss_mean"] == pytest.approx(0.32 + 0.01)
    assert "accuracy_mean" not in table


def test_group_by_given_keys_never_by_seed(grid_root):
    frame = runs_frame(grid_root)
    table = ablation_table(frame, by=["hidden"])
    assert len(table) == 1 and table.iloc[0]["n"] == 6
    with pytest.raises(analysis.AnalysisError, match="seed"):
        ablation_table(frame, by=["seed"])
    with pytest.raises(analysis.AnalysisError, match="no column 'nope'"):
        ablation_table(frame, by=["nope"])
    with pytest.raises(analysis.AnalysisError, match="there are: grid"):
        ablation_table(frame, experiment="other")
    with pytest.raises(analysis.AnalysisError, match="loss, accuracy"):
        ablation_table(frame, metric="bleu")


def test_ablation_delta_and_welch_p_against_hand_formula(abl_root):
    table = ablation_table(runs_frame(abl_root), "abl", metric="loss")
    assert table.attrs["keys"] == ["ablation"]
    assert table["ablation"].iloc[0] == "baseline"
    rows = table.set_index("ablation")
    base, nw = ABL["baseline"][1], ABL["no-warmup"][1]
    delta = statistics.mean(nw) - statistics.mean(base)
    assert rows.loc["no-warmup", "loss_delta"] == pytest.approx(delta)
    assert rows.loc["no-warmup", "loss_delta_rel"] == pytest.approx(delta / statistics.mean(base))
    # Welch by hand: t = d / sqrt(s1²/n1 + s2²/n2), Welch–Satterthwaite dof
    v1, v2 = statistics.variance(nw) / 4, statistics.variance(base) / 3
    t = delta / math.sqrt(v1 + v2)
    dof = (v1 + v2) ** 2 / (v1**2 / 3 + v2**2 / 2)
    p = 2 * stats.t.sf(abs(t), dof)
    assert rows.loc["no-warmup", "loss_p"] == pytest.approx(p)
    assert rows.loc["no-warmup", "loss_p"] == pytest.approx(
        stats.ttest_ind(nw, base, equal_var=False).pvalue)
    # one seed: a delta but no p-value; the failed seed is counted apart
    assert rows.loc["sgd", "loss_delta"] == pytest.approx(0.40 - statistics.mean(base))
    assert math.isnan(rows.loc["sgd", "loss_p"]) and math.isnan(rows.loc["sgd", "loss_std"])
    assert (rows.loc["sgd", "n"], rows.loc["sgd", "failed"], rows.loc["sgd", "runs"]) == (1, 1, 2)
    assert math.isnan(rows.loc["baseline", "loss_delta"])
    assert rows.loc["sgd", "loss_best"] and not rows.loc["baseline", "loss_best"]


def test_runs_still_going_show_k_of_n_and_never_crash(tmp_path):
    for seed, loss in enumerate([0.3, 0.5]):
        make_run(tmp_path, "live", seed, best={"loss": loss, "accuracy": 0.9})
    log = [{"t": 1, "step": 10, "epoch": 0, "split": "train", "loss": 0.9, "lr": 0.1,
            "samples_per_s": 100.0, "step_time": 0.01},
           {"t": 2, "step": 10, "epoch": 0, "split": "val", "loss": 0.7, "accuracy": 0.6},
           {"t": 3, "step": 20, "epoch": 1, "split": "val", "loss": 0.8, "accuracy": 0.7}]
    running = make_run(tmp_path, "live", 2, summary=False, log=log, torn=True)
    queued = make_run(tmp_path, "live", 3, summary=False)
    empty = make_run(tmp_path, "live", 4, summary=False, log=[])
    (tmp_path / "live" / "not-a-run").mkdir()
    broken = tmp_path / "live" / "broken"
    broken.mkdir()
    (broken / layout.CONFIG).write_text("id = [")
    frame = runs_frame(tmp_path).set_index("id")
    assert frame.attrs["skipped"] == [str(broken)]
    assert frame.loc[running, "status"] == "running"
    assert frame.loc[running, "final_loss"] == 0.8 and frame.loc[running, "final_accuracy"] == 0.7
    assert frame.loc[running, "best_loss"] == 0.7  # the best by the first metric, lower
    assert frame.loc[running, "train_loss"] == 0.9
    assert frame.loc[queued, "status"] == "queued" and frame.loc[empty, "status"] == "running"
    table = ablation_table(runs_frame(tmp_path))
    row = table.iloc[0]
    assert (row["seeds"], row["n"], row["pending"]) == ("2/5", 2, 3)
    assert row["loss_mean"] == pytest.approx(0.4)  # only finished seeds count
    assert "2/5" in format_table(table, "table")
    # the store's states win over the files
    statuses = {running: "failed"}
    assert runs_frame(tmp_path, statuses).set_index("id").loc[running, "status"] == "failed"


def test_no_runs_at_all(tmp_path):
    frame = runs_frame(tmp_path / "missing")
    assert frame.empty
    with pytest.raises(analysis.AnalysisError, match="no runs"):
        ablation_table(frame)


def test_queued_runs_from_the_store_without_a_folder(grid_root):
    spec = RunSpec(id="q1", experiment="grid", variant="lr=0.1", seed=9, task="spirals",
                   trainer={k: key.default for k, key in TRAINER_KEYS.items()} | {"lr": 0.1},
                   task_args={"hidden": 64}, axes={"lr": 0.1})
    frame = runs_frame(grid_root, {"q1": "queued"}, queued=[spec],
                       provenance={"q1": {"commit": "f00", "dirty": True}})
    assert frame.set_index("id").loc["q1", "git_dirty"]
    row = ablation_table(frame).set_index("lr").loc[0.1]
    assert row["seeds"] == "3/4"


def test_default_directions():
    assert records.direction("val_loss") == "lower"
    assert records.direction("top1_error") == "lower"
    assert records.direction("accuracy") == "higher"


def test_identical_seeds_give_no_p_value_and_no_warning(tmp_path):
    """Seeds that agree exactly (accuracy 1/3 on every seed of both sides) have no
    Welch p-value; scipy's precision-loss RuntimeWarning never reaches the user."""
    import warnings

    for name, trainer in (("baseline", {}), ("sgd", {"optimizer": "sgd"})):
        for seed in (0, 1):
            make_run(tmp_path, "same", seed, trainer=trainer, ablation=name, variant=name,
                     best={"loss": 1.1 + seed * 1e-4, "accuracy": 1 / 3})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = ablation_table(runs_frame(tmp_path), "same").set_index("ablation")
    assert math.isnan(table.loc["sgd", "accuracy_p"])
    assert table.loc["sgd", "accuracy_delta"] == 0


def test_a_run_whose_tracked_metric_was_never_finite_shows_its_last_values(tmp_path):
    """No best evaluation (its early-stop metric NaN at each): compare shows the finite
    values of its last evaluation, said in a note, instead of dashes."""
    make_run(tmp_path, "nan", 0, best={}, final={"loss": 0.5, "accuracy": 0.75, "f1": None})
    make_run(tmp_path, "nan", 1, best={"loss": 0.25, "accuracy": 0.5}, final={"loss": 0.3})
    frame = runs_frame(tmp_path)
    table = ablation_table(frame)
    assert table["loss_mean"].iloc[0] == pytest.approx((0.5 + 0.25) / 2)
    assert table["accuracy_mean"].iloc[0] == pytest.approx((0.75 + 0.5) / 2)
    (note,) = [n for n in frame.attrs["notes"] if "never finite" in n]
    assert note.startswith("1 run ") and "last evaluation's values" in note
    assert frame.set_index("seed").loc[0, "stand_in"] == "final"
