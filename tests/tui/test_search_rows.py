"""A search's trials in the interface: waiting (‖) and stopped (∎) are states of their
own, each trial shows its rung and the epochs it used of its budget (r1 e3/9), at 80
columns as wide, and `v` on a trial overlays the search's best trials."""

import pytest
from tui_helpers import aio, settle, until

from gridrun.tui import demo
from gridrun.tui.source import EngineState, FakeSource, Machine, RunRow, Update
from gridrun.tui.store_source import trial_rungs
from gridrun.tui.widgets import fmt

RUNGS = (1, 3, 9)
TRIALS = [("running", 2, 30), ("waiting", 3, 45), ("stopped", 1, 15), ("completed", 9, 135),
          ("queued", 3, 45), ("stopped", 3, 45)]
ACCURACY = [0.7, 0.81, 0.9, 0.77, None, 0.79]  # a stopped trial's may beat a promoted one's


def search_source(tables: dict | None = None) -> FakeSource:
    rows = tuple(RunRow(id=f"{i:010x}", experiment="tune", variant=f"t{i} lr=0.001 hidden=16",
                        seed=0, status=status, step=step, total_steps=135, epoch=epoch, epochs=9,
                        train_loss=0.5, best=ACCURACY[i], best_name="accuracy",
                        best_direction="higher", queued_at=demo.NOW + i, rungs=RUNGS, trial=i)
                 for i, (status, epoch, step) in enumerate(TRIALS))
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    curves = {r.id: [{"split": "val", "step": 15 * e, "epoch": e, "loss": 1.0 / e,
                      "accuracy": (r.best or 0.5) * e / r.epoch}
                     for e in range(1, r.epoch + 1)] for r in rows}
    return FakeSource([Update(runs=rows, engine=EngineState(True, False, counts),
                              machine=Machine(cpu_percent=10.0, ram_used=1e9, ram_total=8e9))],
                      metrics=curves, tables=tables)


def test_rung_labels():
    row = RunRow(id="a", experiment="e", variant="", seed=0, status="waiting", epoch=3,
                 rungs=RUNGS)
    assert fmt.rung(row) == "r1 e3/9"
    assert fmt.rung(RunRow(id="a", experiment="e", variant="", seed=0, status="running",
                           epoch=0, rungs=RUNGS)) == "r0 e0/9"
    assert fmt.status("waiting").plain == "‖ waiting" and fmt.status("stopped").plain == "∎ stopped"
    assert trial_rungs({"trial": 1, "search": {"scheduler": "asha", "min_epochs": 1,
                                               "max_epochs": 9, "eta": 3, "brackets": 2}}) == (3, 9)
    assert trial_rungs({"trainer": {}}) == ()


@pytest.mark.parametrize("width", [80, 160])
@aio
async def test_trials_show_their_state_and_rung(width):
    from gridrun.tui.app import GridrunApp

    app = GridrunApp(search_source(), clock=lambda: demo.NOW, live=False)
    async with app.run_test(size=(width, 24)) as pilot:
        await settle(pilot)
        table = app.main.table
        assert table.region.width <= width
        lines = {table.runs[table.order[table.scroll_offset.y + y - 1]].id: table.render_line(y).text
                 for y in range(1, len(TRIALS) + 1)}
        for i, (status, epoch, _) in enumerate(TRIALS):
            line = lines[f"{i:010x}"]
            assert fmt.status(status).plain in line, line
            reached = sum(1 for e in RUNGS if e <= epoch)
            assert f"r{reached - 1} e{epoch}/9" in line, line


def test_search_snapshot(snap_compare):
    from gridrun.tui.app import GridrunApp

    app = GridrunApp(search_source(), clock=lambda: demo.NOW, live=False)
    assert snap_compare(app, terminal_size=(80, 24), run_before=settle)


@aio
async def test_v_on_a_trial_overlays_the_searchs_best_trials():
    """Nothing marked, the cursor on a trial: the best five as compare ranks them (the
    furthest trained first, then the metric), named in the plot's title and legend."""
    from gridrun.tui.app import GridrunApp
    from gridrun.tui.screens.overlay import OverlayScreen

    app = GridrunApp(search_source(), clock=lambda: demo.NOW, live=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        assert app.main.table.current.trial is not None
        await pilot.press("v")
        await until(pilot, lambda: isinstance(app.screen, OverlayScreen))
        ids = [r.id for r in app.screen.runs]
        assert ids == [f"{i:010x}" for i in (3, 1, 5, 4, 0)]  # 9 epochs; 3 by accuracy, no value last
        assert app.screen.caption == "the best 5 of 6 trials by accuracy ↑"
        await until(pilot, lambda: all(d.series for d in app.screen.data.values()))
        plot = app.screen.query_one("Curves")
        assert "t3 lr=0.001" in plot.legend.plain and app.screen.metric == "val accuracy"


@aio
async def test_v_on_a_run_of_no_search_with_nothing_marked_says_what_to_do(make_app):
    app, _ = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("v")
        assert app.screen is app.main
        await until(pilot, lambda: any("mark runs with space first" in str(n.message)
                                       for n in app._notifications))


@aio
async def test_t_on_a_trial_shows_the_searchs_leaderboard():
    """The compare screen titles a search's table as its leaderboard, not an ablation
    table, and bolds the winner's metric."""
    from gridrun.tui.app import GridrunApp
    from gridrun.tui.screens.compare import CompareScreen
    from gridrun.tui.source import Table

    board = Table("tune", ("RANK", "TRIAL", "STATUS", "RUNG", "EPOCHS", "accuracy↑", "lr"),
                  (("1", "t3", "completed", "r2", "9", "0.77", "0.001"),
                   ("2", "t1", "waiting", "r1", "3", "0.81", "0.001")),
                  frozenset({(0, 5)}), note="budget used: 12 of 54 epochs (22%)",
                  kind="leaderboard")
    app = GridrunApp(search_source({"tune": board}), clock=lambda: demo.NOW, live=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("t")
        await until(pilot, lambda: isinstance(app.screen, CompareScreen)
                    and app.screen.shown is not None)
        title = str(app.screen.query_one("#title").render())
        assert title.startswith(" search: tune  (every trial, best first")
        assert "budget used" in str(app.screen.query_one("#note").render())
