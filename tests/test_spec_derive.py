"""A run with keys changed (the interface's clone): the file's checks, messages and
coercions; the common aliases users type; one read of a file for runs and [engine]."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import patience
import pytest

from gridrun import spec
from gridrun.spec import (
    KEY_ALIASES,
    TRAINER_KEYS,
    EngineConfig,
    SpecError,
    derive,
    load,
    load_runs,
    needs_task,
    parse_overrides,
)

REPO = Path(__file__).resolve().parent.parent
MATRIX = """
[experiments.sweep]
task = "spirals"
epochs = 2
grid = { lr = [0.5, 1.0] }
"""


def runs_of(tmp_path: Path, text: str) -> list[spec.RunSpec]:
    f = tmp_path / "e.toml"
    f.write_text(text)
    return load_runs(f)


def file_problem(tmp_path: Path, line: str) -> str:
    """The message a file gives for `line` in the experiment's table."""
    with pytest.raises(SpecError) as err:
        runs_of(tmp_path, f'[experiments.sweep]\ntask = "spirals"\n{line}\n')
    (problem,) = err.value.problems
    return problem.message


def derive_problem(run: spec.RunSpec, text: str) -> spec.Problem:
    with pytest.raises(SpecError) as err:
        derive(run, text)
    (problem,) = err.value.problems
    return problem


@pytest.fixture
def run(tmp_path):
    return runs_of(tmp_path, MATRIX)[0]  # lr = 0.5


@pytest.mark.parametrize(("override", "in_a_file"), [
    ("epochs=0", "epochs = 0"),
    ("optimizer=adamx", 'optimizer = "adamx"'),
    ("lr=fast", 'lr = "fast"'),
    ("hidden=big", 'hidden = "big"'),  # a task key: the factory's signature decides
    ("warmup=1.5", "warmup = 1.5"),
    ("betas=[0.9]", "betas = [0.9]"),
    ("learning_rate=0.1", "learning_rate = 0.1"),
])
def test_a_bad_clone_is_refused_with_the_files_message(tmp_path, run, override, in_a_file):
    problem = derive_problem(run, override)
    assert problem.message == file_problem(tmp_path, in_a_file)
    assert problem.experiment == "sweep" and problem.key == override.partition("=")[0]
    assert str(problem).startswith(f"clone of {run.id}: [experiments.sweep] ")


def test_every_problem_at_once(run):
    with pytest.raises(SpecError) as err:
        derive(run, "epochs=0 optimizer=adamx lr=fast")
    assert [p.key for p in err.value.problems] == ["epochs", "optimizer", "lr"]
    assert "did you mean 'adam'?" in str(err.value)  # difflib's nearest to 'adamx'


def test_two_overrides_in_one_line(run):
    new = derive(run, "epochs=60 lr=0.005")
    assert (new.trainer["epochs"], new.trainer["lr"]) == (60, 0.005)
    assert new.variant == "epochs=60 lr=0.005" and new.axes == {"lr": 0.005, "epochs": 60}
    assert derive(run, "epochs = 60, lr = 0.005") == new
    assert derive(run, {"epochs": 60, "lr": 0.005}) == new


def test_an_integer_is_coerced_as_a_file_does(tmp_path, run):
    """`lr=1` is the matrix's `lr = 1.0` cell: same value, same id, same label."""
    cell = runs_of(tmp_path, MATRIX)[1]
    new = derive(run, "lr=1")
    assert new.trainer["lr"] == 1.0 and isinstance(new.trainer["lr"], float)
    assert (new.id, new.variant) == (cell.id, cell.variant) == (cell.id, "lr=1")
    assert derive(run, "hidden=64").id == run.id  # the task's default: the same run


def test_task_keys_are_checked_and_coerced(run):
    new = derive(run, "hidden=128 dropout=0")
    assert new.task_args["hidden"] == 128 and new.task_args["dropout"] == 0.0
    assert isinstance(new.task_args["dropout"], float)
    problem = derive_problem(run, "hiden=128")
    assert "not a parameter of the task" in problem.message and problem.suggestion == "hidden"


def test_seed_and_reserved_keys(run):
    assert derive(run, "seed=7").seed == 7 and derive(run, "seed=7").variant == run.variant
    assert derive(run, "seed=7").id != run.id
    assert "cannot change in a clone" in derive_problem(run, "task=sort").message
    assert "seed=N" in derive_problem(run, "seeds=3").message
    assert "expected an integer >= 0" in derive_problem(run, "seed=-1").message


@pytest.mark.parametrize("text", ["", "0.01", "lr", "lr=", "lr=1 lr=2", "oops lr=1"])
def test_malformed_overrides(run, text):
    with pytest.raises(SpecError) as err:
        derive(run, text)
    assert "key=value" in str(err.value) or "given twice" in str(err.value)


