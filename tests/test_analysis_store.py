"""Analysis from the store: the same frame and table as the folders give, with no
file of an ended run read; one experiment read alone; the compare screen's
incremental refresh; one cell formatter for `gridrun compare` and the interface."""

import json
import time

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from test_analysis import build_abl, build_grid, make_run
from typer.testing import CliRunner

from gridrun.analysis import ablation as analysis
from gridrun.analysis import frames, tables
from gridrun.cli import app
from gridrun.runs import layout, runlog
from gridrun.runs.store import Store
from gridrun.spec import read_run_config
from gridrun.tui.store_source import StoreSource
from gridrun.tui.store_tables import named


def to_store(root, *, running=()):
    """The store the engine would have left for the run folders under `root`: each
    run with its summary.json in its row (sorted keys, as the store writes JSON)."""
    folders = sorted(p for p in root.glob("*/*") if (p / layout.CONFIG).is_file())
    specs = [read_run_config(f / layout.CONFIG) for f in folders]
    with Store(root) as store:
        store.enqueue(specs, provenance={"commit": "f00", "dirty": False})
        for folder, spec in zip(folders, specs, strict=True):
            if spec.id in running:
                store.transition(spec.id, "queued", "running", slot="cpu0", started_at=1.0)
                continue
            summary = runlog.read_summary(folder / layout.SUMMARY)
            if summary is not None:
                store.transition(spec.id, "queued", summary.status, summary=summary.to_json(),
                                 started_at=1.0, ended_at=11.0)
    return root


def folder_frame(root, experiment=None):
    """What the folders alone give, with the store's states and provenance (the old way)."""
    with Store(root) as store:
        runs = store.list_runs()
    return frames.runs_frame(root, {r.id: r.status for r in runs},
                               provenance={r.id: r.provenance for r in runs})


@pytest.fixture
def counted_reads(monkeypatch):
    """Every summary.json and metrics log a reader opens."""
    opened = []
    read_summary, read = runlog.read_summary, runlog.read

    def summary(path):
        opened.append(str(path))
        return read_summary(path)

    def metrics(path, offset=0):
        opened.append(str(path))
        return read(path, offset)

    monkeypatch.setattr(runlog, "read_summary", summary)
    monkeypatch.setattr(runlog, "read", metrics)
    return opened


@pytest.mark.parametrize("build", [build_grid, build_abl])
def test_the_store_gives_the_folders_frame_and_table(tmp_path, build):
    root = to_store(build(tmp_path))
    old, new = folder_frame(root), frames.load_frame(root)
    pd.testing.assert_frame_equal(old, new)
    assert old.attrs == new.attrs
    for fmt in tables.FORMATS:
        assert tables.format_table(analysis.ablation_table(old), fmt) == \
            tables.format_table(analysis.ablation_table(new), fmt)


def test_ended_runs_cost_no_file_but_one_summary_for_the_metric_order(tmp_path, counted_reads):
    root = to_store(build_grid(tmp_path))
    counted_reads.clear()
    frame = frames.load_frame(root)
    assert len(frame) == 6
    assert len(counted_reads) == 1  # one summary.json: the order the task gave its metrics
    assert frame.attrs["metrics"] == ["loss", "accuracy"]  # not the store's sorted keys
    for folder in root.glob("grid/*"):
        (folder / layout.SUMMARY).unlink()  # the rows alone still tell everything
    assert frames.load_frame(root)["best_loss"].notna().all()


def test_one_experiment_reads_nothing_of_the_others(tmp_path, counted_reads):
    build_grid(tmp_path)
    build_abl(tmp_path)
    log = [{"t": 1, "step": 10, "epoch": 0, "split": "val", "loss": 0.7, "accuracy": 0.6}]
    live = make_run(tmp_path, "abl", 9, summary=False, log=log, ablation="baseline")
    root = to_store(tmp_path, running={live})
    counted_reads.clear()
    frame = frames.load_frame(root, "grid")
    assert set(frame["experiment"]) == {"grid"} and len(frame) == 6
    assert not [p for p in counted_reads if "/abl/" in p]
    abl = frames.load_frame(root, "abl").set_index("id")
    assert abl.loc[live, "status"] == "running" and abl.loc[live, "best_loss"] == 0.7
    assert str(root / "abl" / live / layout.METRICS) in counted_reads  # live: its log


