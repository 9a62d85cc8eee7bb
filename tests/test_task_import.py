"""One import rule for task modules: every command imports a `package.module:factory`
as the engine's workers do, the current directory first (as `python -m` puts it), and a
failed import says where it looked and what to do.

The bug this guards: the `gridrun` console script (whose sys.path starts at its own
bin folder, not the current directory) could not import a task package in the current
directory, while `python -m gridrun` and the engine's workers could. So the end-to-end
tests run the console script itself, in a subprocess, with no PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import patience
import pytest

from gridrun import tasks

TASK = '''
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from gridrun import Task


def make(hidden: int = 8):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(160, 2, generator=g)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def loss(m, b):
        return F.cross_entropy(m(b[0]), b[1])

    def evaluate(m, b):
        out = m(b[0])
        return {"loss": (F.cross_entropy(out, b[1], reduction="sum"), len(b[1])),
                "accuracy": ((out.argmax(1) == b[1]).sum(), len(b[1]))}

    return Task(model=model, train_data=TensorDataset(x[:128], y[:128]),
                val_data=TensorDataset(x[128:], y[128:]), loss=loss, evaluate=evaluate,
                metrics={"loss": "lower", "accuracy": "higher"})
'''

EXPERIMENT = """
[experiments.lab]
task = "{package}.digits:make"
epochs = 1
batch_size = 32
"""


def write_package(folder: Path, package: str, body: str = TASK) -> Path:
    pkg = folder / package
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "digits.py").write_text(body)
    (folder / "exp.toml").write_text(EXPERIMENT.format(package=package))
    return folder / "exp.toml"


@pytest.fixture
def away_from_path(tmp_path, monkeypatch):
    """The current directory is tmp_path and not on sys.path (as under the console script)."""
    monkeypatch.chdir(tmp_path)
    here = {"", ".", str(tmp_path), os.getcwd()}
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in here])
    return tmp_path


def test_a_package_in_the_current_directory_resolves(away_from_path):
    write_package(away_from_path, "cwdlab_resolves")
    factory = tasks.resolve("cwdlab_resolves.digits:make")
    assert factory.__module__ == "cwdlab_resolves.digits"
    assert str(away_from_path) == sys.path[0]  # first, as `python -m` puts it


def test_a_missing_package_says_where_it_looked_and_what_to_do(away_from_path):
    with pytest.raises(tasks.TaskNotFound) as caught:
        tasks.resolve("nolab_anywhere.digits:make")
    text = str(caught.value)
    assert "No module named 'nolab_anywhere'" in text
    assert str(away_from_path) in text  # where it looked
    assert "pip install" in text and "run gridrun from the folder that holds nolab_anywhere/" in text
    assert "\n" not in text


def test_a_dependency_the_task_imports_is_named_as_such(away_from_path):
    write_package(away_from_path, "cwdlab_dep", "import not_installed_anywhere_xyz\n")
    with pytest.raises(tasks.TaskNotFound) as caught:
        tasks.resolve("cwdlab_dep.digits:make")
    text = str(caught.value)
    assert "'not_installed_anywhere_xyz'" in text and "imports" in text
    assert "run gridrun from the folder" not in text  # the task itself was found


def test_the_old_import_path_gets_a_one_line_hint(away_from_path):
    write_package(away_from_path, "cwdlab_old", "from gridrun.engine.tasks import Task\n")
    with pytest.raises(tasks.TaskNotFound) as caught:
        tasks.resolve("cwdlab_old.digits:make")
    text = str(caught.value)
    assert "write `from gridrun import Task`" in text and "\n" not in text


# --------------------------------------------------------------------------- the console script

def console_script() -> Path:
    """The `gridrun` console script of this interpreter's environment (or on PATH) that
    runs this checkout; the test skips without one."""
    checkout = Path(tasks.__file__).resolve().parents[2]
    candidates = [Path(sys.executable).with_name("gridrun")]
    if (found := shutil.which("gridrun")) is not None:
        candidates.append(Path(found))
    seen = []
    for script in candidates:
        if not script.is_file():
            continue
        shebang = script.read_text(errors="replace").splitlines()[0]
        python = shebang[2:].strip().split()[0] if shebang.startswith("#!") else sys.executable
        out = patience.run([python, "-c", "import gridrun; print(gridrun.__file__)"],
                           capture_output=True, text=True, cwd="/", env=clean_env(), timeout=120)
        where = Path(out.stdout.strip()).resolve().parents[1] if out.returncode == 0 else None
        if where == checkout:
            return script
        seen.append(f"{script} runs {where}")
    pytest.skip("no gridrun console script runs this checkout" + (f" ({'; '.join(seen)})" if seen else ""))


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRIDRUN_ROOT")}


def gridrun(script: Path, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return patience.run([str(script), *args], cwd=cwd, env=clean_env(), capture_output=True,
                        text=True, timeout=timeout)


def test_the_console_script_plans_trains_and_queues_a_package_in_the_current_directory(tmp_path):
    script = console_script()
    write_package(tmp_path, "cwdlab_script")
    checked = gridrun(script, "plan", "--check", "exp.toml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "task check passed" in checked.stdout

    trained = gridrun(script, "train", "exp.toml", "--root", "fg", cwd=tmp_path)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    (run_dir,) = (tmp_path / "fg" / "lab").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"

    queued = gridrun(script, "queue", "exp.toml", "--root", "bg", cwd=tmp_path)
    assert queued.returncode == 0, queued.stderr
    assert "queued 1 run" in queued.stdout
    started = gridrun(script, "engine", "start", "--root", "bg", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    try:
        deadline, status = patience.Deadline(240), None
        while not deadline.passed():
            listed = gridrun(script, "ls", "--json", "--root", "bg", cwd=tmp_path)
            (row,) = json.loads(listed.stdout)
            status = row["status"]
            if status not in ("queued", "running"):
                break
            time.sleep(1)
        assert status == "completed", row.get("error")
    finally:
        gridrun(script, "engine", "stop", "--root", "bg", cwd=tmp_path)


def test_queue_warns_when_the_running_engine_imports_from_another_folder(away_from_path, capsys):
    from types import SimpleNamespace

    from gridrun.commands.engine import _elsewhere
    from gridrun.spec import load_runs

    file = write_package(away_from_path, "cwdlab_elsewhere")
    runs = load_runs(file)  # imports the package from the current directory
    _elsewhere(SimpleNamespace(cwd=str(away_from_path)), runs)
    assert capsys.readouterr().err == ""  # the engine runs here: nothing to say
    _elsewhere(SimpleNamespace(cwd="/"), runs)
    err = capsys.readouterr().err
    assert "the engine runs in / and its workers import task packages from there" in err
    assert "'cwdlab_elsewhere'" in err
