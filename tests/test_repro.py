"""`gridrun repro`: a standalone script per run that reproduces its first 50 losses bit
for bit (a spirals, a shapes and a user-task run), importing nothing of gridrun
but the task's module (and what it imports: gridrun.tasks, gridrun.randomness)."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import patience
import pytest
import torch
from typer.testing import CliRunner

from gridrun.checks import repro
from gridrun.cli import app
from gridrun.runs import layout, records, runlog, states
from gridrun.spec import load_runs, write_run_config
from gridrun.train.loop.trainer import train

STEPS = 50
ALLOWED = {"gridrun", "gridrun.tasks", "gridrun.randomness"}  # and the task's own module

USER_TASK = '''
import random

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from gridrun import Task, randomness


class Noisy(Dataset):
    """Points whose augmentation draws from python's, NumPy's and torch's generators."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=g)
        self.y = (self.x.sum(1) > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i]
        if randomness.enabled("augment"):
            x = x * (1 + 0.1 * random.random()) + float(np.random.normal()) * 0.05
            x = x + 0.01 * torch.randn(4)
        return {"x": x, "y": self.y[i]}


def collate(items):
    return {"x": torch.stack([i["x"] for i in items]), "y": torch.stack([i["y"] for i in items])}


def factory(hidden: int = 16, p: float = 0.3) -> Task:
    model = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Dropout(p), nn.Linear(hidden, 2))

    def loss(model, batch):
        return F.cross_entropy(model(batch["x"]), batch["y"])

    def evaluate(model, batch):
        return {"loss": (F.cross_entropy(model(batch["x"]), batch["y"], reduction="sum"),
                         batch["y"].numel())}

    return Task(model=model, train_data=Noisy(384, 0), val_data=Noisy(64, 1), loss=loss,
                evaluate=evaluate, metrics={"loss": "lower"}, collate_fn=collate)
