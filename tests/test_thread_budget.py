"""The engine never oversubscribes the CPU: CPU runs start only while their threads fit
the usable cores (`cpu_slots` is an upper bound), in queue order; `engine status` says
when threads hold runs back; and the slots never change a run's bits."""

from __future__ import annotations

import contextlib

from test_engine_kit import drain, engine_for, make_run, slow_run, summary, wait_for
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.engine import daemon
from gridrun.engine.backends.slots import fits
from gridrun.engine.scheduler import CPU_CAP
from gridrun.runs import states
from gridrun.runs.store import Store
from gridrun.train.threads import usable_cores


def test_fits_never_more_threads_than_cores_but_a_big_run_alone():
    assert fits([], 2, 2) and not fits([2], 2, 2) and not fits([1], 2, 2)
    assert fits([1], 1, 2) and not fits([1, 1], 1, 2)
    assert fits([], 8, 2)  # more than the machine has: alone


def test_auto_threads_fill_the_slots_and_runs_on_every_core_take_turns(tmp_path, backend):
    autos = [slow_run(seed=s, sleep=0.05, epochs=2) for s in range(2)]
    wide = [slow_run(seed=s, sleep=0.05, epochs=2, threads=2) for s in range(2, 4)]
    with Store(tmp_path) as store:
        store.enqueue(autos)
        engine = engine_for(tmp_path, backend, slots=2, cores=2)
        engine.start()
        engine.step(0.01)
        # "auto" is one thread a CPU run: two slots on two cores are two runs at once
        assert {r.id for r in store.list_runs(status=states.RUNNING)} == {r.id for r in autos}
        drain(engine)
        store.enqueue(wide)
        engine.step(0.01)
        assert [r.id for r in store.list_runs(status=states.RUNNING)] == [wide[0].id]
        assert store.get_state(CPU_CAP) == {"run_id": wide[1].id, "threads": 2, "holding": 2,
                                            "cores": 2, "cpu_slots": 2}
        drain(engine)
        assert store.get_state(CPU_CAP) is None
        first, second = (store.get_run(r.id) for r in wide)
        assert second.started_at >= first.ended_at  # never side by side
        assert {r.status for r in store.list_runs()} == {states.COMPLETED}


def test_cpu_slots_1_and_2_give_a_cell_the_same_bits(tmp_path, backend):
    cell, other = make_run(seed=0, threads=1), make_run(seed=1, threads=1)
    hashes = []
    for slots, runs in ((1, [cell]), (2, [cell, other])):
        root = tmp_path / f"slots{slots}"
        with Store(root) as store:
            store.enqueue(runs)
            drain(engine_for(root, backend, slots=slots))
            assert {r.status for r in store.list_runs()} == {states.COMPLETED}
        hashes.append(summary(root, cell)["weights_sha256"])
    assert hashes[0] == hashes[1]


def test_engine_status_says_when_threads_hold_runs_back(tmp_path):
    root = tmp_path / "runs"
    wide = usable_cores() + 1  # more than this machine has: each runs alone
    runs = [slow_run(seed=s, sleep=0.2, epochs=2, threads=wide) for s in range(3)]
    with Store(root) as store:
        store.enqueue(runs)
    daemon.start(root)
    try:
        with Store(root) as store:
            wait_for(lambda: store.get_state(CPU_CAP), timeout=60)
        result = CliRunner().invoke(app, ["engine", "status", "--root", str(root)])
        assert "threads cap CPU runs at" in result.stdout, result.output
        # a run asking for more than the machine's cores runs alone, whatever the machine
        assert 'at 1 at once (cpu_slots = 2 is an upper bound; the default threads = "auto", ' \
            "one a run, runs 2 at once)" in result.stdout
    finally:
        with contextlib.suppress(RuntimeError):
            daemon.stop(root, timeout=120)

