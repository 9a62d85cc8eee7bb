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
