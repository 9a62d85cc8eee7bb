"""Readers are total: a metrics line that is not a record, a garbage summary.json or
config.toml is skipped (and counted), never a crash: in the parser, `compare`, `export`,
`gridrun run`'s table and its progress lines."""

from __future__ import annotations

import json

import pytest
from test_analysis import make_run
from typer.testing import CliRunner

from gridrun.analysis import frames, tables
from gridrun.analysis.export import export_metrics
from gridrun.cli import app
from gridrun.runs import layout, runlog
from gridrun.runs.records import Summary

GOOD = [
    {"t": 1.0, "step": 0, "epoch": 0, "split": "start", "total_steps": 100},
    {"t": 2.0, "step": 10, "epoch": 0, "split": "train", "loss": 0.9, "samples_per_s": 50.0},
    {"t": 3.0, "step": 20, "epoch": 1, "split": "val", "loss": 0.5, "accuracy": 0.8},
]
# every shape of line a person or a broken writer can leave in a metrics log
BAD = [b"123", b"[1,2]", b'"x"', b"{}", b"null", b"true",
       b'{"step": "3", "split": "train", "loss": 1.0}',  # step is a string
       b'{"step": 3, "split": 7}',  # split is not a name
       b'{"step": 3, "epoch": [1], "split": "train"}',
       b'{"step": true, "split": "train"}',
       b'{"step": 3, "split": "val", "loss": {"a": 1}}',  # a value that is not a number
       b"\xff\xfe\x00\x81garbage\x00", b"[" * 50_000, b'{"step": 1e999, "split": "val"}']


def bad_log(folder, *, torn=True):
    """GOOD interleaved with every BAD line, and a torn last line."""
    lines = [json.dumps(GOOD[0]).encode(), *BAD[:7], json.dumps(GOOD[1]).encode(), *BAD[7:],
             json.dumps(GOOD[2]).encode()]
    data = b"\n".join(lines) + b"\n" + (b'{"t": 4, "step": 3' if torn else b"")
    (folder / layout.METRICS).write_bytes(data)


def test_the_parser_keeps_records_and_counts_the_rest(tmp_path):
    bad_log(tmp_path)
    got = runlog.read(tmp_path / layout.METRICS)
    assert got.records == GOOD
    assert got.skipped == len(BAD)  # the torn last line waits for its end, uncounted
    assert runlog.read_all(tmp_path / layout.METRICS) == GOOD
    chunks = list(runlog.iter_chunks(tmp_path / layout.METRICS, chunk_bytes=64))
    assert [r for c in chunks for r in c.records] == GOOD
    assert sum(c.skipped for c in chunks) == len(BAD)


def test_non_finite_values_read_as_null(tmp_path):
    (tmp_path / layout.METRICS).write_bytes(b'{"step": 1, "split": "val", "loss": NaN}\n')
    assert runlog.read_all(tmp_path / layout.METRICS) == [{"step": 1, "split": "val", "loss": None}]


