"""Pilot tests: press every key and check what changed (source actions, screens, widgets)."""

from dataclasses import replace
from pathlib import Path

from tui_helpers import aio, settle, until

from gridrun.tui import demo
from gridrun.tui.screens.compare import CompareScreen
from gridrun.tui.screens.detail import DetailScreen
from gridrun.tui.screens.dialogs import Confirm, Prompt, QueueScreen
from gridrun.tui.screens.help import HelpScreen
from gridrun.tui.screens.overlay import OverlayScreen
from gridrun.tui.widgets import columns


@aio
async def test_table_fills_and_navigates(make_app):
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        assert table.row_count == 24
        first = table.current.id
        await pilot.press("j", "j", "k")
        assert table.cursor_row == 1 and table.current.id != first


@aio
async def test_cancel_asks_then_writes(make_app):
    app, src = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("j", "j")  # row 2 is running
        run = app.main.table.current
        assert run.status == "running"
        await pilot.press("c")
        assert isinstance(app.screen, Confirm)
        await pilot.press("n")
        assert src.actions == []
        await pilot.press("c", "y")
        await until(pilot, lambda: src.actions)
        assert src.actions == [("cancel", (run.id,))]


@aio
async def test_retry_priority_pause_start(make_app):
    app, src = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        table.move_cursor(row=4)  # failed
        failed = table.current
        assert failed.status == "failed"
        await pilot.press("r")
        table.move_cursor(row=3)  # queued
        queued = table.current.id
        await pilot.press("plus", "minus", "p")
        await until(pilot, lambda: len(src.actions) == 4)
        assert src.actions[0] == ("retry", (failed.id,))
        assert ("priority", (queued,), 1) in src.actions
        assert ("priority", (queued,), -1) in src.actions
        assert ("pause",) in src.actions


@aio
async def test_retry_from_scratch_asks_first(make_app):
    app, src = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        app.main.table.move_cursor(row=4)  # failed
        failed = app.main.table.current
        await pilot.press("R")
        assert isinstance(app.screen, Confirm)
        await pilot.press("n")
        assert src.actions == []
        await pilot.press("R", "y")
        await until(pilot, lambda: src.actions)
        assert src.actions == [("retry", (failed.id,), True)]


@aio
async def test_start_engine_key_only_when_stopped(make_app):
    from gridrun.tui.source import EngineState, Update
    app, src = make_app()
    src._snapshots[0] = Update(runs=src._snapshots[0].runs, engine=EngineState(False, False, {}))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert "E starts it" in str(app.main.query_one("#header").render())
        await pilot.press("E")
        await until(pilot, lambda: src.actions)
        assert src.actions == [("start_engine",)]


@aio
async def test_marks_overlay_and_detail(make_app):
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("v")  # nothing marked: greyed out, nothing happens
        assert app.screen is app.main
        await pilot.press("space", "space")
        assert len(app.main.table.marked) == 2
        await pilot.press("v")
        assert isinstance(app.screen, OverlayScreen)
        await until(pilot, lambda: all(d.series for d in app.screen.data.values()))
        await pilot.press("m")  # a menu of the logged metrics
        assert "val loss" in app.screen.choices
        await pilot.press("down", "enter", "l")
        assert app.screen.log_scale and app.screen.chosen is not None
        legend = app.screen.query_one("Curves").legend.plain
        assert all(f"seed {r.seed}" in legend for r in app.screen.runs)
        await pilot.press("escape", "escape")  # back; esc again clears the marks
        assert not app.main.table.marked
        await pilot.press("enter")
        assert isinstance(app.screen, DetailScreen)
        await until(pilot, lambda: "train loss" in app.screen.data.series)
        assert len(app.screen.data.series["train loss"]) == 40
        await pilot.press("l")
        assert app.screen.log_scale
        await pilot.press("escape")
        assert app.screen is app.main


@aio
async def test_failed_run_shows_traceback(make_app):
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        app.main.table.move_cursor(row=4)
        await pilot.press("enter")
        await settle(pilot)
        await until(pilot, lambda: "boom" in str(app.screen.query_one("#summary").render()))


@aio
async def test_queue_file_by_keyboard(make_app):
    app, src = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("a")
        assert isinstance(app.screen, QueueScreen)
        await pilot.press("enter")  # checks the default ./experiments.toml, then its tasks
        await until(pilot, lambda: app.screen.tasks is not None)
        text = str(app.screen.query_one("#plan").render())
        assert "6 runs" in text and "already done" in text and "tasks checked" in text
        await pilot.press("enter")  # queues it
        await until(pilot, lambda: app.screen is app.main)
        assert src.actions == [("plan", "./experiments.toml"), ("check", "./experiments.toml"),
                               ("queue", "./experiments.toml")]


@aio
async def test_queue_shows_errors_and_queues_nothing(make_app):
    app, src = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("a")
        app.screen.query_one("Input").value = "bad.toml"
        await pilot.press("enter")
        await until(pilot, lambda: app.screen.plan is not None)
        assert "did you mean 'lr'" in str(app.screen.query_one("#plan").render())
        await pilot.press("enter")  # checks again; never queues a bad file
        await until(pilot, lambda: len(src.actions) == 2)
        await pilot.press("escape")
        assert [a[0] for a in src.actions] == ["plan", "plan"]


@aio
async def test_clone_with_override(make_app):
    app, src = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        run = app.main.table.current
        await pilot.press("d")
        assert isinstance(app.screen, Prompt)
        await pilot.press(*"lr=0.01", "enter")
        await until(pilot, lambda: src.actions)
        assert src.actions == [("clone", run.id, "lr=0.01")]


