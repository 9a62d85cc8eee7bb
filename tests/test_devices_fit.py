"""`plan`, `queue` and `run` refuse a run whose `devices` can never fit the file's
[engine] table, in one line at the line `devices` is written, and queue nothing; what
the file cannot make certain (another backend, GPUs found when the engine starts) is
left to the engine, which refuses such a run at launch (engine/placement.never)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.engine import daemon
from gridrun.engine.backends import slots
from gridrun.runs import layout
from gridrun.spec import SpecError, load_runs

EXAMPLE = Path(__file__).resolve().parents[1] / "experiments.toml"
WIDE = """[defaults]
task = "spirals"
epochs = 1
accumulate = 4

[experiments.wide]
devices = 4
{extra}
[engine]
{engine}
"""


@pytest.fixture
def machine(monkeypatch):
    """This machine's GPUs, as the engine would find them (NVML; nothing inherited)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("SLURM_JOB_GPUS", raising=False)

    def with_gpus(n: int) -> None:
        monkeypatch.setattr(slots, "gpu_count", lambda: n)

    with_gpus(0)
    return with_gpus


def gridrun(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output
    return result.exit_code, result.stdout, result.stderr


def write(tmp_path: Path, engine: str, extra: str = "") -> Path:
    path = tmp_path / "wide.toml"
    path.write_text(WIDE.format(engine=engine, extra=extra))
    return path


CPU_ONLY = ("devices = 4 needs 4 CPU slots at once and [engine] has cpu_slots = 2 ({why}): "
            "lower devices to at most 2 or raise cpu_slots to 4")


def test_the_readme_example_on_more_devices_than_slots_is_refused_before_anything_is_queued(
        tmp_path, machine):
    lines = EXAMPLE.read_text().splitlines()
    slots_given = tomllib.loads(EXAMPLE.read_text())["engine"]["cpu_slots"]
    devices = 2 * slots_given  # accumulate = devices: a share for each
    line = next(i for i, text in enumerate(lines, start=1) if text.startswith("[defaults]")) + 1
    lines[line - 1:line - 1] = [f"devices = {devices}", f"accumulate = {devices}"]
    path = tmp_path / "experiments.toml"
    path.write_text("\n".join(lines) + "\n")
    refusal = (f"{path}:{line}: [defaults] devices: devices = {devices} needs {devices} CPU slots "
               f"at once and [engine] has cpu_slots = {slots_given} (this machine has no GPU): "
               f"lower devices to at most {slots_given} or raise cpu_slots to {devices}")
    code, out, err = gridrun("plan", str(path))
    assert (code, out) == (2, "")
    assert err == f"{refusal}\n1 problem in {path}; nothing was changed.\n"
    root = tmp_path / "runs"
    try:
        for command in ("queue", "run"):
            code, out, err = gridrun(command, str(path), "--root", str(root))
            assert code == 2 and err == f"{refusal}\nnothing was queued\n", err
            assert "task check" not in out
        assert not (root / layout.DB_NAME).exists()
        assert not daemon.status(root).running
    finally:
        if daemon.status(root).running:
            daemon.stop(root, force=True)


def test_gpus_empty_means_cpu_slots_whatever_the_machine_has(tmp_path, machine):
    machine(8)
    path = write(tmp_path, "gpus = []\ncpu_slots = 2")
    code, _, err = gridrun("plan", str(path))
    assert code == 2
    assert err.splitlines()[0] == (f"{path}:7: [experiments.wide] devices: "
                                   + CPU_ONLY.format(why="gpus = []"))


def test_a_list_of_gpus_gives_that_many_distinct_gpus(tmp_path, machine):
    machine(8)
    path = write(tmp_path, "gpus = [0, 1]\nruns_per_gpu = 2")
    code, _, err = gridrun("plan", str(path))
    assert code == 2
    assert err.splitlines()[0] == (
        f"{path}:7: [experiments.wide] devices: devices = 4 needs 4 distinct GPUs at once and "
        "[engine] gpus = [0, 1] names 2: lower devices to at most 2 or name 4 GPUs in gpus")
    assert gridrun("plan", str(write(tmp_path, "gpus = [0, 1, 2, 3]")))[0] == 0


def test_without_a_gpus_key_the_gpus_of_this_machine_count(tmp_path, machine):
    path = write(tmp_path, "cpu_slots = 2")
    machine(4)
    assert gridrun("plan", str(path))[0] == 0
    machine(2)
    code, _, err = gridrun("plan", str(path))
    assert code == 2
    assert err.splitlines()[0] == (
        f"{path}:7: [experiments.wide] devices: devices = 4 needs 4 distinct GPUs at once and "
        "this machine gives the engine 2 ([engine] has no gpus key): lower devices to at most 2 "
        "or run the engine where it has 4 GPUs")


def test_gpus_a_job_inherited_count_as_this_machines(tmp_path, machine, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-a,MIG-b,MIG-c,MIG-d")
    assert gridrun("plan", str(write(tmp_path, "cpu_slots = 2")))[0] == 0


def test_what_the_file_leaves_to_the_engine_is_not_refused(tmp_path, machine):
    # gpus = "auto" written out: the GPUs of the machine the engine starts on, not this one
    assert gridrun("plan", str(write(tmp_path, 'gpus = "auto"\ncpu_slots = 2')))[0] == 0
    # slurm: a multi-device run is a job of its own, with the GPUs it asks for
    assert gridrun("plan", str(write(tmp_path, 'backend = "slurm"\ncpu_slots = 2')))[0] == 0
    # no [engine] table: the engine keeps the settings it has
    path = tmp_path / "bare.toml"
    path.write_text(WIDE.format(engine="", extra="").split("[engine]")[0])
    assert gridrun("plan", str(path))[0] == 0


def test_each_place_that_sets_devices_is_named_once_with_its_largest(tmp_path, machine):
    path = write(tmp_path, "cpu_slots = 2",
                 extra="grid = { devices = [1, 2, 4] }\n\n[experiments.other]\n"
                       "ablations.wider = { devices = 4 }\nablations.narrow = { devices = 2 }\n")
    code, _, err = gridrun("plan", str(path))
    assert code == 2
    why = "this machine has no GPU"
    assert err.splitlines() == [
        f"{path}:8: [experiments.wide] grid.devices: " + CPU_ONLY.format(why=why),
        f"{path}:11: [experiments.other] ablations.wider.devices: " + CPU_ONLY.format(why=why),
        f"2 problems in {path}; nothing was changed."]


def test_a_run_that_fits_is_queued_as_before(tmp_path, machine):
    path = write(tmp_path, "cpu_slots = 4")
    code, out, _ = gridrun("queue", str(path), "--no-check", "--root", str(tmp_path / "runs"))
    assert code == 0 and "queued 1 run from" in out


def test_only_what_is_queued_is_held_to_the_engine(tmp_path, machine):
    # `gridrun train FILE RUN` trains in the foreground, on no slot of the engine's: the
    # file's runs load without the fit (load_or_exit's default, the API's too)
    path = write(tmp_path, "cpu_slots = 2")
    [run] = load_runs(path)
    assert run.trainer["devices"] == 4
    with pytest.raises(SpecError):
        load_runs(path, gpus_here=lambda: 0)
