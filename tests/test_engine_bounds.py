"""Every count of `[engine]` has an upper bound (issue 45, finding 5): over it, `plan`,
`queue` and `run` refuse the file with its line, the key, the bound and what to write
instead; an engine that reads a count past the bound anyway (a config saved before the
bounds) uses the bound and says so in its log, never building a billion slots; and
`engine start` says in one line why an engine did not come up."""

from __future__ import annotations

import logging
import os
import resource
import stat
import subprocess
from pathlib import Path

import patience
import pytest
from test_engine_kit import kill_quietly
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.engine import daemon
from gridrun.engine.backends import slots as slots_module
from gridrun.engine.backends.base import Slot
from gridrun.runs import layout
from gridrun.runs.store import Store
from gridrun.spec import EngineConfig
from gridrun.spec.engine_table import BOUNDS

DOCS = Path(__file__).resolve().parents[1] / "docs"
# the pages with the [engine] tables: the local keys, and SLURM's
ENGINE_PAGES = (DOCS / "engine.md", DOCS / "clusters.md")
FILE = """[experiments.a]
task = "spirals"
epochs = 1

[engine]
{key} = {value}
"""
ENGINE_LINE = 6  # the line of `{key} = {value}` in FILE
COUNTS = sorted(BOUNDS)


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def write(tmp_path: Path, key: str, value) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(FILE.format(key=key, value=value))
    return path


def test_the_bounds_cover_every_count_of_the_table():
    fields = EngineConfig.__dataclass_fields__
    counts = {k for k, f in fields.items() if f.type in ("int", "int | str")}
    assert counts == set(BOUNDS), "a count of [engine] without a bound (or a bound of no count)"


@pytest.mark.parametrize("key", COUNTS)
def test_a_count_over_its_bound_is_refused_at_plan_with_its_line_and_what_to_write(tmp_path, key):
    most = BOUNDS[key].most
    path = write(tmp_path, key, most + 1)
    result = invoke("plan", str(path))
    assert result.exit_code == 2, result.output
    (line,) = [ln for ln in result.stderr.splitlines() if f"engine.{key}" in ln]
    assert line.startswith(f"{path}:{ENGINE_LINE}: engine.{key}: ")
    assert f"<= {most:,}" in line and f"got {most + 1}" in line
    assert "write " in line, line  # what to write instead
    assert "Traceback" not in result.output
    assert invoke("plan", str(write(tmp_path, key, most))).exit_code == 0  # the bound itself is fine