def test_values_are_toml_values_or_bare_words():
    assert parse_overrides('betas=[0.9, 0.95] optimizer=sgd nesterov=true name="a b"') == {
        "betas": [0.9, 0.95], "optimizer": "sgd", "nesterov": True, "name": "a b"}


def test_which_clones_need_the_task():
    assert not needs_task({"lr": 1, "epochs": 3, "seed": 1, "seeds": 2})
    assert needs_task({"hidden": 3}) and needs_task({"learning_rate": 3})


def _python(code: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return patience.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                        cwd=REPO, timeout=120, **kw)


def test_a_trainer_key_clone_never_imports_torch(run):
    done = _python(
        "import json, sys\n"
        "from gridrun.spec import RunSpec, derive, needs_task, parse_overrides\n"
        f"run = RunSpec.from_dict(json.loads({json.dumps(json.dumps(run.to_dict()))}))\n"
        "o = parse_overrides('lr=1 epochs=3 optimizer=sgd')\n"
        "assert not needs_task(o)\n"
        "print(derive(run, o).id)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == derive(run, "lr=1 epochs=3 optimizer=sgd").id


def test_the_derive_subprocess_answers_in_json(run):
    def ask(overrides: str) -> tuple[int, dict]:
        done = patience.run([sys.executable, "-m", "gridrun.spec", "derive"],
                            input=json.dumps({"run": run.to_dict(), "overrides": overrides}),
                            capture_output=True, text=True, cwd=REPO, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
        return done.returncode, json.loads(done.stdout)

    code, answer = ask("hidden=big")
    assert code == 2 and "expected an integer (the task's default is 64), got 'big'" in answer["problems"][0]
    code, answer = ask("hidden=128 lr=1")
    assert code == 0 and spec.RunSpec.from_dict(answer["run"]) == derive(run, "hidden=128 lr=1")


# ---- aliases --------------------------------------------------------------------------------

@pytest.mark.parametrize(("typed", "meant"), [
    ("learning_rate", "lr"), ("optimiser", "optimizer"), ("wd", "weight_decay"),
    ("grad_accum", "accumulate"), ("gradient_accumulation_steps", "accumulate"),
    ("max_epochs", "epochs"), ("num_epochs", "epochs"), ("bs", "batch_size"),
    ("warmup_steps", "warmup"), ("seed", "seeds"), ("mixed_precision", "precision"),
    ("max_grad_norm", "clip_grad"), ("max_iters", "max_steps"), ("lr_scheduler", "schedule"),
    ("Epochs", "epochs"), ("batch-size", "batch_size"),
])
def test_a_file_suggests_the_key_an_alias_means(tmp_path, typed, meant):
    with pytest.raises(SpecError) as err:
        runs_of(tmp_path, f'[experiments.a]\ntask = "spirals"\n"{typed}" = 1\n')
    assert f"did you mean {meant!r}?" in str(err.value)


@pytest.mark.parametrize(("key", "typed", "meant"), [
    ("precision", '"bf16-mixed"', "bf16"), ("precision", "32", "fp32"),
    ("precision", '"float16"', "fp16"), ("optimizer", '"AdamW"', "adamw"),
    ("schedule", '"cos"', "cosine"), ("schedule", '"one_cycle"', "onecycle"),
])
def test_a_file_suggests_the_choice_an_alias_means(tmp_path, key, typed, meant):
    with pytest.raises(SpecError) as err:
        runs_of(tmp_path, f'[experiments.a]\ntask = "spirals"\n{key} = {typed}\n')
    assert f"did you mean {meant!r}?" in str(err.value)


def test_every_alias_names_a_real_key_and_shadows_none():
    assert set(KEY_ALIASES.values()) <= {*TRAINER_KEYS, "seeds"}
    assert not set(KEY_ALIASES) & set(TRAINER_KEYS)


# ---- one read --------------------------------------------------------------------------------

def test_one_read_gives_runs_and_the_engine_table(tmp_path, monkeypatch):
    f = tmp_path / "e.toml"
    f.write_text(MATRIX + "\n[engine]\ncpu_slots = 3\n")
    reads = []
    loading = sys.modules["gridrun.spec.load"]  # the module (the package exports its `load`)
    real = loading.read_text  # the one bounded reader of experiment files (issue 24)
    monkeypatch.setattr(loading, "read_text", lambda path, *a, **k: reads.append(path) or real(path, *a, **k))
    loaded = load(f)
    assert reads == [f]
    assert len(loaded.runs) == 2 and loaded.engine == EngineConfig(cpu_slots=3)
    f.write_text(MATRIX)
    assert load(f).engine is None  # no [engine]: queueing leaves the engine's settings alone
