"""What quitting says about the engine is what the header says (issue 44, item 11):
it printed "the engine keeps running" while the header and `gridrun engine status`
said the engine was stopped."""

from __future__ import annotations

from tui_helpers import aio, settle

from gridrun.tui.source import EngineState, FakeSource, Update


def with_engine(make_app, engine: EngineState | None):
    app, src = make_app()
    src._snapshots[0] = Update(runs=src._snapshots[0].runs, engine=engine,
                               machine=src._snapshots[0].machine)
    return app


async def quit_and_read(app, capsys) -> tuple[str, str]:
    """The header's text while open, and what quitting printed (on stderr, as Textual
    prints an exit message; its lines wrapped at the console's width, joined again)."""
    capsys.readouterr()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        header = str(app.main.query_one("#header").render())
        await pilot.press("q")
    assert app.return_code == 0
    return header, " ".join(capsys.readouterr().err.split())


@aio
async def test_a_stopped_engine_is_said_stopped_and_how_to_start_it(make_app, capsys):
    app = with_engine(make_app, EngineState(False, False, {"queued": 3, "completed": 5}))
    header, said = await quit_and_read(app, capsys)
    assert "stopped" in header
    assert "keeps running" not in said
    assert "the engine is stopped" in said
    assert "the 3 queued runs wait" in said
    assert "gridrun engine start --root /tmp/gridrun-demo" in said


@aio
async def test_a_running_engine_keeps_running_and_its_queue_goes_on(make_app, capsys):
    app = with_engine(make_app, EngineState(True, False, {"queued": 2, "running": 1}))
    header, said = await quit_and_read(app, capsys)
    assert "● running" in header
    assert "the engine keeps running" in said
    assert "1 running and 2 queued runs go on" in said


@aio
async def test_a_paused_queue_is_said_to_wait(make_app, capsys):
    app = with_engine(make_app, EngineState(True, True, {"queued": 4, "running": 1}))
    _, said = await quit_and_read(app, capsys)
    assert "the engine keeps running, its queue paused" in said
    assert "the 4 queued runs wait for `gridrun resume --root /tmp/gridrun-demo`" in said


@aio
async def test_an_engine_not_responding_is_not_said_to_run(make_app, capsys):
    app = with_engine(make_app, EngineState(True, False, {"queued": 1}, not_responding=90))
    header, said = await quit_and_read(app, capsys)
    assert "not responding for 90 s" in header
    assert "keeps running" not in said
    assert "has not responded for 90 s" in said and "gridrun engine status" in said


@aio
async def test_before_the_first_read_it_claims_nothing(make_app, capsys):
    app, _ = make_app(source=FakeSource(root="/tmp/gridrun-demo"))  # no poll ever says
    _, said = await quit_and_read(app, capsys)
    assert "keeps running" not in said and "stopped" not in said
    assert "gridrun engine status --root /tmp/gridrun-demo" in said
