"""The queue commands as a user types them: real store, real engine, real runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import patience
import pytest
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.commands.engine import provenance
from gridrun.engine import daemon
from gridrun.runs import states
from gridrun.runs.store import Store

TINY = """
[defaults]
epochs = 1
batch_size = 64
seeds = 2

[experiments.tiny]
task = "spirals"
train_size = 256
val_size = 64
hidden = 8
depth = 1
grid = {{ lr = [1e-3, 3e-3] }}
{extra}
[engine]
cpu_slots = 2
"""

runner = CliRunner()


def gridrun(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "runs"
    yield root
    if daemon.status(root).running:
        daemon.stop(root, force=True)


@pytest.fixture
def tiny(tmp_path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(extra=""))
    return path


def test_queue_validates_first_and_skips_known_cells(tmp_path, root, tiny):
    bad = tmp_path / "bad.toml"
    bad.write_text(TINY.format(extra="lrr = 3"))
    code, out = gridrun("queue", str(bad), "--root", str(root))
    assert code == 2 and "lrr" in out and "nothing was queued" in out
    assert not (root / "gridrun.db").exists() or Store(root).list_runs() == []

    code, out = gridrun("queue", str(tiny), "--root", str(root))
    assert code == 0 and "queued 4 runs" in out and "engine is not running" in out
    code, out = gridrun("queue", str(tiny), "--root", str(root))
    assert code == 0 and "queued 0 runs" in out and "skipped 4" in out
    code, out = gridrun("queue", str(tiny), "--force", "--root", str(root))
    assert "skipped 4" in out  # queued ones are never queued twice, even with --force

    code, out = gridrun("ls", "--json", "--root", str(root))
    runs = json.loads(out)
    assert len(runs) == 4 and {r["status"] for r in runs} == {states.QUEUED}
    assert set(runs[0]["provenance"]) >= {"git_commit", "dirty", "diff_sha256"}


def test_provenance_of_a_git_checkout():
    here = provenance(Path(__file__).parent)
    assert re.fullmatch(r"[0-9a-f]{40}", here["git_commit"]) and isinstance(here["dirty"], bool)
    assert provenance(Path("/"))["git_commit"] is None


def test_cancel_retry_pause_resume_by_prefix(root, tiny):
    gridrun("queue", str(tiny), "--root", str(root))
    ids = [r.id for r in Store(root).list_runs()]
    code, out = gridrun("cancel", ids[0][:6], ids[1], "--root", str(root))
    assert code == 0 and f"{ids[0]}: cancelled" in out and f"{ids[1]}: cancelled" in out
    code, out = gridrun("retry", ids[0][:7], "--root", str(root))
    assert code == 0 and f"{ids[0]}: queued" in out
    code, out = gridrun("cancel", "zzz", "--root", str(root))
    assert code == 2 and "no run matches 'zzz'" in out
    code, out = gridrun("pause", "--root", str(root))
    assert code == 0 and Store(root).paused
    code, out = gridrun("engine", "status", "--root", str(root))
    assert "not running" in out and "paused" in out and "1 cancelled" in out
    gridrun("resume", "--root", str(root))
    assert not Store(root).paused
    code, out = gridrun("ls", "--root", str(root))
    assert code == 0 and ids[1] in out and "cancelled" in out


def test_two_clis_queue_the_same_file_at_once(root, tiny):
    env = {**os.environ, "GRIDRUN_ROOT": str(root)}
    procs = [subprocess.Popen([sys.executable, "-m", "gridrun", "queue", str(tiny)], env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [patience.communicate(p, 60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    queued = sum(int(re.search(r"queued (\d+)", o).group(1)) for o in outs)
    assert queued == 4 and len(Store(root).list_runs()) == 4


@pytest.mark.slow
def test_run_wait_trains_the_file_and_says_where_results_are(tmp_path, root):
    spec = tmp_path / "mixed.toml"
    spec.write_text(TINY.format(extra='\n[experiments.broken]\ntask = "helper_tasks:crash"\n'
                                      'at_step = 1\ntrain_size = 128\n'))
    ok = tmp_path / "ok.toml"
    ok.write_text(TINY.format(extra=""))
    env = {**os.environ, "GRIDRUN_ROOT": str(root)}
    done = patience.run([sys.executable, "-m", "gridrun", "run", str(ok), "--wait"], env=env,
                        capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4/4 ended" in done.stdout and f"results: {root / 'tiny'}" in done.stdout
    assert {r.status for r in Store(root).list_runs()} == {states.COMPLETED}

    run_id = Store(root).list_runs()[0].id
    code, out = gridrun("logs", run_id[:5], "--root", str(root))
    assert code == 0 and "train step" in out

    # --no-check: the task check would refuse a task that crashes on its first batch
    failing = patience.run([sys.executable, "-m", "gridrun", "run", str(spec), "--wait", "--no-check"],
                           env=env, capture_output=True, text=True, timeout=240)
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "skipped 4" in failing.stdout and "2 failed" in failing.stdout
    code, out = gridrun("engine", "stop", "--root", str(root))
    assert code == 0 and "engine stopped" in out


@pytest.mark.parametrize("command", [["run", "--wait"], ["queue"]])
def test_ray_backend_without_ray_says_which_extra_and_queues_nothing(tmp_path, root, monkeypatch,
                                                                      command):
    path = tmp_path / "ray.toml"
    path.write_text(TINY.format(extra="").replace("cpu_slots = 2", 'backend = "ray"'))
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    code, out = gridrun(command[0], str(path), *command[1:], "--root", str(root))
    assert code == 2
    assert "pip install 'gridrun[ray]'" in out and "nothing was queued" in out
    assert not (root / "gridrun.db").exists() or not Store(root).list_runs()
    assert not daemon.status(root).running