@aio
async def test_compare_and_export(make_app, tmp_path):
    app, src = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("t")
        assert isinstance(app.screen, CompareScreen)
        assert app.screen.experiment == "lr-sweep"
        await until(pilot, lambda: app.screen.shown is not None)
        assert app.screen.query_one("DataTable").row_count == 4
        await pilot.press("j", "e")
        prompt = app.screen
        assert prompt.query_one("Input").value == str(Path.cwd() / "lr-sweep.csv")  # not the root
        prompt.query_one("Input").value = str(tmp_path / "out.csv")
        await pilot.press("enter")
        await until(pilot, lambda: (tmp_path / "out.csv").exists())
        assert (tmp_path / "out.csv").read_text().startswith("lr,hidden,seeds,best val accuracy ↑,best val loss ↓\n")
        assert ("export", "lr-sweep", str(tmp_path / "out.csv")) in src.actions


@aio
async def test_filter_sort_group(make_app):
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        await pilot.press("slash", *"failed")
        await until(pilot, lambda: table.row_count == 3)  # refilters once typing pauses
        assert table.row_count == 3 and all(table.runs[k].status == "failed" for k in table.shown)
        await pilot.press("enter", "escape")
        assert table.row_count == 24
        await pilot.press("s", "s")  # the sort menu, then status
        statuses = [table.runs[i].status for i in table.order]
        assert statuses == sorted(statuses)
        await pilot.press("g")
        exps = [table.runs[i].experiment for i in table.run_order]
        assert exps == sorted(exps)


@aio
async def test_help_lists_every_key_and_q_quits(make_app):
    # what quitting says of the engine: test_quit_message.py
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = str(app.screen.query_one("#help").render())
        for key in ("space", "enter", "/", "+", "-", "a", "c", "r", "p", "d", "t", "e", "l", "v", "q"):
            assert f"  {key} " in text, key
        await pilot.press("escape", "q")
    assert app.return_code == 0


@aio
async def test_runs_changed_repaints_only_the_changed_line(make_app):
    from dataclasses import replace

    app, _src = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        run = next(r for r in table.runs.values() if r.status == "running")
        before, rendered = table.shown[run.id], table.lines_rendered
        table.apply([replace(run, step=run.step + 1, train_loss=0.1234)])
        await pilot.pause()
        changed = {k for k, a, b in zip(columns.COLUMNS, before, table.shown[run.id],
                                        strict=True) if a != b}
        assert changed == {"eta", "loss", "progress"}  # ETA follows the step
        assert table.lines_rendered - rendered == 1  # that run's line, no other
        table.apply([replace(run, step=run.step + 1, train_loss=0.1234)])  # the same again
        await pilot.pause()
        assert table.lines_rendered - rendered == 1


@aio
async def test_clearing_the_filter_keeps_queue_order_and_refilters_once(make_app):
    # Clearing a filter used to rebuild the table in arrival order, not queue
    # order, and the cleared box's own change event refiltered it again 150 ms
    # later, moving rows under a user who had already scrolled.
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        urgent = [replace(r, id=f"urgent{k}", priority=5) for k, r in enumerate(demo.rows(2))]
        app.main.runs_changed(tuple(urgent))  # they arrive last, and are first in the queue
        queue_order = list(table.order)
        assert queue_order[:2] == ["urgent0", "urgent1"]
        await pilot.press("slash", *"lr")
        await pilot.press("enter")
        rebuilds = []
        set_filter = table.set_filter
        table.set_filter = lambda needle: (rebuilds.append(needle), set_filter(needle))
        await pilot.press("escape")
        await pilot.pause(0.4)  # past the filter's debounce
        assert rebuilds == [""]
        assert table.order == queue_order


# ---- issue 44, item 11: the key bar shows only the keys that act on the tab shown ------

CURVE_KEYS = ("log", "wall_clock", "smooth(1)", "smooth(-1)")


@aio
async def test_the_detail_key_bar_shows_curve_keys_only_where_they_act(make_app):
    from textual.widgets import TabbedContent

    from gridrun.tui.widgets.keys import KeyBar

    app, _ = make_app()
    async with app.run_test(size=(200, 40)) as pilot:  # wide: every key the tab has fits
        await settle(pilot)
        await pilot.press("enter")
        await until(pilot, lambda: "train loss" in app.screen.data.series)
        screen, tabs = app.screen, app.screen.query_one(TabbedContent)
        bar = screen.query_one(KeyBar)

        def shown() -> set[str]:
            return {action for action in CURVE_KEYS if bar.enabled(action) is not None}

        assert shown() == set(CURVE_KEYS)  # the curves tab: all of them
        for tab in ("output-tab", "summary-tab", "config-tab"):
            tabs.active = tab
            await pilot.pause()
            assert shown() == set(), tab
            text = bar.render().plain
            assert "log scale" not in text and "smooth" not in text, text
            assert "esc back" in text and "q quit" in text
        await pilot.press("l", "w")  # not on the bar, and not acting unseen either
        assert not screen.log_scale and not screen.wall_clock
        tabs.active = "diagnostics-tab"  # its grad-norm plot is smoothed; log and x are fixed
        await pilot.pause()
        assert shown() == {"smooth(1)", "smooth(-1)"}
        tabs.active = "curves-tab"
        await pilot.pause()
        assert shown() == set(CURVE_KEYS)
        await pilot.press("l")
        assert screen.log_scale
