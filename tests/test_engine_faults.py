"""Faults found by attacking the engine (issue 12), each reproduced first: one bad
run never stalls the queue, intents given while the engine is down hold, the
run cap is checked before expanding, roots that others can write are refused,
a frozen engine is reported, and a run whose folder vanished is not
"completed"."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
import tracemalloc
from pathlib import Path

import pytest
from test_engine_kit import drain, engine_for, kill_quietly, make_run, prepare, slow_run, wait_for
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.engine import daemon
from gridrun.runs import layout, states
from gridrun.runs.store import Store
from gridrun.spec import SpecError, load_runs

FIXTURES = Path(__file__).parent / "spec_fixtures"



# ---- item 3: the cap before the expansion -------------------------------------------


def refused_with_peak(path: Path, **kwargs) -> tuple[SpecError, int]:
    """The SpecError `load_runs` raises, and the memory it allocated at its peak: what
    shows that nothing was expanded, however busy the machine (a time limit did not)."""
    tracemalloc.start()
    try:
        with pytest.raises(SpecError) as refused:
            load_runs(path, **kwargs)
        return refused.value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_100_cubed_matrix_is_refused_in_milliseconds_and_little_memory():
    path = FIXTURES / "huge_matrix.toml"  # 1.3 KB: refused before it was 27 s and 2 GB
    # measured on the shared 2-core machine, in a fresh process (no task is imported):
    # 6 ms and 1.4 MB more RSS; 19 ms and a 1.7 MB peak under tracemalloc
    error, peak = refused_with_peak(path)
    assert "the matrix expands to 1,000,000 runs" in str(error)
    assert peak < 50 * 2**20, f"{peak / 2**20:.1f} MB"
    # --force lifts the cap of 10,000, not the ceiling: 1,000,000 runs are never built
    error, peak = refused_with_peak(path, force=True)
    assert "even with --force" in str(error) and peak < 50 * 2**20, f"{peak / 2**20:.1f} MB"


def test_a_billion_seeds_are_refused_without_making_them(tmp_path):
    path = tmp_path / "seeds.toml"
    path.write_text('[experiments.a]\ntask = "spirals"\nseeds = 1_000_000_000\n')
    error, peak = refused_with_peak(path, force=True)
    assert "1,000,000,000 runs" in str(error) and peak < 50 * 2**20, f"{peak / 2**20:.1f} MB"


# ---- item 1: one bad run never stalls the queue ---------------------------------------


def test_a_run_whose_folder_cannot_be_made_fails_and_the_queue_goes_on(tmp_path, backend):
    blocked = make_run(seed=1, epochs=1)  # a regular file sits where its folder goes
    too_long = make_run(seed=2, epochs=1, experiment="x" * 300)  # queued before validation refused it
    ok = [make_run(seed=s, epochs=1) for s in (3, 4)]
    layout.make_private_dir(tmp_path / "e")
    (tmp_path / "e" / blocked.id).write_text("not a folder")
    with Store(tmp_path) as store:
        store.enqueue([blocked, too_long, *ok])
        engine = engine_for(tmp_path, backend, slots=1)
        engine.start()
        drain(engine)
        got = {r.id: r for r in store.list_runs()}
        # a second engine start finds nothing stuck either
        engine = engine_for(tmp_path, backend, slots=1)
        engine.start()
        engine.step(0.01)
    assert [got[r.id].status for r in ok] == [states.COMPLETED] * 2
    assert got[blocked.id].status == states.FAILED
    assert "could not start" in got[blocked.id].error
    assert "is not a folder" in got[blocked.id].error
    assert got[too_long.id].status == states.FAILED
    assert "File name too long" in got[too_long.id].error


def test_a_symlinked_experiment_folder_is_refused_and_nothing_is_written_through_it(tmp_path, backend):
    root, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    layout.make_private_dir(root)
    elsewhere.mkdir(mode=0o700)
    (root / "e").symlink_to(elsewhere)
    run, other = make_run(seed=0, epochs=1), make_run(seed=1, epochs=1, experiment="f")
    with Store(root) as store:
        store.enqueue([run, other])
        engine = engine_for(root, backend, slots=1)
        engine.start()
        drain(engine)
        got = {r.id: r for r in store.list_runs()}
    assert got[run.id].status == states.FAILED
    assert "is a symlink" in got[run.id].error and "never follows" in got[run.id].error
    assert got[other.id].status == states.COMPLETED
    assert list(elsewhere.iterdir()) == []
    assert any("is a symlink" in p for p in layout.root_problems(root))
    result = CliRunner().invoke(app, ["queue", str(FIXTURES.parent.parent / "experiments.toml"),
                                      "--root", str(root)])
    assert result.exit_code == 2 and "is a symlink" in result.stderr
    assert "Traceback" not in result.output


def test_a_config_swapped_for_a_symlink_is_refused_by_the_worker(tmp_path, capsys):
    from gridrun.train import worker

    run = make_run(seed=0, epochs=1)
    run_dir = prepare(tmp_path, run)
    config = run_dir / layout.CONFIG
    planted = tmp_path / "planted.toml"
    shutil.copy(config, planted)
    config.unlink()
    config.symlink_to(planted)  # swapped after the engine wrote it
    assert worker.main(run_dir) == states.EXIT_CODES[states.FAILED]
    assert f"refusing to run {run_dir}: {config} is a symlink" in capsys.readouterr().err
    config.unlink()
    shutil.copy(planted, config)
    os.chmod(config, 0o666)  # its folders are private: no one else can reach it (umask 000)
    assert worker.read_config(run_dir) == run
    os.chmod(run_dir, 0o777)
    assert worker.main(run_dir) == states.EXIT_CODES[states.FAILED]
    assert f"chmod 700 {run_dir}" in capsys.readouterr().err
    assert not (run_dir / layout.METRICS).exists()  # nothing ran
    os.chmod(run_dir, 0o700)
    assert worker.read_config(run_dir) == run


# ---- item 7: safe roots -----------------------------------------------------------------


def test_a_world_writable_root_is_refused_with_the_chmod_that_fixes_it(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    os.chmod(root, 0o777)
    problems = layout.root_problems(root)
    assert len(problems) == 1 and f"chmod 700 {root}" in problems[0]
    with pytest.raises(layout.UnsafeRoot, match="writable by group or others"):
        Store(root)
    assert not (root / layout.DB_NAME).exists()
    for args in (["ls"], ["engine", "start"], ["queue", str(FIXTURES.parent.parent / "experiments.toml")]):
        result = CliRunner().invoke(app, [*args, "--root", str(root)])
        assert result.exit_code == 2, (args, result.output)
        assert f"chmod 700 {root}" in result.stderr and "Traceback" not in result.output
        assert result.stderr.count("\n") == 1
    assert not daemon.status(root).running
    os.chmod(root, 0o700)
    assert layout.root_problems(root) == []
    Store(root).close()
    os.chmod(root / layout.DB_NAME, 0o666)  # inside a private root: no one else reaches it
    assert layout.root_problems(root) == []
    wal = root / (layout.DB_NAME + "-wal")
    wal.unlink(missing_ok=True)
    wal.symlink_to(tmp_path / "elsewhere")  # but never a symlink in its place
    assert any(f"{wal} is a symlink" in p for p in layout.root_problems(root))


def test_everything_gridrun_creates_under_the_root_is_private(tmp_path, backend):
    root = tmp_path / "runs"
    run = make_run(seed=0, epochs=1)
    with Store(root) as store:
        store.enqueue([run])
        engine = engine_for(root, backend, slots=1)
        engine.start()
        drain(engine)
        assert store.list_runs()[0].status == states.COMPLETED
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        assert st.st_uid == os.geteuid() and not st.st_mode & 0o022, (path, oct(st.st_mode))
    assert layout.root_problems(root, deep=True) == []


# ---- item 2: intents are durable -----------------------------------------------------------


def test_a_cancel_given_while_the_engine_is_down_holds(tmp_path, backend):
    victim, bystander = slow_run(seed=0, sleep=0.01, epochs=1), make_run(seed=1, epochs=1)
    with Store(tmp_path) as store:
        store.enqueue([victim, bystander])
        # the engine died (SIGKILL) while the victim ran, and its process is gone too
        assert store.transition(victim.id, states.QUEUED, states.RUNNING, slot="cpu0",
                                pid=2**22 + 12345, pid_start_time=1.0, started_at=time.time())
        assert store.cancel([victim.id]) == {victim.id: "cancelling"}  # written while down
        engine = engine_for(tmp_path, backend, slots=1)
        engine.start()
        drain(engine)
        got = {r.id: r for r in store.list_runs()}
        cancels = [i for i in store.intents() if i.kind == "cancel"]
    assert got[victim.id].status == states.CANCELLED
    assert got[bystander.id].status == states.COMPLETED
    assert not (layout.run_dir(tmp_path, "e", victim.id) / layout.METRICS).exists()  # never launched
    assert [i.outcome for i in cancels] == ["cancelled"]


def test_a_pause_given_while_the_engine_is_down_holds(tmp_path, backend):
    run = make_run(seed=0, epochs=1)
    with Store(tmp_path) as store:
        store.enqueue([run])
        store.pause()
        engine = engine_for(tmp_path, backend, slots=1)
        engine.start()
        for _ in range(3):
            engine.step(0.01)
        assert store.counts() == {states.QUEUED: 1}


# ---- item 8: a run whose folder vanishes; a frozen engine ------------------------------------


def test_a_run_whose_folder_is_deleted_while_it_runs_does_not_end_completed(tmp_path, backend):
    run = slow_run(seed=0, sleep=0.03, epochs=3)
    with Store(tmp_path) as store:
        store.enqueue([run])
        engine = engine_for(tmp_path, backend, slots=1)
        engine.start()
        engine.step(0.01)
        run_dir = layout.run_dir(tmp_path, "e", run.id)
        wait_for(lambda: (run_dir / layout.METRICS).exists())
        shutil.rmtree(run_dir)
        drain(engine)
        got = store.list_runs()[0]
    assert got.status == states.FAILED
    assert "folder" in got.error and "disappeared" in got.error


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "runs"
    yield root
    st = daemon.status(root)
    if st.pid:
        kill_quietly(st.pid, signal.SIGCONT)
        kill_quietly(st.pid)


def test_a_frozen_engine_is_reported_as_not_responding(root, monkeypatch):
    st = daemon.start(root)
    wait_for(lambda: daemon.status(root).heartbeat_age is not None, timeout=30)
    assert daemon.status(root).responding  # by the engine's own rule, not a test's 5 s (issue 44)
    monkeypatch.setattr(daemon, "NOT_RESPONDING_AFTER", 2.0)
    os.kill(st.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: daemon.status(root).heartbeat_age > 3, timeout=30, interval=0.2)
        frozen = daemon.status(root)
        assert frozen.running and not frozen.responding
        result = CliRunner().invoke(app, ["engine", "status", "--root", str(root)])
        assert "not responding for" in result.stdout, result.output
        assert f"`gridrun engine stop --force --root {root}` ends it" in result.stdout
        result = CliRunner().invoke(app, ["engine", "status", "--root", str(root), "--json"])
        assert '"responding": false' in result.stdout
    finally:
        os.kill(st.pid, signal.SIGCONT)
    wait_for(lambda: daemon.status(root).responding, timeout=30)
    with contextlib.suppress(RuntimeError):
        daemon.stop(root, timeout=30)


def test_the_engine_reads_a_summary_through_the_one_reader(tmp_path):
    """A summary.json that is not an object (or has wrong-typed fields) must not
    make the engine record a completed run as failed: it reads what it can."""
    from gridrun.engine.endings import read_summary

    (tmp_path / layout.SUMMARY).write_text("[1, 2]")
    assert read_summary(tmp_path) is None
    (tmp_path / layout.SUMMARY).write_text('{"status": "completed", "ended_at": "soon"}')
    assert read_summary(tmp_path).status == "completed"
