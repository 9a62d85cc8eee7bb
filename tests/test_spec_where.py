"""A problem is reported once, at the line where the bad value is written: a key an
experiment inherits from [defaults] at its line in [defaults] (not at every experiment's
header), a misspelt table name at its header, a key an ablation sets at the ablation."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gridrun.cli import app

EXAMPLE = Path(__file__).resolve().parents[1] / "experiments.toml"
BUILT_IN = ("built-in tasks are images, shapes, sort, spirals, or write "
            "'package.module:factory' for a task of your own")


def plan(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["plan", str(path)])
    assert "Traceback" not in result.output
    return result.exit_code, result.stderr


def line_of(path: Path, text: str) -> int:
    """The number of the first line of `path` that starts with `text`."""
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if line.startswith(text))


def example_with(tmp_path: Path, old: str, new: str) -> Path:
    """The README's example with one edit (its line numbers are read, not assumed)."""
    text = EXAMPLE.read_text()
    assert old in text
    path = tmp_path / "experiments.toml"
    path.write_text(text.replace(old, new, 1))
    return path


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "e.toml"
    path.write_text(text)
    return path


def test_a_misspelt_task_in_defaults_is_reported_once_at_its_line(tmp_path):
    path = example_with(tmp_path, 'task = "spirals"', 'task = "spiral"')
    code, err = plan(path)
    line = line_of(path, 'task = "spiral"')
    assert code == 2
    assert err == (f"{path}:{line}: [defaults] task: unknown task 'spiral': {BUILT_IN} "
                   "(did you mean 'spirals'?)\n"
                   f"1 problem in {path}; nothing was changed.\n")


def test_a_misspelt_table_name_gets_its_line(tmp_path):
    path = example_with(tmp_path, "[experiments.tricks]", "[experiment.tricks]")
    code, err = plan(path)
    line = line_of(path, "[experiment.tricks]")
    assert code == 2
    assert err == (f"{path}:{line}: unknown table 'experiment': a file holds [defaults], "
                   "[experiments.NAME] and [engine] (did you mean 'experiments'?)\n"
                   f"1 problem in {path}; nothing was changed.\n")


def test_a_table_written_only_through_its_subtables_gets_the_first_ones_line(tmp_path):
    path = write(tmp_path, '[defaults]\ntask = "spirals"\n\n[experimentz.a.grid]\nlr = [0.1]\n')
    code, err = plan(path)
    assert code == 2 and err.startswith(f"{path}:4: unknown table 'experimentz'")


def test_a_task_of_the_wrong_type_in_defaults_is_reported_once_at_its_line(tmp_path):
    path = write(tmp_path, '[defaults]\ntask = 7\n\n[experiments.a]\nlr = 0.1\n\n'
                 '[experiments.b]\nlr = 0.2\n')
    code, err = plan(path)
    assert code == 2
    assert err.splitlines() == [f"{path}:2: [defaults] task: expected a string, got an integer",
                                f"1 problem in {path}; nothing was changed."]


def test_a_task_that_cannot_be_imported_from_defaults_is_reported_once_at_its_line(tmp_path):
    path = write(tmp_path, '[defaults]\nepochs = 1\ntask = "no_such_package.tasks:make"\n\n'
                 '[experiments.a]\nlr = 0.1\n\n[experiments.b]\nlr = 0.2\n')
    code, err = plan(path)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 2, err
    assert lines[0].startswith(f"{path}:3: [defaults] task: cannot import module "
                               "'no_such_package.tasks'")


def test_an_experiments_own_task_is_still_reported_at_its_own_line(tmp_path):
    path = write(tmp_path, '[defaults]\ntask = "spirals"\n\n[experiments.a]\nlr = 0.1\n\n'
                 '[experiments.b]\ntask = "spiral"\n')
    code, err = plan(path)
    assert code == 2
    assert err.splitlines()[0] == (f"{path}:8: [experiments.b] task: unknown task 'spiral': "
                                   f"{BUILT_IN} (did you mean 'spirals'?)")


def test_bad_seeds_in_defaults_are_named_as_defaults_once(tmp_path):
    path = write(tmp_path, '[defaults]\ntask = "spirals"\nseeds = 0\n\n[experiments.a]\nlr = 0.1\n'
                 '\n[experiments.b]\nlr = 0.2\n')
    code, err = plan(path)
    assert code == 2
    assert err.splitlines() == [
        f"{path}:3: [defaults] seeds: expected a count >= 1 or a non-empty array of integers, "
        "got 0", f"1 problem in {path}; nothing was changed."]


def test_devices_that_do_not_divide_accumulate_in_defaults_are_reported_once(tmp_path):
    path = write(tmp_path, '[defaults]\ntask = "spirals"\naccumulate = 3\ndevices = 2\n\n'
                 '[experiments.a]\ngrid = { lr = [0.1, 0.2] }\n\n[experiments.b]\nlr = 0.2\n')
    code, err = plan(path)
    assert code == 2
    assert err.splitlines() == [
        f"{path}:4: [defaults] devices: devices = 2 does not divide accumulate = 3: each device "
        "takes an equal share of a step's micro-batches; use devices in [1, 3] or accumulate a "
        "multiple of 2", f"1 problem in {path}; nothing was changed."]


def test_devices_an_ablation_sets_are_reported_at_the_ablation(tmp_path):
    path = write(tmp_path, '[defaults]\ntask = "spirals"\naccumulate = 2\n\n[experiments.a]\n'
                 'devices = 2\nablations.wide = { devices = 3 }\n')
    code, err = plan(path)
    assert code == 2
    assert err.splitlines()[0] == (
        f"{path}:7: [experiments.a] ablations.wide.devices: devices = 3 does not divide "
        "accumulate = 2 (wide): each device takes an equal share of a step's micro-batches; use "
        "devices in [1, 2] or accumulate a multiple of 3")
