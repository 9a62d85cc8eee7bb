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
