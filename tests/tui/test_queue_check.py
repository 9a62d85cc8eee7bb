"""The "queue a file" dialog checks the file's tasks (in a subprocess: the interface never
imports torch) and queues only when the check passed."""

import pytest
from tui_helpers import aio, settle, until

from gridrun.runs.store import Store
from gridrun.tui import demo
from gridrun.tui.app import GridrunApp
from gridrun.tui.screens.dialogs import QueueScreen
from gridrun.tui.source import Plan, TaskCheck
from gridrun.tui.store_source import StoreSource

BAD = """[defaults]
epochs = 1
batch_size = 16

[experiments.renamed]
task = "bad_tasks:renamed_metric"
"""


@pytest.mark.slow
def test_the_real_source_reports_the_check_of_a_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD)
    src = StoreSource(tmp_path / "runs")
    check = src.check_tasks(str(bad))
    assert not check.ok and len(check.problems) == 1 and check.error == ""
    assert check.problems[0].startswith(f"{bad}:6: [experiments.renamed] task "
                                        "'bad_tasks:renamed_metric': evaluate returns")
    good = tmp_path / "good.toml"
    good.write_text(BAD.replace("renamed_metric", "good"))
    assert src.check_tasks(str(good)).ok
    # a long path: the command's usage error must come back whole, not wrapped in a box
    nowhere = tmp_path / ("a-folder-with-a-long-name-" * 4) / "nope.toml"
    missing = src.check_tasks(str(nowhere))
    assert not missing.ok and missing.error == f"{nowhere}: no such file"
    folder = src.check_tasks(str(tmp_path))
    assert not folder.ok and "\n" not in folder.error and str(tmp_path) in folder.error


@pytest.mark.slow
@aio
async def test_dialog_shows_a_task_problem_and_refuses_to_queue(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD)
    root = tmp_path / "runs"
    app = GridrunApp(StoreSource(root), live=False)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(pilot)
        await pilot.press("a")
        assert isinstance(app.screen, QueueScreen)
        app.screen.query_one("#path").value = str(bad)
        await pilot.press("enter")
        await until(pilot, lambda: app.screen.plan is not None, tries=1500)
        if app.screen.tasks is None:  # the plan is shown while the tasks are checked
            assert "checking tasks…" in str(app.screen.query_one("#plan").render())
        await until(pilot, lambda: app.screen.tasks is not None, tries=1500)
        text = str(app.screen.query_one("#plan").render())
        assert "the task check found 1 problem; nothing was queued" in text
        assert "[experiments.renamed] task 'bad_tasks:renamed_metric'" in text
        assert "missing 'acc'" in text and "renamed: 1" in text
        await pilot.press("escape")  # enter would check again, never queue (test below)
        assert app.screen is app.main
    assert not (root / "gridrun.db").exists() or not Store(root).list_runs()


@aio
async def test_enter_never_queues_after_a_failed_check(make_app):
    src = demo.source(24)
    path = "./experiments.toml"
    src._checks[path] = TaskCheck(path, problems=("exp.toml:2: [experiments.a] task 'x': loss failed",))
    app, _ = make_app(source=src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("a", "enter")
        await until(pilot, lambda: app.screen.tasks is not None)
        assert "loss failed" in str(app.screen.query_one("#plan").render())
        await pilot.press("enter")
        await until(pilot, lambda: len(src.actions) == 4)
        assert [a[0] for a in src.actions] == ["plan", "check", "plan", "check"]
        assert isinstance(app.screen, QueueScreen) and isinstance(app.screen.plan, Plan)


@aio
async def test_tab_takes_the_suggestion_and_stays_in_the_field(make_app, tmp_path, monkeypatch):
    from gridrun.tui.screens.dialogs import QueueScreen

    (tmp_path / "experiments-long-name.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        app.push_screen(QueueScreen(""))
        await pilot.pause()
        box = app.screen.query_one("#path")
        await pilot.press(*"exp")
        await pilot.pause(0.2)
        await pilot.press("tab")
        await pilot.pause()
        assert box.value == "experiments-long-name.toml" and app.focused is box
        await pilot.press("tab", "x")  # a second tab neither leaves nor selects all
        assert box.value == "experiments-long-name.tomlx" and app.focused is box


def test_a_missing_file_is_one_plain_line(tmp_path):
    from gridrun.tui.screens.dialogs import plain_lines
    from gridrun.tui.store_source import StoreSource

    plan = StoreSource(tmp_path / "runs").plan(str(tmp_path / "nope.toml"))
    assert plan.errors == f"{tmp_path / 'nope.toml'}: no such file"
    typer_text = ("Usage: python -m gridrun plan [OPTIONS] FILE\nTry 'python -m gridrun plan --help' "
                  "for help.\n╭─ Error ─────╮\n│ Invalid value for 'FILE': File 'x' does not exist. │\n"
                  "╰─────────────╯\n")
    assert plain_lines(typer_text) == "Invalid value for 'FILE': File 'x' does not exist."


@aio
async def test_the_toast_after_queueing_names_E_when_the_engine_is_stopped(make_app):
    from dataclasses import replace

    from gridrun.tui.screens.dialogs import QueueScreen

    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        app.main.engine_changed(replace(app.main.engine, running=False))
        screen = QueueScreen()
        app.push_screen(screen)
        await pilot.pause()
        screen.queued("queued 6 runs\nthe engine is not running: start it with "
                      "`gridrun engine start --root /x`")
        await pilot.pause()
        text = "\n".join(n.message for n in app._notifications)
        assert "press E to start it" in text and "gridrun engine start" not in text