def gridrun(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output, result


def live_run_with_bad_lines(root):
    """A finished run, and a running one (no summary yet) whose log holds every bad line."""
    make_run(root, "e", 0, best={"loss": 0.3, "accuracy": 0.9})
    rid = make_run(root, "e", 1, summary=False, log=[])
    bad_log(root / "e" / rid)
    return rid


def test_compare_skips_bad_lines_and_says_so(tmp_path):
    rid = live_run_with_bad_lines(tmp_path)
    code, out, result = gridrun("compare", "--root", tmp_path)
    assert code == 0, result.exception
    assert "loss" in out and "1/2" in out  # one finished seed, one running
    assert f"{len(BAD)} unreadable lines skipped in {tmp_path / 'e' / rid / layout.METRICS}" in out


def test_export_metrics_skips_bad_lines(tmp_path):
    rid = live_run_with_bad_lines(tmp_path)
    out = tmp_path / "m.csv"
    code, text, result = gridrun("export", "--what", "metrics", "-o", out, "--root", tmp_path)
    assert code == 0, result.exception
    assert f"{len(BAD)} unreadable lines skipped" in text
    rows = out.read_text().splitlines()
    assert rows[0] == "run_id,step,epoch,split,metric,value"
    assert sorted(r.split(",")[4] for r in rows[1:]) == ["accuracy", "loss", "loss", "samples_per_s"]
    assert all(r.startswith(rid) for r in rows[1:])
    skipped: dict = {}
    assert export_metrics(tmp_path, tmp_path / "n.csv", skipped=skipped) == 4
    assert skipped == {str(tmp_path / "e" / rid / layout.METRICS): len(BAD)}


@pytest.mark.parametrize("summary", [
    b"[1, 2]", b"123", b"\xff\x00garbage", b'{"status": 5}',
    json.dumps({"status": "completed", "metrics": [1], "final": "x", "best": 7,
                "step": "many", "best_step": [], "early_stop_metric": {}}).encode(),
    json.dumps({"status": "completed", "metrics": {"loss": 3}, "best": {"loss": "low"},
                "final": {"loss": [1]}, "provenance": 5}).encode(),
])
def test_a_garbage_summary_never_crashes_compare(tmp_path, summary):
    make_run(tmp_path, "e", 0, best={"loss": 0.3, "accuracy": 0.9})
    rid = make_run(tmp_path, "e", 1, best={"loss": 0.4, "accuracy": 0.8})
    (tmp_path / "e" / rid / layout.SUMMARY).write_bytes(summary)
    code, out, result = gridrun("compare", "--root", tmp_path)
    assert code == 0, result.exception
    assert "loss" in out
    code, out, result = gridrun("export", "-o", tmp_path / "runs.csv", "--root", tmp_path)
    assert code == 0, result.exception


def test_a_summary_keeps_only_well_typed_values():
    got = Summary.from_json({"status": "completed", "metrics": {"loss": "lower", "x": 3},
                             "best": {"loss": 0.5, "acc": "high"}, "final": [1],
                             "step": "7", "best_step": 80, "device": 3, "note": "unknown"})
    assert got == Summary(status="completed", metrics={"loss": "lower"}, best={"loss": 0.5},
                          best_step=80)
    assert Summary.from_json([1, 2]) is None and Summary.from_json(None) is None
    assert Summary.from_json(got.to_json()) == got
    with pytest.raises(ValueError, match="device"):
        Summary.from_json({"device": 3}, strict=True)


@pytest.mark.parametrize("config", [
    b"\xff\xfe garbage", b"x = " + b"[" * 5000 + b"]" * 5000, b'id = 5\nexperiment = "e"',
    b'id = "a"\nexperiment = ["e"]\nvariant = ""\nseed = 0\ntask = "t"\n[trainer]\n',
    b'id = "a"\nexperiment = "e"\nvariant = ""\nseed = 0\ntask = "t"\ntrainer = 5\n',
])
def test_a_garbage_config_is_skipped_and_listed(tmp_path, config):
    make_run(tmp_path, "e", 0, best={"loss": 0.3, "accuracy": 0.9})
    bad = layout.make_private_dir(tmp_path / "e" / "zzzzzzzzzz")
    (bad / layout.CONFIG).write_bytes(config)
    frame = frames.runs_frame(tmp_path)
    assert len(frame) == 1 and frame.attrs["skipped"] == [str(bad)]
    code, out, result = gridrun("compare", "--root", tmp_path)
    assert code == 0, result.exception
    assert f"skipped {bad}: its {layout.CONFIG} cannot be read" in out


def test_run_results_table_skips_bad_lines(tmp_path):
    live_run_with_bad_lines(tmp_path)
    text = tables.comparison_text(tmp_path, ["e"])
    assert "loss" in text and f"{len(BAD)} unreadable lines skipped" in text


def test_follow_progress_skips_bad_lines(tmp_path):
    from types import SimpleNamespace

    from gridrun.commands.follow import Reader, RunLine

    folder = layout.make_private_dir(tmp_path / "e" / "r1")
    bad_log(folder)
    run = SimpleNamespace(id="r1", experiment="e", variant="", seed=0,
                          config={"trainer": {"epochs": 2}}, run_dir=lambda root: folder)
    texts = RunLine.of(run, Reader(tmp_path).progress(run)).texts()
    assert texts["steps"] == "20/100" and texts["loss"] == "loss 0.9"  # by steps, as the interface
