"""One fixture file per failure mode: exit code 2, the words of the message, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.spec import SpecError, load_runs

FIXTURES = Path(__file__).parent / "spec_fixtures"

# fixture -> fragments that must all appear in stderr (file:line is checked separately)
CASES = {
    "syntax": ["syntax.toml:3:12:", "not valid TOML", "Expected newline"],
    "not_toml": ["not_toml.toml:1:1:", "not valid TOML"],
    "binary": ["binary.toml:", "not UTF-8"],
    "unknown_key": ["unknown_key.toml:3:", "[experiments.a]", "lrr", "unknown key",
                    "did you mean 'lr'?"],
    "wrong_type": ["wrong_type.toml:3:", "batch_size",
                   "expected an integer >= 1 and <= 16,777,216, got 'big'"],
    "out_of_range": ["out_of_range.toml:3:", "lr: expected a float > 0, got 0",
                     "out_of_range.toml:4:",
                     "batch_size: expected an integer >= 1 and <= 16,777,216, got 0",
                     "out_of_range.toml:5:", "accumulate: expected an integer >= 1 and <= 65,536, got 0",
                     "out_of_range.toml:6:",
                     "warmup: expected a step count >= 0 and <= 1,099,511,627,776, got -1",
                     "out_of_range.toml:7:", "seeds: expected a count >= 1", "5 problems"],
    "unknown_choice": ['optimizer: expected one of "adamw" | "adam" | "sgd", got \'adamw2\'',
                       "did you mean 'adamw'?", "schedule:", "did you mean 'cosine'?",
                       "precision:", "got 'fp8'"],
    "zip_unequal": ["zip_unequal.toml:3:", "zip lists must have equal lengths",
                    "lr has 3, hidden has 2"],
    "empty_axis": ["empty_axis.toml:3:", "grid.lr", "expected a non-empty array"],
    "unknown_task": ["unknown_task.toml:2:", "unknown task 'spiral'", "did you mean 'spirals'?",
                     "package.module:factory"],
    "bad_factory": ["bad_factory.toml:2:", "cannot import module 'no_such_package.tasks'",
                    "No module named 'no_such_package'"],
    "bad_task_key": ["bad_task_key.toml:3:", "hiden", "not a parameter of the task",
                     "did you mean 'hidden'?"],
    "no_task": ["no_task.toml:4:", "[experiments.a]", "has no task", 'task = "spirals"'],
    "unsafe_name": ["unsafe_name.toml:1:", '[experiments."../escape"]', "folder name",
                    "letters, digits"],
    "too_many_runs": ["10,100 runs", "cap of 10,000", "--force"],
    "huge_matrix": ["1,000,000 runs", "cap of 10,000", "[experiments.huge]"],
    "long_name": ["long_name.toml:2:", "experiment name", "at most 100 characters"],
    "deep_nesting": ["deep_nesting.toml:", "not valid TOML", "nested too deeply"],
    "duplicate_cells": ["duplicate_cells.toml:1:", "same config", "'baseline' and 'same-lr'"],
    "bad_engine": ["bad_engine.toml:5:", "engine.runs_per_gpu: expected an integer >= 1 or \"auto\" (as many as "
                   "their measured memory fits), got 0",
                   "bad_engine.toml:6:", 'expected "local" or "ray" or "slurm"',
                   "did you mean 'slurm'?",
                   "bad_engine.toml:7:", "did you mean 'gpus'?"],
    "unbounded_engine": ["unbounded_engine.toml:5:", "engine.runs_per_gpu: expected an integer >= 1 "
                         'and <= 64 or "auto", got 1000000000', 'write runs_per_gpu = "auto"',
                         "unbounded_engine.toml:6:", "engine.cpu_slots: expected an integer >= 1 "
                         "and <= 4,096, got 1000000000", "write cpu_slots ="],
    "many_problems": ["many_problems.toml:3:", "lr: expected a float > 0, got -1",
                      "many_problems.toml:6:", "did you mean 'optimizer'?",
                      "many_problems.toml:7:", "grid.batch_size", "got '64'",
                      "many_problems.toml:10:", "[experiments.b]", "unknown task 'spiral'",
                      "4 problems"],
}


def plan(*args: str):
    return CliRunner().invoke(app, ["plan", *args])


def test_every_fixture_has_a_case():
    assert {p.stem for p in FIXTURES.glob("*.toml")} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_file_exits_2_with_the_problem(name):
    result = plan(str(FIXTURES / f"{name}.toml"))
    assert result.exit_code == 2, result.output
    err = result.stderr
    for fragment in CASES[name]:
        assert fragment in err, f"{fragment!r} not in:\n{err}"
    assert "Traceback" not in result.output
    assert result.stdout == ""
    assert "nothing was changed" in err


@pytest.mark.parametrize("name", sorted(CASES))
def test_load_runs_raises_spec_error_with_structured_problems(name):
    with pytest.raises(SpecError) as info:
        load_runs(FIXTURES / f"{name}.toml")
    problems = info.value.problems
    assert problems
    assert all(p.file.endswith(f"{name}.toml") for p in problems)
    assert str(info.value).count("\n") == len(problems) - 1


def test_problem_fields():
    with pytest.raises(SpecError) as info:
        load_runs(FIXTURES / "unknown_key.toml")
    (p,) = info.value.problems
    assert (p.line, p.experiment, p.key, p.suggestion) == (3, "a", "lrr", "lr")
    with pytest.raises(SpecError) as info:
        load_runs(FIXTURES / "syntax.toml")
    (p,) = info.value.problems
    assert (p.line, p.column) == (3, 12)


def test_force_lifts_the_cap():
    result = plan("--force", str(FIXTURES / "too_many_runs.toml"))
    assert result.exit_code == 0, result.stderr
    assert "total: 10100 runs" in result.stdout
    assert len(load_runs(FIXTURES / "too_many_runs.toml", cap=20_000)) == 10_100


def test_missing_file_is_a_usage_error(tmp_path):
    result = plan(str(tmp_path / "nope.toml"))
    assert result.exit_code == 2
    assert "does not exist" in result.output


def test_repeated_grid_value_is_named(tmp_path):
    f = tmp_path / "e.toml"
    f.write_text('[experiments.a]\ntask = "spirals"\ngrid = { lr = [1e-3, 0.001] }\n')
    result = plan(str(f))
    assert result.exit_code == 2
    assert "e.toml:3:" in result.stderr
    assert "the value 0.001 is listed twice" in result.stderr


def test_inline_table_key_gets_the_line_of_its_key(tmp_path):
    f = tmp_path / "e.toml"
    f.write_text('[experiments.a]\ntask = "spirals"\n\n'
                 'ablations.fast = { lr = 0.1, batchsize = 3 }\n')
    result = plan(str(f))
    assert result.exit_code == 2
    assert "e.toml:4:" in result.stderr
    assert "ablations.fast.batchsize" in result.stderr
    assert "did you mean 'batch_size'?" in result.stderr


@pytest.mark.parametrize("text, words", [
    ('[experiments.a]\ntask = "spirals"\nbetas = [0.9]\n', "expected an array of 2 floats"),
    ('[experiments.a]\ntask = "spirals"\nhidden = 1.5\n', "expected an integer"),
    ('[experiments.a]\ntask = "spirals"\nwarmup = 1.5\n', "fraction in [0, 1)"),
    ('[experiments.a]\ntask = "spirals"\nseeds = [1, 1]\n', "seeds are repeated"),
    ('[experiments.a]\ntask = "spirals"\ngrid = { seeds = [1, 2] }\n', "cannot vary in grid"),
    ('[experiments.a]\ntask = "spirals"\nablations.baseline = { lr = 0.1 }\n', "'baseline' is"),
    ('[experiments.a]\ntask = "spirals"\ngrid = { lr = [0.1] }\nzip = { lr = [0.2] }\n',
     "in both grid and zip"),
    ('[experiment.a]\ntask = "spirals"\n', "did you mean 'experiments'?"),
    ('[defaults]\ntask = "spirals"\n', "no experiments"),
    ('[experiments.a]\ntask = 3\n', "expected a string, got an integer"),
])
def test_more_problems(tmp_path, text, words):
    f = tmp_path / "e.toml"
    f.write_text(text)
    result = plan(str(f))
    assert result.exit_code == 2, result.output
    assert words in result.stderr


@pytest.mark.parametrize("task, key, meant", [
    ("spirals", "n_layers", "depth"),      # issue 35: it was 'dropout_layers'
    ("spirals", "num_layers", "depth"),
    ("sort", "n_layers", "layers"),
    ("sort", "num_layer", "layers"),
    ("spirals", "hidden_size", "hidden"),
    ("spirals", "n_hidden", "hidden"),
    ("spirals", "hiden", "hidden"),
    ("spirals", "dropout_rate", "dropout"),  # its own parameter, not the trainer switch
    ("spirals", "layers", "depth"),        # not 'dropout_layers' (a trainer switch)
    ("spirals", "n_heads", None),          # nothing near: no guess rather than a wrong one
    ("sort", "n_blocks", None),
])
def test_a_misspelled_task_key_gets_the_key_it_means_or_none(tmp_path, task, key, meant):
    f = tmp_path / "e.toml"
    f.write_text(f'[experiments.a]\ntask = "{task}"\n{key} = 2\n')
    result = plan(str(f))
    assert result.exit_code == 2, result.output
    assert f"unknown key {key!r}" in result.stderr
    if meant is None:
        assert "did you mean" not in result.stderr, result.stderr
    else:
        assert f"(did you mean {meant!r}?)" in result.stderr, result.stderr