def test_the_store_says_what_changed_in_one_experiment(tmp_path):
    root = to_store(build_abl(build_grid(tmp_path)))
    with Store(root) as store:
        assert store.experiments() == ["abl", "grid"]
        runs, seq = store.changes_since(0, experiment="grid")
        assert {r.experiment for r in runs} == {"grid"} and len(runs) == 6
        store.set_priority([store.list_runs(experiment="abl")[0].id], 1)
        assert store.changes_since(seq, experiment="grid") == ([], seq)
        assert len(store.changes_since(seq)[0]) == 1


def test_folders_the_store_does_not_know_still_count(tmp_path):
    root = to_store(build_grid(tmp_path))
    stray = make_run(root, "grid", 7, trainer={"lr": 0.1}, axes={"lr": 0.1},
                     best={"loss": 0.5, "accuracy": 0.5})  # e.g. trained in the foreground
    frame = frames.load_frame(root, "grid").set_index("id")
    assert frame.loc[stray, "best_loss"] == 0.5
    row = analysis.ablation_table(frame.reset_index()).set_index("lr").loc[0.1]
    assert row["seeds"] == "4"


def test_compare_cli_with_a_store_and_its_errors(tmp_path):
    root = to_store(build_abl(build_grid(tmp_path)))
    runner = CliRunner()
    out = runner.invoke(app, ["compare", "abl", "--root", str(root)])
    assert out.exit_code == 0, out.output
    assert "baseline" in out.output and "grid" not in out.output
    out = runner.invoke(app, ["compare", "nope", "--root", str(root)])
    assert out.exit_code == 2 and "there are: abl, grid" in out.output
    out = runner.invoke(app, ["compare", "../x", "--root", str(root)])
    assert out.exit_code == 2 and "no experiment '../x'" in out.output


@pytest.mark.filterwarnings("ignore:Precision loss:RuntimeWarning")  # scipy's own, on `same`
def test_welch_p_is_scipys():
    rng = np.random.default_rng(0)
    for n1, n2 in [(2, 2), (3, 5), (4, 2), (7, 7)]:
        x, y = rng.normal(0, 1, n1), rng.normal(0.5, 2, n2)
        assert analysis.welch_p(x, y) == pytest.approx(
            stats.ttest_ind(x, y, equal_var=False).pvalue, rel=1e-12)
    same = np.array([0.3, 0.3])
    assert np.isnan(analysis.welch_p(same, same))
    assert analysis.welch_p(same, same + 0.1) == pytest.approx(
        stats.ttest_ind(same, same + 0.1, equal_var=False).pvalue)  # dof undefined: 1, as scipy


def test_the_screen_and_the_cli_format_cells_alike(tmp_path):
    root = to_store(build_abl(tmp_path))
    table = analysis.ablation_table(frames.load_frame(root, "abl"), "abl")
    cells = tables.table_cells(table)
    shown = StoreSource(root).compare("abl")
    assert (shown.rows, shown.best) == (cells.rows, cells.best)
    assert shown.columns == named(cells.header, "best")  # the screen says what the numbers are
    text = tables.format_table(table)
    for row in shown.rows:
        assert all(c in text for c in row)
    assert "best val loss ↓" in shown.columns and "Δ loss" in shown.columns
    assert "Welch p" in shown.columns


