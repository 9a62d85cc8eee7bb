"""Table formats, exports and the `compare` / `export` commands on real run folders."""

import csv
import importlib.util
import io
import json
import os

import pandas as pd
import pytest
from test_analysis import build_abl, build_grid, make_run
from typer.testing import CliRunner

from gridrun.analysis import ablation as analysis
from gridrun.analysis import export, tables
from gridrun.analysis.ablation import ablation_table
from gridrun.analysis.frames import runs_frame
from gridrun.analysis.tables import format_table
from gridrun.cli import app

runner = CliRunner()


@pytest.fixture
def grid_root(tmp_path):
    return build_grid(tmp_path)


@pytest.fixture
def abl_root(tmp_path):
    return build_abl(tmp_path)


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_terminal_table_digits_follow_the_std(grid_root):
    text = format_table(ablation_table(runs_frame(grid_root)), "table")
    # loss at lr=0.01: mean 0.24, std 0.0360555 -> two significant digits of the std
    assert "0.240 ± 0.036 *" in text
    assert "0.960 ± 0.010 *" in text  # accuracy: higher is better
    assert "loss ↓" in text and "accuracy ↑" in text
    assert text.splitlines()[0].split()[:2] == ["lr", "seeds"]  # seed is never a key


def test_decimals():
    assert tables._decimals(12345.6, 230.0) == 0
    assert tables._decimals(0.5, 0.0004) == 5  # 0.50000 ± 0.00040
    assert tables._decimals(0.5, float("nan")) == 4  # 4 significant digits alone


def test_csv_round_trip(grid_root, tmp_path):
    table = ablation_table(runs_frame(grid_root))
    path = tmp_path / "t.csv"
    path.write_text(format_table(table, "csv"))
    back = pd.read_csv(path)
    assert list(back.columns) == list(table.columns)
    assert {"loss_mean", "loss_std", "n", "accuracy_ci95"} <= set(back.columns)
    pd.testing.assert_series_equal(back["loss_mean"], table["loss_mean"])


def test_markdown_and_latex(abl_root):
    table = ablation_table(runs_frame(abl_root), metric="loss")
    md = format_table(table, "markdown")
    lines = md.splitlines()
    assert lines[0] == "| ablation | seeds | loss ↓ | Δ loss | p |"
    assert lines[1] == "|---|---|---|---|---|"
    assert "| sgd | 1 (1 failed) | **0.4000** |" in md
    tex = format_table(table, "latex")
    assert tex.startswith(r"\begin{tabular}{lrrrr}" + "\n" + r"\toprule")
    assert r"\midrule" in tex and r"\bottomrule" in tex
    assert r"\textbf{0.4000}" in tex and r"0.520 $\pm$ 0.020" in tex
    assert r"(+15.9\%)" in tex and r"$\Delta$ loss" in tex
    # underscores in names are escaped
    frame = runs_frame(abl_root)
    frame = frame.rename(columns={"best_loss": "best_val_loss"})
    frame.attrs = {**runs_frame(abl_root).attrs, "metrics": ["val_loss"]}
    assert r"val\_loss" in format_table(ablation_table(frame), "latex")


def test_json(grid_root):
    rows = json.loads(format_table(ablation_table(runs_frame(grid_root)), "json"))
    assert len(rows) == 2 and rows[0]["lr"] == 0.01 and rows[0]["loss_best"] is True


