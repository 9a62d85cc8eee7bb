"""One run on several devices (issue 38), proven on the CPU with gloo: under
`reduce = "invariant"` the same bits for 1, 2 and 4 devices; under ddp the same bits
between repeats; a dead rank ends the run at once and the engine resumes it exactly;
an invariant run moves from 2 devices to 1 mid-run and ends where it would have.

The task is the user's, in their own folder: shapes' data (augmented) and CNN (with
BatchNorm), with a Dropout added, so every kind of randomness a step draws is there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import patience
import psutil
import pytest
from test_engine_kit import drain, engine_for, make_run, metrics_without_timing, prepare, wait_for
from user_folder import user_package

from gridrun.runs import layout, states
from gridrun.runs.store import Store
from gridrun.spec import SpecError, load_runs, write_run_config

USER_TASK = '''\
"""shapes' data and CNN, with a Dropout before the classifier. With `gate`, each
process's `at`-th training micro-batch writes GATE.reached and waits until the file
GATE exists: a test stops the run there, at a step the machine's speed does not move."""
import os
import time
from pathlib import Path

from torch import nn

from gridrun.tasks.shapes import shapes


def make(p: float = 0.3, train_size: int = 256, val_size: int = 100, step_sleep: float = 0.0,
         gate: str = "", at: int = 0):
    task = shapes(train_size=train_size, val_size=val_size)
    layers = list(task.model)
    task.model = nn.Sequential(*layers[:-1], nn.Dropout(p), layers[-1])
    if step_sleep or gate:
        loss, calls = task.loss, [0]

        def slow_loss(model, batch):
            calls[0] += 1
            if gate and calls[0] == at:
                Path(f"{gate}.reached").touch()
                while not os.path.exists(gate):
                    time.sleep(0.05)
            time.sleep(step_sleep)
            return loss(model, batch)

        task.loss = slow_loss
    return task
