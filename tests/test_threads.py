"""A run's CPU threads: "auto" is one a CPU process on any machine (a GPU run's from
the affinity mask), never an ambient OMP_NUM_THREADS, the slots or the queue; set
before anything computes; recorded with the CPU facts that decide its bits; kept
when the run resumes; replayed by `verify`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import patience
import pytest
import torch

from gridrun.checks import verdict
from gridrun.checks.verify import verify
from gridrun.runs import layout, states
from gridrun.spec import SpecError, load_runs
from gridrun.train import threads

# shapes (convolutions, BatchNorm) ends with other weights on 1 thread than on 2
CELL = """
[experiments.cell]
task = "shapes"
epochs = 1
train_size = 256
val_size = 64
batch_size = 64
"""
MULTICORE = pytest.mark.skipif(threads.usable_cores() < 2, reason="needs 2 usable cores")


@pytest.fixture(autouse=True)
def threads_put_back():
    before = threads.apply(torch.get_num_threads())
    yield
    threads.restore(before)


def test_auto_is_one_on_the_cpu_and_a_gpu_runs_comes_from_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.usable_cores() == 3
    assert threads.resolve("auto", gpu=False) == 1  # whatever the machine
    assert threads.resolve("auto", gpu=False, cores=32) == 1
    assert threads.resolve("auto", gpu=True) == 3  # min(4, cores)
    assert threads.resolve("auto", gpu=True, cores=32) == threads.GPU_THREADS == 4
    assert threads.resolve(1, gpu=False) == 1 and threads.resolve(8, gpu=True) == 8


def test_threads_is_checked_and_never_part_of_the_run_id(tmp_path):
    file = tmp_path / "e.toml"
    file.write_text(CELL)
    default = load_runs(file)[0]
    assert default.trainer["threads"] == "auto"
    file.write_text(CELL + "threads = 1\n")
    one = load_runs(file)[0]
    assert one.id == default.id and one.trainer["threads"] == 1
    file.write_text(CELL + "threads = 0\n")
    with pytest.raises(SpecError, match=r'threads: expected "auto" or an integer >= 1, got 0'):
        load_runs(file)


def gridrun(*args: str, cwd: Path, env: dict[str, str] | None = None,
            affinity: set[int] | None = None) -> subprocess.CompletedProcess:
    """`python -m gridrun ARGS` with `env` as its only thread settings."""
    base = {k: v for k, v in os.environ.items() if k not in threads.ENV}
    return patience.run(
        [sys.executable, "-m", "gridrun", *args], cwd=cwd, capture_output=True, text=True,
        env={**base, **(env or {})}, timeout=600,
        preexec_fn=(lambda: os.sched_setaffinity(0, affinity)) if affinity else None)


def summary_of(root: Path) -> dict:
    (run_dir,) = (root / "cell").iterdir()
    return json.loads((run_dir / layout.SUMMARY).read_text())


@MULTICORE
def test_the_runs_own_threads_win_over_OMP_NUM_THREADS_and_verify_passes_under_both(tmp_path):
    (tmp_path / "e.toml").write_text(CELL + "threads = 2\n")
    env_one = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    plain: dict[str, str] = {}
    outcomes = {}
    for name, env in (("default", plain), ("omp1", env_one)):
        done = gridrun("train", "e.toml", "--root", name, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        outcomes[name] = summary_of(tmp_path / name)
    default, omp1 = outcomes["default"], outcomes["omp1"]
    assert default["weights_sha256"] == omp1["weights_sha256"]
    cores = threads.usable_cores()
    for summary in (default, omp1):
        env = summary["environment"]
        assert env["threads"] == 2 and env["cores"] == cores
        assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
        assert env["blas"] and "cpu" in env and "onednn" in env
    for name, env in (("default", env_one), ("omp1", plain)):
        checked = gridrun("verify", default["run_id"], "--root", name, cwd=tmp_path, env=env)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "bitwise identical" in checked.stdout


def test_auto_on_the_cpu_is_one_thread_whatever_omp_num_threads_says(tmp_path):
    (tmp_path / "e.toml").write_text(CELL)
    done = gridrun("train", "e.toml", "--root", "r", cwd=tmp_path,
                   env={"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stdout + done.stderr
    recorded = summary_of(tmp_path / "r")
    assert recorded["environment"]["threads"] == 1
    assert [a["threads"] for a in recorded["attempts"]] == [1]


@MULTICORE
def test_verify_replays_with_the_recorded_threads_on_a_machine_with_fewer_cores(tmp_path):
    (tmp_path / "e.toml").write_text(CELL + "threads = 2\n")
    assert gridrun("train", "e.toml", "--root", "r", cwd=tmp_path).returncode == 0
    recorded = summary_of(tmp_path / "r")
    assert recorded["environment"]["threads"] == 2
    # as a run of an older version recorded it: "auto", its threads resolved then (2);
    # "auto" is 1 thread now, and 1 core here: the replay must still compute with 2
    (run_dir,) = (tmp_path / "r" / "cell").iterdir()
    config = run_dir / layout.CONFIG
    config.write_text(config.read_text().replace("threads = 2", 'threads = "auto"'))
    checked = gridrun("verify", recorded["run_id"], "--root", "r", cwd=tmp_path, affinity={0})
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (run_dir,) = (tmp_path / "r" / "cell").iterdir()
    assert verdict.read(run_dir)["ok"]


def test_verify_names_the_environment_field_that_differs(tmp_path):
    (tmp_path / "e.toml").write_text(CELL.replace("shapes", "spirals").replace("64\n", "32\n"))
    run = load_runs(tmp_path / "e.toml")[0]
    from gridrun.spec import write_run_config
    from gridrun.train import worker
    from gridrun.train.loop.trainer import train

    run_dir = tmp_path / "cell" / run.id
    layout.make_private_dir(run_dir.parent)
    layout.make_private_dir(run_dir)
    write_run_config(run_dir / layout.CONFIG, run)
    summary = worker.json_safe(train(run, run_dir, log=lambda s: None))
    assert summary["status"] == states.COMPLETED
    # as if recorded on a machine whose kernels dispatch to AVX2, with another loss
    summary["environment"]["cpu_capability"] = "made-up"
    worker.write_summary(run_dir, summary)
    lines = (run_dir / layout.METRICS).read_text().splitlines()
    first = json.loads(lines[1])
    first["loss"] += 1e-9
    lines[1] = json.dumps(first)
    (run_dir / layout.METRICS).write_text("\n".join(lines) + "\n")
    result = verify(run_dir)
    assert not result["ok"]
    assert result["environment"] == {
        "cpu_capability": {"recorded": "made-up",
                           "replayed": torch.backends.cpu.get_cpu_capability()}}
    text = verdict.describe(result)
    assert "the environment differs: cpu_capability recorded 'made-up'" in text
    shutil.rmtree(run_dir)
