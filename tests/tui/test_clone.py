"""Clone (`d`) goes through the spec: a bad key or value is refused in the dialog with
the spec's message and nothing is queued; a good one is the cell a file would give."""

import pytest
from tui_helpers import aio, settle, until

from gridrun.runs.store import Store
from gridrun.spec import RunSpec, load_runs
from gridrun.tui.app import GridrunApp
from gridrun.tui.screens.dialogs import Prompt
from gridrun.tui.store_source import StoreSource

MATRIX = """
[experiments.sweep]
task = "spirals"
epochs = 2
grid = { lr = [0.5, 1.0] }
"""


@pytest.fixture
def cells(tmp_path) -> list[RunSpec]:
    f = tmp_path / "e.toml"
    f.write_text(MATRIX)
    return load_runs(f)


@pytest.fixture
def source(tmp_path, cells) -> StoreSource:
    root = tmp_path / "runs"
    with Store(root) as store:
        store.enqueue(cells[:1])  # lr = 0.5
    return StoreSource(root)


def queued(source: StoreSource) -> set[str]:
    return {r.id for r in source.store.list_runs()}


@pytest.mark.parametrize(("override", "message"), [
    ("epochs=0", "epochs: expected an integer >= 1 and <= 1,000,000, got 0"),
    ("optimizer=adamx", "optimizer: expected one of \"adamw\" | \"adam\" | \"sgd\", got 'adamx'"),
    ("lr=fast", "lr: expected a finite float > 0, got 'fast'"),
    ("hidden=big", "hidden: expected an integer (the task's default is 64), got 'big'"),
    ("learning_rate=0.1", "did you mean 'lr'?"),
])
def test_bad_clones_are_refused_and_queue_nothing(source, cells, override, message):
    before = queued(source)
    with pytest.raises(ValueError, match="clone of") as err:
        source.clone(cells[0].id, override)
    assert message in str(err.value) and "[experiments.sweep]" in str(err.value)
    assert str(err.value).endswith("nothing was queued")
    assert queued(source) == before


def test_two_overrides_in_one_line_and_the_files_coercion(source, cells):
    assert "queued clone" in source.clone(cells[0].id, "epochs=60 lr=0.005")
    run = next(r for r in source.store.list_runs() if r.id != cells[0].id)
    assert run.config["trainer"]["epochs"] == 60 and run.config["trainer"]["lr"] == 0.005
    assert run.variant == "epochs=60 lr=0.005"
    source.clone(cells[0].id, "lr=1")  # the file's `lr = 1.0` cell, to the id
    assert cells[1].id in queued(source)
    assert source.store.get_run(cells[1].id).variant == cells[1].variant


@aio
async def test_the_dialog_shows_the_refusal_and_stays_open(tmp_path, cells):
    root = tmp_path / "runs"
    with Store(root) as store:
        store.enqueue(cells[:1])
    source = StoreSource(root)
    app = GridrunApp(source, live=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("d")
        assert isinstance(app.screen, Prompt)
        await pilot.press(*"epochs=0", "enter")
        problem = app.screen.query_one("#problem")
        await until(pilot, lambda: "expected an integer" in str(problem.render()))
        assert "nothing was queued" in str(problem.render()) and isinstance(app.screen, Prompt)
        assert queued(source) == {cells[0].id}
        app.screen.query_one("#answer").value = "epochs=60 lr=0.005"
        await pilot.press("enter")
        await until(pilot, lambda: not isinstance(app.screen, Prompt))
        assert len(queued(source)) == 2


def test_comma_separated_overrides_and_every_problem_at_once(source, cells):
    assert "queued clone" in source.clone(cells[0].id, "epochs=60, lr=0.005")
    run = next(r for r in source.store.list_runs() if r.id != cells[0].id)
    assert run.config["trainer"]["epochs"] == 60 and run.config["trainer"]["lr"] == 0.005
    before = queued(source)
    with pytest.raises(ValueError) as err:
        source.clone(cells[0].id, "epochs=0 lr=fast")  # two bad keys: both said, one line each
    text = str(err.value)
    assert "epochs: expected an integer >= 1" in text and "lr: expected a finite float" in text
    assert queued(source) == before
