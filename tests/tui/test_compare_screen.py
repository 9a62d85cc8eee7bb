"""The compare screen: a loading indicator until the first table, CSV export into the
current folder by default."""

from __future__ import annotations

import threading

from tui_helpers import aio, settle, until

from gridrun.tui.screens.compare import CompareScreen
from gridrun.tui.screens.dialogs import Prompt


@aio
async def test_loading_until_the_table_is_built_and_csv_defaults_to_the_cwd(make_app, tmp_path,
                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    app, src = make_app()
    gate, compare = threading.Event(), src.compare

    def slow(experiment):
        gate.wait(5)
        return compare(experiment)

    src.compare = slow
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("t")
        await pilot.pause()
        assert isinstance(app.screen, CompareScreen)
        table = app.screen.query_one("#ablation")
        assert table.loading
        gate.set()
        await until(pilot, lambda: app.screen.shown is not None)
        assert not table.loading
        await pilot.press("e")
        assert isinstance(app.screen, Prompt)
        assert app.screen.query_one("#answer").value == str(tmp_path / "lr-sweep.csv")


@aio
async def test_s_shows_the_spread_by_source_and_back(make_app):
    from gridrun.tui.source import Table

    app, src = make_app()
    src._tables["lr-sweep"] = Table("lr-sweep", ("vary", "seeds", "best val loss ↓"),
                                    (("all", "5", "0.45 ± 0.02"), ("init", "5", "0.46 ± 0.05")))
    src._tables["lr-sweep by source"] = Table(
        "lr-sweep", ("source", "seeds", "loss ↓ mean ± 95% CI", "std", "range", "std/all"),
        (("init", "5", "0.46 ± 0.06", "0.05", "0.12", "2.41"),
         ("all", "5", "0.45 ± 0.03", "0.02", "0.05", "1.00")), note="spread over seeds")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("t")
        await until(pilot, lambda: getattr(app.screen, "shown", None) is not None)
        screen = app.screen
        assert "s: the spread of each metric by source" in str(screen.query_one("#note").render())
        await pilot.press("s")
        await until(pilot, lambda: screen.shown.columns[0] == "source")
        assert "compare by source: lr-sweep" in str(screen.query_one("#title").render())
        assert ("compare_sources", "lr-sweep") in src.actions
        await pilot.press("s")
        await until(pilot, lambda: screen.shown.columns[0] == "vary")


# ---- issue 35: at 80 columns the early-stop metric's column shows without scrolling ------


def f1_experiment(root):
    """An ablation whose runs stop early on a derived "f1", the last of five metrics:
    `gridrun compare` puts its columns last, past 240 cells."""
    import json

    from test_analysis import make_run  # tests/ is on sys.path (conftest.py)

    from gridrun.runs import layout
    from gridrun.runs.store import Store

    metrics = {"loss": "lower", "accuracy": "higher", "precision": "higher", "recall": "higher",
               "f1": "higher"}
    for k, (ablation, trainer) in enumerate({"baseline": {}, "no-warmup": {"warmup": 0.0},
                                              "sgd": {"optimizer": "sgd"}}.items()):
        for seed in range(3):
            v = 0.5 + 0.03 * k + 0.01 * seed
            best = {"loss": 1 - v, "accuracy": v, "precision": v, "recall": v - 0.02,
                    "f1": v - 0.01}
            rid = make_run(root, "cls", seed, ablation=ablation, variant=ablation,
                           trainer={"warmup": 0.05} | trainer, best=best)
            path = layout.run_dir(root, "cls", rid) / layout.SUMMARY
            summary = json.loads(path.read_text())
            path.write_text(json.dumps(summary | {"metrics": metrics, "early_stop_metric": "f1"}))
    with Store(root):
        pass
    return root


def header_line(table) -> str:
    return table.render_line(0).text


@aio
async def test_at_80_columns_the_early_stop_metric_shows_without_scrolling(tmp_path):
    from gridrun.tui.app import GridrunApp
    from gridrun.tui.store_source import StoreSource

    app = GridrunApp(StoreSource(f1_experiment(tmp_path)), live=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        app.push_screen(CompareScreen("cls"))
        await until(pilot, lambda: getattr(app.screen, "shown", None) is not None)
        await pilot.pause()
        table = app.screen.query_one("#ablation")
        assert table.scroll_x == 0
        header = header_line(table)
        assert "f1 ↑" in header and "Δ f1" in header, header
        row = table.render_line(1).text  # the baseline's f1, mean ± std, whole
        assert "0.500 ± 0.010" in row, row
        # every column is still there, sideways: the others' headers shortened
        assert len(table.columns) == 17
        labels = [str(c.label) for c in table.columns.values()]
        assert labels[:5] == ["ablation", "seeds", "best val f1 ↑", "Δ f1", "p"], labels
        assert "loss ↓" in labels and "Welch p" not in labels
        assert table.fixed_columns == 2  # the rows' names stay put when it scrolls sideways
        # wide enough for everything (266 cells): the headers as `gridrun compare` names them
        await pilot.resize_terminal(280, 30)
        await until(pilot, lambda: "Welch p" in [str(c.label) for c in table.columns.values()])
        assert "val loss ↓ at best f1" in [str(c.label) for c in table.columns.values()]