def test_the_compare_screen_refresh_reads_only_what_changed(tmp_path, counted_reads):
    build_grid(tmp_path)
    log = [{"t": 1, "step": 10, "epoch": 0, "split": "val", "loss": 0.7, "accuracy": 0.6}]
    live = make_run(tmp_path, "grid", 5, trainer={"lr": 0.1}, axes={"lr": 0.1}, summary=False,
                    log=log)
    root = to_store(tmp_path, running={live})
    src = StoreSource(root)
    first = src.compare("grid")
    assert first.rows and "1 running" not in first.note
    counted_reads.clear()
    assert src.compare("grid") is first  # nothing changed: the same Table, nothing read
    assert counted_reads == []
    with Store(root) as store:  # a write to another experiment's run changes nothing here
        other = make_run(root, "other", 0, best={"loss": 0.1, "accuracy": 0.9})
        store.enqueue([read_run_config(root / "other" / other / layout.CONFIG)])
    assert src.compare("grid") is first and counted_reads == []
    # the running run's log grows: only it is read again
    time.sleep(0.01)
    with open(root / "grid" / live / layout.METRICS, "a") as f:
        f.write(json.dumps({"t": 2, "step": 20, "epoch": 1, "split": "val", "loss": 0.6,
                            "accuracy": 0.7}) + "\n")
    assert src.compare("grid") is first  # not a finished seed: the same cells, the same Table
    assert str(root / "grid" / live / layout.METRICS) in counted_reads
    assert all(f"/{live}/" in p for p in counted_reads)  # its summary.json (none yet), its log
    # it ends: its row changes, and the table with it
    counted_reads.clear()
    summary = {"status": "completed", "best": {"loss": 0.1, "accuracy": 0.99},
               "final": {"loss": 0.1, "accuracy": 0.99}, "metrics": {"loss": "lower"}}
    with Store(root) as store:
        store.transition(live, "running", "completed", summary=summary)
    after = src.compare("grid")
    assert after is not first and after != first
    assert not [p for p in counted_reads if live not in p]  # the others' rows were kept
    seeds = after.columns.index("seeds")
    assert sorted(r[seeds] for r in after.rows) == ["3", "4"]


def test_compare_screen_refresh_with_nothing_changed_is_cheap(tmp_path, counted_reads, monkeypatch):
    """A refresh with nothing changed is a query and a few stats: no file read, no table
    made, the same Table. (What that costs on a 10,000-run root is benchmarks/
    bench_analysis.py's figure; a time asserted here fails beside other work, issue 44.)"""
    root = to_store(build_abl(build_grid(tmp_path)))
    src = StoreSource(root)
    first = src.compare("abl")
    made = []

    def counted(name, function):
        def spy(*args, **kwargs):
            made.append(name)
            return function(*args, **kwargs)
        return spy

    monkeypatch.setattr(analysis, "ablation", counted("ablation", analysis.ablation))
    monkeypatch.setattr(tables, "table_cells", counted("table_cells", tables.table_cells))
    counted_reads.clear()
    assert all(src.compare("abl") is first for _ in range(100))
    assert counted_reads == [] and made == []


def test_compare_while_running_groups_by_the_matrix_axes_only(tmp_path):
    """A resolved setting (precision: fp32 once a run ended, nothing while it runs) is no
    column; a cell without a finished seed shows – with 0/1; one precision per Δ column."""
    build_grid(tmp_path)
    for summary in tmp_path.glob("grid/*/summary.json"):
        summary.write_text(json.dumps({**json.loads(summary.read_text()), "precision": "fp32"}))
    live = make_run(tmp_path, "grid", 0, trainer={"lr": 0.5}, axes={"lr": 0.5}, summary=False,
                    log=[{"t": 1, "step": 10, "epoch": 0, "split": "train", "loss": 0.9}])
    root = to_store(tmp_path, running={live})
    shown = StoreSource(root).compare("grid")
    assert "precision" not in shown.columns and shown.columns[:2] == ("lr", "seeds")
    running = next(r for r in shown.rows if r[0] == "0.5")
    assert running[1] == "0/1" and running[2] == "–"


def test_deltas_share_one_precision_per_metric(tmp_path):
    root = to_store(build_abl(tmp_path))
    cells = tables.table_cells(analysis.ablation_table(frames.load_frame(root, "abl"), "abl"))
    column = cells.header.index("Δ loss")
    deltas = [row[column].split()[0] for row in cells.rows if row[column]]
    assert len(deltas) >= 2 and len({len(d.split(".")[1]) for d in deltas}) == 1
