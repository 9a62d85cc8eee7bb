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
        # held until the test has seen 'loading': a bound only so that a failed test never
        # leaves the worker blocked; 5 s could run out first on a busy machine (issue 44)
        gate.wait(120)
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


# ---- issue 44, item 11: Right and Left scroll by whole columns, not by a character ------


def column_starts(table) -> list[int]:
    """The scroll offsets at which each column after the frozen names starts right
    after them: where a sideways scroll should stop."""
    widths = [c.get_render_width(table) for c in table.ordered_columns[table.fixed_columns:]]
    return [sum(widths[:k]) for k in range(len(widths))]


@aio
async def test_right_and_left_scroll_by_whole_columns(tmp_path):
    from gridrun.tui.app import GridrunApp
    from gridrun.tui.store_source import StoreSource

    app = GridrunApp(StoreSource(f1_experiment(tmp_path)), live=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        app.push_screen(CompareScreen("cls"))
        await until(pilot, lambda: getattr(app.screen, "shown", None) is not None)
        await pilot.pause()
        table = app.screen.query_one("#ablation")
        starts = column_starts(table)
        frozen = sum(c.get_render_width(table) for c in table.ordered_columns[:table.fixed_columns])
        room = table.scrollable_content_region.width - frozen
        before = header_line(table)
        await pilot.press("right")
        await pilot.pause()
        first = table.scroll_x
        # half a screen of whole columns, as the runs list scrolls: a column starts at the edge
        assert first in starts and first >= room // 2, (first, starts)
        after = header_line(table)
        assert after[:frozen] == before[:frozen]  # the rows' names stay
        assert after != before
        await pilot.press("right")
        await pilot.pause()
        second = table.scroll_x
        assert second - first >= room // 2 and (second in starts or second == table.max_scroll_x)
        await pilot.press("left")  # back half a screen, a column at the edge again
        await pilot.pause()
        assert table.scroll_x in starts and second - table.scroll_x >= room // 2
        await pilot.press("left", "left", "left")
        await pilot.pause()
        assert table.scroll_x == 0
        for _ in range(20):  # to the end, and no further
            await pilot.press("right")
        await pilot.pause()
        assert table.scroll_x == table.max_scroll_x


def test_next_offset_lands_on_a_column_and_stops_at_the_ends():
    from gridrun.tui.widgets.compare_columns import next_offset

    widths, room, end = [10, 10, 10, 10, 10], 30, 25  # columns start at 0, 10, 20, 30, 40
    assert next_offset(widths, 0, 1, room, end) == 20  # half a screen (15) or more, whole
    assert next_offset(widths, 20, 1, room, end) == 25  # past the end: the end
    assert next_offset(widths, 25, 1, room, end) == 25
    assert next_offset(widths, 25, -1, room, end) == 10
    assert next_offset(widths, 3, -1, room, end) == 0  # from mid-column (a mouse scroll)
    assert next_offset(widths, 0, -1, room, end) == 0
    assert next_offset([40], 0, 1, 10, 30) == 30  # one column wider than the screen
