"""The interface never dies on data: store rows, summaries and metrics lines of the
wrong type render as text, and a refresh that raises becomes a notification and a
line in ROOT/tui.log, never a crash."""

from __future__ import annotations

from dataclasses import replace

from tui_helpers import aio, settle, until

from gridrun.tui import demo
from gridrun.tui.app import GridrunApp
from gridrun.tui.source import EngineState, FakeSource, RunDetail, RunRow, Update


def bad_rows() -> list[RunRow]:
    good = demo.rows(6)
    return [
        *good,
        # the row: a clone typed as `epochs=60 lr=0.005` before the spec's derive
        replace(good[2], id="badepochs0", epochs="60 lr=0.005", total_steps=None, status="running"),
        replace(good[0], id="badtypes01", step="abc", total_steps="x", train_loss="nan?",
                best=None, priority=None, seed=None, samples_per_s=10**400,
                started_at="yesterday", ended_at=None, variant=None, status="completed"),
        replace(good[1], id="hugenums02", step=10**30, total_steps=10**31, train_loss=1e308,
                best=float("inf"), samples_per_s=float("nan"), priority=10**20),
    ]


def bad_source(tmp_path) -> FakeSource:
    rows = bad_rows()
    return FakeSource([Update(runs=tuple(rows), engine=EngineState(True, False, {"x": "y"}))],
                      root=tmp_path,
                      details={"badtypes01": RunDetail({"epochs": "60 lr=0.005", "lr": None},
                                                       {"ended_at": "soon", "step": [1, 2],
                                                        "peak_memory_bytes": "lots"}, None)},
                      metrics={"badtypes01": [{"step": "x", "split": "train", "loss": "y"},
                                              {"step": None, "split": "val", "loss": 1e400},
                                              {"split": 3}]})


@aio
async def test_rows_of_wrong_types_render_sort_and_open(tmp_path):
    src = bad_source(tmp_path)
    app = GridrunApp(src, clock=lambda: demo.NOW, live=False)
    async with app.run_test(size=(200, 50)) as pilot:
        await settle(pilot)
        table = app.main.table
        assert table.row_count == 9
        for col in (None, *table.sortable_columns()):
            table.sort_by(col)
            await pilot.pause()
        await pilot.press("g")
        await pilot.pause()
        await pilot.press("g")
        table.move_cursor(row=table.position["badtypes01"])
        await pilot.press("enter")
        await until(pilot, lambda: "soon" in str(app.screen.query_one("#summary").render()))
        summary = str(app.screen.query_one("#summary").render())
        assert "lots" in summary  # what cannot be formatted is shown as text
        await pilot.press("escape")
        await pilot.press("right", "right", "left")
        await pilot.pause()
        errors = [n.message for n in app._notifications if n.severity == "error"]
        assert errors == [] and not (tmp_path / "tui.log").exists()
        assert app.is_running and app.return_code in (None, 0)


@aio
async def test_a_refresh_that_raises_is_a_notification_and_a_log_line(tmp_path):
    src = bad_source(tmp_path)
    app = GridrunApp(src, clock=lambda: demo.NOW, live=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table

        def boom(rows):
            raise RuntimeError("a bug in a refresh")
        table.apply = boom
        app.main.runs_changed(tuple(bad_rows()[:1]))
        await pilot.pause()
        assert app.is_running
        assert any("a bug in a refresh" in n.message for n in app._notifications)
        log = (tmp_path / "tui.log").read_text()
        assert "RuntimeError: a bug in a refresh" in log and "Traceback" in log


def test_store_row_with_a_string_for_epochs(tmp_path):
    """The issue's crash, from a real store: epochs = '60 lr=0.005' in the row's config."""
    import asyncio
    import json

    from test_engine_kit import make_run

    from gridrun.runs.store import Store
    from gridrun.tui.store_source import StoreSource

    root = tmp_path / "runs"
    with Store(root) as store:
        run = make_run()
        store.enqueue([run])
        config = dict(run.to_dict())
        config["trainer"] = {**config["trainer"], "epochs": "60 lr=0.005"}
        with store._tx() as db:
            db.execute("UPDATE runs SET config = ?, status = 'running', summary = ? WHERE id = ?",
                       (json.dumps(config), json.dumps({"step": "x", "best_value": "y"}), run.id))

    async def main():
        app = GridrunApp(StoreSource(root), clock=lambda: demo.NOW, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await until(pilot, lambda: app.main.table.row_count == 1)
            await pilot.press("s", "s", "g")
            await pilot.pause()
            assert app.is_running
    asyncio.run(main())