'''
# wall-clock and machine fields of a metrics line: the rest must be equal
MACHINE = {"rss", "step_time"}


# 6 steps an epoch (micro-batches of 16, accumulate 4), 12 in all: a run stopped at
# each rank's 9th micro-batch on 2 devices (step 5; its last checkpoint at 4) resumes
# mid-epoch and crosses an epoch's end
SIZE = 384


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The user's folder: their task package, the working directory of every process;
    one for the module, so its tests share the runs they compare with (`reference`)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRIDRUN_LEDGER", str(tmp_path_factory.mktemp("ledger") / "gpu-ledger"))
        with user_package(tmp_path_factory.mktemp("lab"), mp, "devlab",
                          {"dropcnn": USER_TASK}) as folder:
            yield folder


@pytest.fixture(scope="module")
def reference(lab):
    """`reference(run)`: `run` trained start to end in lab/runs, once for the module."""
    done: dict[str, object] = {}

    def trained_once(run):
        if run.id not in done:
            trained(lab / "runs", run)
            done[run.id] = run
        return run

    return trained_once


def cell(reduce: str, devices: int, experiment: str = "e", step_sleep: float = 0.0,
         train_size: int = 256, gate: Path | None = None, at: int = 9, **trainer):
    """With `gate`: each process's `at`-th micro-batch waits for it (USER_TASK)."""
    args = {"p": 0.3, "train_size": train_size, "val_size": 100, "step_sleep": step_sleep,
            **({"gate": str(gate), "at": at} if gate else {})}
    return make_run("devlab.dropcnn:make", experiment=experiment, task_args=args,
                    **{"epochs": 2, "batch_size": 16, "accumulate": 4, "threads": 1,
                       "log_every": 2, "reduce": reduce, "devices": devices, **trainer})


def lines(root: Path, run) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in MACHINE}
            for r in metrics_without_timing(root, run)]


def summary(root: Path, run) -> dict:
    return json.loads((layout.run_dir(root, run.experiment, run.id) / layout.SUMMARY).read_text())


def worker(run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gridrun.train.worker", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def trained(root: Path, run) -> tuple[int, str]:
    proc = worker(prepare(root, run))
    out, _ = patience.communicate(proc, 300)
    assert proc.returncode == 0, out
    return proc.returncode, out


def ranks_of(run_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "gridrun.train.worker" in cmd and "--rank" in cmd and str(run_dir) in cmd:
            found.append(proc)
    return found


def test_invariant_gives_the_same_bits_on_1_2_and_4_devices(lab, reference):
    root = lab / "runs"
    runs = [reference(cell("invariant", d, experiment=f"d{d}", train_size=SIZE))
            for d in (1, 2, 4)]
    assert len({r.id for r in runs[:1]}) == 1
    hashes = {summary(root, r)["weights_sha256"] for r in runs}
    assert len(hashes) == 1
    one = lines(root, runs[0])
    assert any(r.get("split") == "val" for r in one)
    assert all(lines(root, r) == one for r in runs[1:])
    # so `gridrun verify` replays a 2-device run in one process, bit for bit
    from gridrun.checks.verify import verify

    result = verify(layout.run_dir(root, runs[1].experiment, runs[1].id))
    assert result["ok"] and result["weights"] == "identical", result


def test_ddp_repeats_give_the_same_bits_and_another_count_other_bits(lab, reference):
    root = lab / "runs"
    a, b = (cell("ddp", 2, experiment=name, train_size=SIZE) for name in ("a", "b"))
    one = cell("ddp", 1, experiment="one", train_size=SIZE)
    assert a.trainer["devices"] == 2 and "devices" in json.dumps(a.trainer)
    for run in (a, b, one):
        reference(run)
    assert summary(root, a)["weights_sha256"] == summary(root, b)["weights_sha256"]
    assert lines(root, a) == lines(root, b)
    # documented: DDP's sum changes with the device count
    assert summary(root, one)["weights_sha256"] != summary(root, a)["weights_sha256"]
    from gridrun.checks.verify import VerifyError, verify

    with pytest.raises(VerifyError, match=r'a reduce = "ddp" run on 2 devices .* use reduce = '
                                          r'"invariant"'):
        verify(layout.run_dir(root, a.experiment, a.id))


def test_the_device_count_is_in_a_ddp_run_id_and_not_in_an_invariant_one():
    from gridrun.spec import run_id

    def rid(**trainer):
        return run_id("e", "spirals", trainer, {}, 0)

    base = {"epochs": 1}
    assert rid(**base, devices=1) == rid(**base) == rid(**base, devices=1, reduce="ddp")
    assert rid(**base, devices=2) != rid(**base)
    assert rid(**base, reduce="invariant", devices=2) == rid(**base, reduce="invariant", devices=1)
    assert rid(**base, reduce="invariant") != rid(**base)


def test_an_invariant_run_stopped_on_2_devices_and_resumed_on_1_ends_with_the_same_bits(
        lab, reference):
    root = lab / "runs"
    alone = reference(cell("invariant", 1, experiment="d1", train_size=SIZE))
    gate = lab / "moved.gate"  # each rank's 9th micro-batch (step 5) waits there: stopped there
    moved = cell("invariant", 2, experiment="moved", gate=gate, checkpoint_every=2,
                 train_size=SIZE)
    run_dir = prepare(root, moved)
    proc = worker(run_dir)
    wait_for(lambda: Path(f"{gate}.reached").exists() or proc.poll() is not None, timeout=240)
    proc.send_signal(signal.SIGTERM)
    gate.touch()
    out, _ = patience.communicate(proc, 120)
    assert proc.returncode == states.EXIT_CODES[states.INTERRUPTED], out
    assert not ranks_of(run_dir)
    stopped_at = summary(root, moved)["step"]
    assert 4 <= stopped_at < summary(root, alone)["step"]
    # the same run (devices is not in an invariant run's id), resumed on one device
    write_run_config(run_dir / layout.CONFIG, type(moved)(**{
        **moved.__dict__, "trainer": {**moved.trainer, "devices": 1}}))
    proc = worker(run_dir)
    out, _ = patience.communicate(proc, 300)
    assert proc.returncode == 0, out
    assert f"resumed from step {stopped_at}" in out
    assert summary(root, moved)["weights_sha256"] == summary(root, alone)["weights_sha256"]
    assert lines(root, moved) == lines(root, alone)


def test_a_killed_rank_ends_the_run_at_once_and_the_engine_resumes_it_exactly(lab, reference):
    from gridrun.engine.backends.local import LocalBackend

    undisturbed = reference(cell("ddp", 2, experiment="a", train_size=SIZE))
    root = lab / "engine"  # a root of its own: the engine's store holds this run alone
    gate = lab / "hit.gate"  # killed at each rank's 9th micro-batch (step 5)
    run = cell("ddp", 2, experiment="hit", gate=gate, checkpoint_every=2, train_size=SIZE)
    # the engine's fork server starts in the user's folder, as `gridrun` starts it there
    backend = LocalBackend(log_path=lab / "forkserver.log")
    backend.start()
    with Store(root) as store:
        store.enqueue([run])
        engine = engine_for(root, backend, slots=2)
        engine.start()
        run_dir = layout.run_dir(root, run.experiment, run.id)
        deadline = patience.Deadline(240)
        while not Path(f"{gate}.reached").exists():
            assert not deadline.passed(), f"the run did not start training in {deadline}"
            assert store.list_runs(ids=[run.id])[0].status in (states.QUEUED, states.RUNNING), \
                store.list_runs(ids=[run.id])[0].error
            engine.step(0.1)
        victims = ranks_of(run_dir)
        assert len(victims) == 1
        os.kill(victims[0].pid, signal.SIGKILL)
        gate.touch()
        restart = patience.Deadline(60)
        while store.list_runs(ids=[run.id])[0].restarts == 0:
            assert not restart.passed(), f"a dead rank left the run hanging for {restart}"
            engine.step(0.1)
        drain(engine, timeout=300)
        row = store.list_runs(ids=[run.id])[0]
    backend.close()
    assert row.status == states.COMPLETED, row.error
    assert row.restarts == 1
    output = (run_dir / "output.log").read_text()
    assert "rank 1 of 2 died (signal 9)" in output
    assert "resumed from step" in output
    assert (summary(root, run)["weights_sha256"]
            == summary(lab / "runs", undisturbed)["weights_sha256"])
    assert lines(root, run) == lines(lab / "runs", undisturbed)
    assert not ranks_of(run_dir)


def refusal(path: Path, text: str) -> str:
    """What `plan` says of an experiment file holding `text`."""
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_runs(path)
    return str(err.value)


def test_plan_refuses_devices_that_do_not_divide_accumulate_with_file_and_line(tmp_path):
    path = tmp_path / "experiments.toml"
    text = refusal(path, '[experiments.wide]\ntask = "spirals"\naccumulate = 3\n\n'
                         '[experiments.wide.grid]\ndevices = [1, 2]\n')
    assert f"{path}:6:" in text and "devices = 2 does not divide accumulate = 3" in text
    assert "use devices in [1, 3]" in text
    # on Ray a run's devices are GPUs of one node, which only the engine sees: planned
    path.write_text('[engine]\nbackend = "ray"\n\n[experiments.wide]\ntask = "spirals"\n'
                    'accumulate = 2\ndevices = 2\n')
    assert [r.trainer["devices"] for r in load_runs(path)] == [2]


def test_a_grid_over_devices_of_an_invariant_run_is_one_run_and_says_why(tmp_path):
    text = refusal(tmp_path / "experiments.toml",
                   '[experiments.wide]\ntask = "spirals"\naccumulate = 2\nreduce = "invariant"\n\n'
                   '[experiments.wide.grid]\ndevices = [1, 2]\n')
    assert ("'devices=1' and 'devices=2' (seed 0); remove one (devices is not part of the run "
            "id: how a run executes, not what it computes; under reduce = \"invariant\" the "
            "device count changes no bit)") in text


def test_a_rank_dying_under_gridrun_train_leaves_the_run_queued_and_it_resumes(lab):
    root = lab / "wide"  # a root of its own: `gridrun train` makes its store there
    gate = lab / "wide.gate"  # 12 steps an epoch: killed at each rank's 9th micro-batch (step 9)
    (lab / "wide.toml").write_text(
        f'[experiments.wide]\ntask = "devlab.dropcnn:make"\ngate = "{gate}"\nat = 9\n'
        'train_size = 384\nepochs = 2\n'
        'batch_size = 16\naccumulate = 2\nthreads = 1\ndevices = 2\nreduce = "invariant"\n'
        'checkpoint_every = 2\nlog_every = 2\n')
    run = load_runs(lab / "wide.toml")[0]
    cli = [sys.executable, "-m", "gridrun", "train", str(lab / "wide.toml"), "--root", str(root)]
    proc = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_dir = layout.run_dir(root, run.experiment, run.id)
    wait_for(lambda: Path(f"{gate}.reached").exists() or proc.poll() is not None, timeout=240)
    victims = ranks_of(run_dir)
    assert len(victims) == 1
    os.kill(victims[0].pid, signal.SIGKILL)
    gate.touch()
    out, _ = patience.communicate(proc, 120)
    assert proc.returncode == states.EXIT_RANK_DIED, out
    assert "rank 1 of 2 died (signal 9): the run stops and resumes from its last checkpoint" in out
    with Store(root) as store:
        row = store.list_runs(ids=[run.id])[0]
    assert row.status == states.QUEUED
    assert row.note.startswith("rank 1 of 2 died (signal 9) in the foreground; `gridrun train`")
    done = patience.run(cli, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resumed from step" in done.stdout