'''

CASES = {
    "spirals": 'task = "spirals"\ntrain_size = 512\nval_size = 64\nbatch_size = 16\n'
               'epochs = 2\nlr = 3e-3\nwarmup = 0.1\n',
    "shapes": 'task = "shapes"\ntrain_size = 256\nval_size = 64\nbatch_size = 16\nepochs = 4\n'
              'lr = 3e-3\n',
    "user": 'task = "usertask_repro:factory"\nbatch_size = 8\nepochs = 3\naccumulate = 2\n'
            'optimizer = "sgd"\nlr = 0.05\nschedule = "step"\nstep_size = 20\ngamma = 0.5\n'
            'clip_grad = 1.0\nseed_init = 3\nseeds = [5]\n',
}


@pytest.fixture
def user_task(tmp_path, monkeypatch):
    (tmp_path / "usertask_repro.py").write_text(textwrap.dedent(USER_TASK))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # the script imports a user's task from where it runs
    sys.modules.pop("usertask_repro", None)
    yield tmp_path
    sys.modules.pop("usertask_repro", None)


def trained_run(tmp_path, body: str):
    (tmp_path / "e.toml").write_text(f"[experiments.r]\nlog_every = 1\nmax_steps = {STEPS}\n{body}")
    run = load_runs(tmp_path / "e.toml")[0]
    folder = layout.make_private_dir(tmp_path / "runs" / run.id)
    write_run_config(folder / layout.CONFIG, run)
    summary = train(run, folder, log=lambda s: None)
    assert summary["status"] == states.COMPLETED, summary.get("error")
    (folder / layout.SUMMARY).write_text(json.dumps(summary, default=str))
    return run, folder


def run_isolated(script) -> tuple[list[str], set[str]]:
    """The script's output, and the gridrun modules it imported."""
    code = ("import runpy, sys\nsys.argv = [sys.argv[1]]\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "print('MODULES', ' '.join(m for m in sys.modules if m.split('.')[0] == 'gridrun'))")
    done = patience.run([sys.executable, "-c", code, str(script)], capture_output=True,
                        text=True, timeout=300, env={**os.environ})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    return lines[:-1], set(lines[-1].split()[1:])


@pytest.mark.parametrize("case", list(CASES))
def test_a_repro_script_gives_the_runs_first_50_losses_bit_for_bit(tmp_path, user_task, case):
    run, folder = trained_run(tmp_path, CASES[case])
    script = tmp_path / "repro.py"
    repro.write(folder, script, STEPS)
    assert f"THREADS = {torch.get_num_threads()}\n" in script.read_text()  # the run's own
    lines, modules = run_isolated(script)
    task_module = repro.BUILTIN.get(run.task, run.task).partition(":")[0]
    assert modules <= ALLOWED | {task_module}, modules - ALLOWED
    losses = [float(m[2]) for line in lines if (m := repro.STEP_LINE.match(line))]
    recorded = [r[records.LOSS] for r in runlog.read_all(folder / layout.METRICS)
                if r.get(records.SPLIT) == records.TRAIN]
    assert len(losses) == len(recorded) == STEPS
    assert [x.hex() for x in losses] == [x.hex() for x in recorded]  # bit for bit
    logs = [(int(m[1]), float(m[2]), float(m[3])) for line in lines
            if (m := repro.LOG_LINE.match(line))]
    result = repro.check(folder, logs)
    assert result["ok"] and result["compared"] == STEPS, result


def test_the_command_writes_and_checks(tmp_path, user_task):
    _, folder = trained_run(tmp_path, CASES["spirals"].replace("epochs = 2", "epochs = 1"))
    runner = CliRunner()
    out = tmp_path / "r.py"
    result = runner.invoke(app, ["repro", str(folder), "--steps", "12", "-o", str(out), "--check"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == (
        "bitwise identical: the 12 train lines (loss and lr) the run logged up to step 12")
    again = runner.invoke(app, ["repro", str(folder), "-o", str(out)])
    assert again.exit_code == 2 and "exists: pass --force" in again.stderr
    # a recorded loss that differs is found, with its step
    lines = (folder / layout.METRICS).read_text().splitlines()
    bad = json.loads(lines[4])
    bad["loss"] += 1e-9
    lines[4] = json.dumps(bad)
    (folder / layout.METRICS).write_text("\n".join(lines) + "\n")
    differs = runner.invoke(app, ["repro", str(folder), "--steps", "12", "-o", str(out),
                                  "--check", "--force"])
    assert differs.exit_code == 1
    assert differs.stdout.splitlines()[-1].startswith(f"differs at step {bad['step']}: loss")


def test_a_run_whose_task_no_longer_imports_is_one_line(tmp_path, user_task):
    (tmp_path / "e.toml").write_text(f"[experiments.r]\n{CASES['user']}")
    run = load_runs(tmp_path / "e.toml")[0]
    folder = layout.make_private_dir(tmp_path / "runs" / run.id)
    write_run_config(folder / layout.CONFIG, run)
    config = folder / layout.CONFIG
    config.write_text(config.read_text().replace("usertask_repro:factory", "gone_repro:factory"))
    result = CliRunner().invoke(app, ["repro", str(folder), "-o", str(tmp_path / "x.py")])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()  # one line: the import rule's own message
    assert line.startswith(f"cannot write a repro of run {run.id}: cannot import module "
                           "'gone_repro' for task 'gone_repro:factory': No module named "
                           "'gone_repro'; looked in the current directory")
    assert not (tmp_path / "x.py").exists()


def test_a_full_disk_leaves_the_replaced_script_whole_and_says_so(tmp_path, user_task):
    from tmpfs_kit import fill, mounted

    _, folder = trained_run(tmp_path, CASES["spirals"].replace("epochs = 2", "epochs = 1"))
    with mounted(tmp_path / "small", "2m") as small:
        out = small / "repro.py"
        out.write_text("# my edited repro\n" * 100)
        fill(small)
        result = CliRunner().invoke(app, ["repro", str(folder), "-o", str(out), "--force"])
        assert result.exit_code == 2, result.exception  # not a traceback (exit 1)
        (line,) = result.stderr.strip().splitlines()
        assert line == (f"cannot write {out}: the disk is full; nothing was changed there "
                        "(free space or pick another -o)")
        assert out.read_text() == "# my edited repro\n" * 100
        assert sorted(os.listdir(small)) == ["filler", "repro.py"]  # no temporary left


@pytest.mark.parametrize("where", ["/dev/full", "/etc/gridrun-repro-test.py"])
def test_a_device_or_a_system_folder_is_refused_in_one_line(tmp_path, user_task, where):
    _, folder = trained_run(tmp_path, CASES["spirals"].replace("epochs = 2", "epochs = 1"))
    existed = os.path.lexists(where)
    try:
        result = CliRunner().invoke(app, ["repro", str(folder), "-o", where, "--force"])
        assert result.exit_code == 2, result.output
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"refusing to write {where}: it is ")
        assert os.path.lexists(where) == existed
    finally:
        if not existed and os.path.lexists(where):  # what an unfixed gridrun wrote
            os.unlink(where)


def test_a_link_is_refused_even_with_force(tmp_path, user_task):
    _, folder = trained_run(tmp_path, CASES["spirals"].replace("epochs = 2", "epochs = 1"))
    victim = tmp_path / "victim.py"
    victim.write_text("precious\n")
    link = tmp_path / "repro.py"
    link.symlink_to(victim)
    for extra in ([], ["--force"]):
        result = CliRunner().invoke(app, ["repro", str(folder), "-o", str(link), *extra])
        assert result.exit_code == 2 and "symbolic link" in result.stderr
    assert victim.read_text() == "precious\n" and link.is_symlink()
