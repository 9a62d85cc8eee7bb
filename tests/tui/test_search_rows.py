"""A search's trials in the interface: waiting (‖) and stopped (∎) are states of their
own, and each trial shows its rung and the epochs it used of its budget (r1 e3/9),
at 80 columns as wide."""

import pytest
from tui_helpers import aio, settle

from gridrun.tui import demo
from gridrun.tui.source import EngineState, FakeSource, Machine, RunRow, Update
from gridrun.tui.store_source import trial_rungs
from gridrun.tui.widgets import fmt

RUNGS = (1, 3, 9)
TRIALS = [("running", 2, 30), ("waiting", 3, 45), ("stopped", 1, 15), ("completed", 9, 135),
          ("queued", 3, 45), ("stopped", 3, 45)]


def search_source() -> FakeSource:
    rows = tuple(RunRow(id=f"{i:010x}", experiment="tune", variant=f"t{i} lr=0.001 hidden=16",
                        seed=0, status=status, step=step, total_steps=135, epoch=epoch, epochs=9,
                        train_loss=0.5, best=0.8, best_name="accuracy", queued_at=demo.NOW + i,
                        rungs=RUNGS)
                 for i, (status, epoch, step) in enumerate(TRIALS))
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    return FakeSource([Update(runs=rows, engine=EngineState(True, False, counts),
                              machine=Machine(cpu_percent=10.0, ram_used=1e9, ram_total=8e9))])


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
