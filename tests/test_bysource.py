"""`gridrun compare --by-source`: the spread of each metric per source of randomness,
next to the spread when all vary, checked against hand computations (scipy's t)."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from scipy import stats
from test_analysis import make_run
from typer.testing import CliRunner

from gridrun.analysis.ablation import AnalysisError
from gridrun.analysis.bysource import by_source, format_sources
from gridrun.analysis.frames import run_rows
from gridrun.cli import app

LOSSES = {"init": [0.30, 0.34, 0.32], "order": [0.31, 0.31, 0.33], "all": [0.28, 0.36, 0.32],
          ("init", "order"): [0.29, 0.35, 0.30]}


def build(root, *, pending: bool = False):
    for vary, losses in LOSSES.items():
        for seed, loss in enumerate(losses):
            value = list(vary) if isinstance(vary, tuple) else vary
            status = "running" if pending and vary == "init" and seed == 2 else "completed"
            make_run(root, "src", seed, trainer={"vary": value}, axes={"vary": value},
                     variant=f"vary={vary}", best={"loss": loss, "accuracy": 1 - loss},
                     status=status)
    make_run(root, "plain", 0, best={"loss": 0.5, "accuracy": 0.5})
    return root


def test_spread_per_source_next_to_all(tmp_path):
    table = by_source(run_rows(build(tmp_path)), "src", metric="loss")
    assert [r["source"] for r in table.rows] == ["init", "order", "init+order", "all"]
    everything = statistics.stdev(LOSSES["all"])
    for row in table.rows:
        key = tuple(row["source"].split("+")) if "+" in row["source"] else row["source"]
        values = LOSSES[key]
        std = statistics.stdev(values)
        assert row["n"] == 3
        assert row["loss_mean"] == pytest.approx(statistics.mean(values), abs=1e-15)
        assert row["loss_std"] == pytest.approx(std, rel=1e-12)
        assert row["loss_range"] == pytest.approx(max(values) - min(values), abs=1e-15)
        assert row["loss_ci95"] == pytest.approx(stats.t.ppf(0.975, 2) * std / math.sqrt(3),
                                                 rel=1e-9)
        assert row["loss_vs_all"] == pytest.approx(std / everything, rel=1e-12)
    text = format_sources(table)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["source", "seeds", "loss"]
    assert lines[2].startswith("init ") and lines[-2].startswith("all ")
    assert "1.00" in lines[-2]  # all's std over itself
    assert "(the others at the first seed)" in lines[-1]


def test_unfinished_seeds_and_formats(tmp_path):
    table = by_source(run_rows(build(tmp_path, pending=True)), "src")
    init = table.rows[0]
    assert (init["n"], init["runs"]) == (2, 3)
    assert "2/3" in format_sources(table).splitlines()[2]
    rows = json.loads(format_sources(table, "json"))
    assert rows[0]["source"] == "init" and rows[0]["accuracy_std"] == pytest.approx(
        statistics.stdev([0.70, 0.66]))
    assert format_sources(table, "csv").splitlines()[0].startswith("experiment,source,n,runs,")
    assert format_sources(table, "markdown").startswith("| source | seeds |")
    with pytest.raises(AnalysisError, match="not 'latex'"):
        format_sources(table, "latex")


def test_an_experiment_that_does_not_vary_sources_is_told_how(tmp_path):
    build(tmp_path)
    with pytest.raises(AnalysisError, match="does not vary its sources"):
        by_source(run_rows(tmp_path), "plain")
    assert {r["experiment"] for r in by_source(run_rows(tmp_path)).rows} == {"src"}


def test_the_command(tmp_path):
    build(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["compare", "--by-source", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].split()[:2] == ["source", "seeds"]
    refused = runner.invoke(app, ["compare", "plain", "--by-source", "--root", str(tmp_path)])
    assert refused.exit_code == 2 and "grid = { vary = [" in refused.stderr
    both = runner.invoke(app, ["compare", "--by-source", "--by", "lr", "--root", str(tmp_path)])
    assert both.exit_code == 2 and "leave out --by" in both.stderr


def test_the_footer_says_what_the_columns_hold(tmp_path):
    """Its footer said "the best validation value" while every metric but the tracked one
    is taken at the evaluation best in the tracked (early-stop) metric: it says so now."""
    table = by_source(run_rows(build(tmp_path)), "src")
    for text in (format_sources(table), format_sources(table, "markdown")):
        assert text.splitlines()[-1].startswith(
            "each finished seed's evaluation with the best loss (every metric at that "
            "evaluation, as early stopping keeps it), only that source varying (the others at "
            "the first seed); ")
        assert "best validation value" not in text
    last = format_sources(by_source(run_rows(tmp_path), "src", final=True))
    assert last.splitlines()[-1].startswith("each finished seed's last evaluation, only that "
                                            "source varying")