def test_a_billion_runs_per_gpu_or_cpu_slots_is_refused_by_plan_queue_and_run(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(FILE.format(key="runs_per_gpu", value=10**9) + "cpu_slots = 1000000000\n")
    root = tmp_path / "runs"
    for command in ("plan", "queue", "run"):
        args = [command, str(path)] + (["--root", str(root), "--no-check"] if command != "plan" else [])
        result = invoke(*args)
        assert result.exit_code == 2, (command, result.output)
        err = result.stderr
        assert f"{path}:6: engine.runs_per_gpu:" in err and "<= 64" in err, err
        assert f"{path}:7: engine.cpu_slots:" in err and "<= 4,096" in err, err
        assert 'runs_per_gpu = "auto"' in err
    assert not (root / layout.DB_NAME).exists()  # nothing was queued, no engine started


@pytest.mark.parametrize(("gpus", "words"), [
    ("[0, 0]", ["listed twice", "runs_per_gpu"]),
    ("[0, 1000000000]", ["0 to 255", 'gpus = "auto"']),
])
def test_a_gpu_listed_twice_or_beyond_any_machine_is_refused(tmp_path, gpus, words):
    result = invoke("plan", str(write(tmp_path, "gpus", gpus)))
    assert result.exit_code == 2, result.output
    (line,) = [ln for ln in result.stderr.splitlines() if "engine.gpus" in ln]
    assert f":{ENGINE_LINE}: engine.gpus:" in line
    for word in words:
        assert word in line, line


def test_the_docs_state_each_bound():
    text = "\n".join(page.read_text() for page in ENGINE_PAGES)
    for key, bound in BOUNDS.items():
        rows = [ln for ln in text.splitlines() if ln.startswith("| `") and f"`{key}`" in ln.split("|")[1]]
        assert rows, f"the docs' [engine] tables have no row for {key}"
        assert all(f"<= {bound.most:,}" in row for row in rows), (key, rows)


# ---- an engine that reads a count past its bound anyway ------------------------------------


@pytest.fixture
def few_slots(monkeypatch):
    """Slots that fail the test after 100,000 (today's engine built a billion, for minutes,
    before anything could fail): the count is what is tested, never the machine's memory."""
    made = []

    def counted(*args, **kwargs):
        made.append(1)
        if len(made) > 100_000:
            pytest.fail("more than 100,000 slots built")
        return Slot(*args, **kwargs)

    monkeypatch.setattr(slots_module, "Slot", counted)
    return made


@pytest.mark.parametrize("config", [
    EngineConfig(gpus=(), cpu_slots=10**9),
    EngineConfig(gpus=(0, 1), runs_per_gpu=10**9),
    EngineConfig(gpus=tuple(range(10**6)), runs_per_gpu=2),
    EngineConfig(gpus=(0,) * 10**6),
], ids=["cpu_slots", "runs_per_gpu", "gpus", "gpus-repeated"])
def test_slots_for_a_count_past_its_bound_are_bounded_and_said(few_slots, caplog, config):
    with caplog.at_level(logging.WARNING, logger="gridrun.engine"):
        built = slots_module.slots_for(config)
    assert len(built) <= 256 * 64 and len({s.name for s in built}) == len(built)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "[engine]" in said[0] and "using" in said[0], said


def test_an_engine_config_saved_past_the_bounds_is_read_within_them(tmp_path, caplog):
    root = tmp_path / "runs"
    with Store(root) as store:  # as a config saved before the bounds, or written by hand
        store.set_state("engine_config", {"gpus": [], "cpu_slots": 10**9, "runs_per_gpu": 10**9,
                                          "max_jobs": 10**9, "runs_per_job": 0,
                                          "cpus_per_run": "many"})
    with caplog.at_level(logging.WARNING, logger="gridrun.engine"):
        config = daemon.engine_config(root)
    assert (config.cpu_slots, config.runs_per_gpu, config.max_jobs) == (4096, 64, 10_000)
    assert (config.runs_per_job, config.cpus_per_run) == (1, 1)  # the defaults
    said = " ".join(r.getMessage() for r in caplog.records)
    for key in ("cpu_slots", "runs_per_gpu", "max_jobs", "runs_per_job", "cpus_per_run"):
        assert f"[engine] {key} = " in said, (key, said)


def test_an_engine_with_a_billion_cpu_slots_in_its_store_starts_with_the_bound(tmp_path, monkeypatch):
    """The engine process runs under a 1 GiB address-space limit: today's billion slots end
    in a MemoryError there instead of filling the machine."""
    root = tmp_path / "runs"
    with Store(root) as store:
        store.set_state("engine_config", {"gpus": [], "cpu_slots": 10**9})
    real_popen = subprocess.Popen

    def limited(*args, **kwargs):
        def limit():
            resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

        return real_popen(*args, preexec_fn=limit, **kwargs)

    monkeypatch.setattr(daemon.subprocess, "Popen", limited)
    try:
        st = daemon.start(root)
        assert st.running and daemon.status(root).pid == st.pid  # its engine.pid reads back whole
        # the engine writes its slots line after it comes up: on a busy machine, later
        log = patience.wait_for(lambda: (lambda t: "slots cpu0, " in t and t)(
            (root / daemon.LOG).read_text()), 60, what="the engine's slots line")
        assert "cpu_slots = 1000000000" in log and "using 4096" in log, log
        assert "slots cpu0, " in log and "..., cpu4095 (4096 slots)" in log
    finally:
        kill_quietly(daemon.status(root).pid)


# ---- engine start, when the engine does not come up ---------------------------------------


def test_engine_start_says_in_one_line_that_the_engine_was_killed_as_it_started(tmp_path, monkeypatch):
    """An engine killed as it starts (the kernel's out-of-memory killer sends SIGKILL) leaves
    nothing in its log: `start` names the signal and where to look, instead of nothing."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nkill -KILL $$\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(daemon.sys, "executable", str(fake))
    root = tmp_path / "runs"
    result = invoke("engine", "start", "--root", str(root))
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "killed by SIGKILL" in lines[0] and "out of memory" in lines[0], lines[0]
    assert "dmesg" in lines[0] and str(root.resolve() / daemon.LOG) in lines[0]
    assert os.path.exists(root / daemon.LOG)
    assert not daemon.status(root).running