def test_export_metrics_long_format(tmp_path):
    log = [{"t": 1, "step": i, "epoch": i // 3, "split": "train", "loss": 1 / i, "lr": 0.1,
            "samples_per_s": 10.0, "step_time": 0.1} for i in range(1, 7)]
    log.append({"t": 2, "step": 6, "epoch": 2, "split": "val", "loss": 0.2, "accuracy": 0.9})
    log.insert(0, {"t": 0, "step": 0, "epoch": 0, "split": "start", "total_steps": 6})  # not exported
    a = make_run(tmp_path, "e", 0, best={"loss": 0.2}, log=log)
    make_run(tmp_path, "e", 1, status="failed", log=log[:3], torn=True)
    make_run(tmp_path, "f", 0, summary=False)  # no metrics yet
    out = tmp_path / "m.csv"
    # small chunks and flushes exercise the streaming path
    n = export.export_metrics(tmp_path, out, chunk_bytes=256, flush_lines=3)
    back = pd.read_csv(out)
    assert list(back.columns) == ["run_id", "step", "epoch", "split", "metric", "value"]
    assert n == len(back) == 6 * 4 + 2 + 2 * 4
    first = back[back["run_id"] == a].iloc[:4]
    assert list(first["metric"]) == ["loss", "lr", "samples_per_s", "step_time"]
    assert list(first["value"]) == [1.0, 0.1, 10.0, 0.1]
    val = back[(back["run_id"] == a) & (back["split"] == "val")]
    assert dict(zip(val["metric"], val["value"], strict=True)) == {"loss": 0.2, "accuracy": 0.9}
    assert export.export_metrics(tmp_path, out, status="completed", force=True) == 26
    assert export.export_metrics(tmp_path, out, experiment="f", force=True) == 0
    assert list(pd.read_csv(out).columns) == ["run_id", "step", "epoch", "split", "metric", "value"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_arrays_and_booleans_are_written_as_json_in_every_csv(tmp_path):
    """The runs CSV, compare's CSV, a Parquet file's text and MLflow's params spell a value
    alike: JSON for arrays and booleans, never Python's `(0.9, 0.999)` or `True`."""
    from gridrun.analysis.mlflow import records as mlflow_records

    for seed, betas in enumerate(([0.9, 0.999], [0.8, 0.99])):
        make_run(tmp_path, "tricks", seed, trainer={"betas": betas, "nesterov": True},
                 axes={"betas": betas}, variant=f"betas={betas}", best={"loss": 0.5})
    out = tmp_path / "runs.csv"
    assert cli("export", "-o", out, "--root", tmp_path).exit_code == 0
    with open(out, newline="") as f:
        rows = {r["seed"]: r for r in csv.DictReader(f)}
    assert (rows["0"]["betas"], rows["1"]["betas"]) == ("[0.9, 0.999]", "[0.8, 0.99]")
    assert (rows["0"]["nesterov"], rows["0"]["drop_last"], rows["0"]["compile"]) == \
        ("true", "true", "false")
    assert rows["0"]["checkpoint_modules"] == "[]" and rows["0"]["lr"] == "0.001"
    config = {"task": "spirals", "trainer": {"betas": [0.9, 0.999], "nesterov": True,
                                             "compile": False}, "task_args": {}}
    sent = mlflow_records.params_of(config)
    assert (sent["betas"], sent["nesterov"], sent["compile"]) == \
        (rows["0"]["betas"], rows["0"]["nesterov"], rows["0"]["compile"])

    result = cli("compare", "tricks", "--by", "betas", "--format", "csv", "--root", tmp_path)
    assert result.exit_code == 0, result.output
    cells = {r["betas"] for r in csv.DictReader(io.StringIO(result.output))}
    assert cells == {"[0.9, 0.999]", "[0.8, 0.99]"}
    if importlib.util.find_spec("pyarrow") is not None:
        parquet = tmp_path / "runs.parquet"
        assert cli("export", "-o", parquet, "--root", tmp_path).exit_code == 0
        assert sorted(pd.read_parquet(parquet)["betas"]) == ["[0.8, 0.99]", "[0.9, 0.999]"]


def test_parquet_needs_pyarrow(grid_root, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    out = tmp_path / "m.parquet"
    with pytest.raises(analysis.AnalysisError, match="pip install pyarrow"):
        export.export_metrics(grid_root, out)
    result = cli("export", "--what", "runs", "-o", out, "--root", grid_root)
    assert result.exit_code == 2 and "pip install pyarrow" in result.output
    assert not out.exists()


def test_parquet_round_trip(grid_root, tmp_path):
    pytest.importorskip("pyarrow")
    out = tmp_path / "r.parquet"
    assert cli("export", "-o", out, "--root", grid_root).exit_code == 0
    assert len(pd.read_parquet(out)) == 6


def test_cli_compare(grid_root, abl_root):
    result = cli("compare", "--root", grid_root)
    assert result.exit_code == 0, result.output
    assert "grid\n" in result.output and "abl\n" in result.output
    assert "0.240 ± 0.036 *" in result.output
    result = cli("compare", "abl", "--metric", "loss", "--format", "csv", "--root", abl_root)
    assert result.exit_code == 0 and result.output.startswith("experiment,ablation,seeds,n,")
    result = cli("compare", "grid", "--by", "hidden", "--final", "--root", grid_root)
    assert result.exit_code == 0 and "hidden" in result.output.splitlines()[0]


def test_cli_compare_errors(grid_root, tmp_path):
    result = cli("compare", "nope", "--root", grid_root)
    assert result.exit_code == 2
    assert "no experiment 'nope'" in result.output and "there are: grid" in result.output
    empty = tmp_path / "empty"
    result = cli("compare", "--root", empty)  # a reader creates nothing (issue 24)
    assert result.exit_code == 2 and "no such root" in result.output and not empty.exists()
    empty.mkdir(mode=0o700)
    result = cli("compare", "--root", empty)
    assert result.exit_code == 2 and "gridrun run" in result.output
    assert os.listdir(empty) == []
    result = cli("compare", "--metric", "bleu", "--root", grid_root)
    assert result.exit_code == 2 and "loss, accuracy" in result.output
    result = cli("compare", "--by", "seed", "--root", grid_root)
    assert result.exit_code == 2 and "over seeds" in result.output
    assert "Traceback" not in result.output


def test_cli_export(grid_root, tmp_path):
    out = tmp_path / "runs.csv"
    result = cli("export", "--what", "runs", "-o", out, "--experiment", "grid", "--root", grid_root)
    assert result.exit_code == 0, result.output
    assert f"wrote 6 rows (runs) to {out}" in result.output
    back = pd.read_csv(out)
    assert list(back.columns) == list(runs_frame(grid_root).columns)
    out = tmp_path / "abl.csv"
    result = cli("export", "--what", "ablation", "-o", out, "--root", grid_root)
    assert "wrote 2 rows" in result.output and len(pd.read_csv(out)) == 2
    result = cli("export", "--what", "metrics", "-o", tmp_path / "m.csv", "--root", grid_root)
    assert result.exit_code == 0 and "wrote 0 rows (metrics)" in result.output
    result = cli("export", "-o", tmp_path / "x.csv", "--status", "done", "--root", grid_root)
    assert result.exit_code == 2 and "unknown status 'done'" in result.output
    result = cli("export", "-o", tmp_path / "no" / "x.csv", "--root", grid_root)
    assert result.exit_code == 2 and "does not exist" in result.output


@pytest.mark.parametrize("where", ["/usr/gridrun-export-test.csv", "/etc/gridrun-export-test.csv"])
def test_export_never_writes_into_a_system_folder(grid_root, where):
    try:
        result = cli("export", "-o", where, "--force", "--root", grid_root)
        assert result.exit_code == 2, result.output
        assert result.output.strip() == (f"refusing to write {where}: it is in the system folder "
                                         f"{where[:4]}; write into a folder of your own")
        assert not os.path.lexists(where)
        with pytest.raises(analysis.AnalysisError, match="system folder"):  # a ValueError
            export.write_frame(pd.DataFrame({"a": [1]}), where, force=True)
    finally:  # what an unfixed gridrun wrote
        if os.path.lexists(where):
            os.unlink(where)


@pytest.mark.parametrize("what", ["runs", "metrics"])
def test_a_full_disk_leaves_the_old_export_whole_and_says_so_in_one_line(grid_root, tmp_path,
                                                                         what):
    from tmpfs_kit import fill, mounted

    with mounted(tmp_path / "small", "2m") as small:
        out = small / "runs.csv"
        out.write_text("my,table\n" * 100)
        fill(small)
        result = cli("export", "--what", what, "-o", out, "--force", "--root", grid_root)
        assert result.exit_code == 2, result.output
        assert result.output.strip().splitlines()[-1] == (
            f"cannot write {out}: the disk is full; nothing was changed there (free space or "
            "pick another -o)")
        assert out.read_text() == "my,table\n" * 100
        assert sorted(os.listdir(small)) == ["filler", "runs.csv"]  # no temporary left
        with pytest.raises(analysis.AnalysisError, match="the disk is full"):
            export.write_frame(pd.DataFrame({"a": range(100_000)}), out, force=True)
        with pytest.raises(FileExistsError, match="exists; add --force"):
            export.write_frame(pd.DataFrame({"a": [1]}), out)
