"""The SLURM backend on a real single-node cluster (scripts/slurm-cluster.sh: slurmctld,
slurmd, slurmdbd on MariaDB, two fake GPUs as GRES): real sbatch, real jobs, real
worker processes, the real scheduler. Skipped when no cluster answers."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import patience
import pytest
from search_kit import SMALL, decided_locally, drained, search_runs
from test_engine_kit import TINY, make_run, metrics_without_timing, wait_for

from gridrun.engine import daemon
from gridrun.engine.backends import slurm_job
from gridrun.engine.backends.base import Slot
from gridrun.engine.backends.local import LocalBackend
from gridrun.engine.backends.registry import make_backend, slots_for_backend
from gridrun.engine.backends.slots import slots_for
from gridrun.engine.scheduler import Engine
from gridrun.runs import layout, states
from gridrun.runs.store import Store
from gridrun.spec import EngineConfig, SpecError, load_engine_config

GRIDRUN = [sys.executable, "-m", "gridrun"]
EXAMPLE = Path(__file__).resolve().parents[1] / "experiments.toml"


def _cluster_answers() -> str | None:
    """Why the cluster tests cannot run here, or None."""
    if shutil.which("sinfo") is None:
        return "no SLURM here (`sinfo` missing; scripts/slurm-cluster.sh start makes one)"
    try:
        out = patience.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        return "no SLURM cluster answers (sinfo timed out)"
    if out.returncode or not any(s.strip("*~#") in ("idle", "mixed", "allocated")
                                 for s in out.stdout.split()):
        return f"no SLURM node is up: {(out.stderr or out.stdout).strip()[:200]}"
    try:
        import submitit  # noqa: F401
    except ImportError:
        return "submitit is not installed (pip install 'gridrun[slurm]')"
    return None


@pytest.fixture(scope="module")
def cluster(stand_in_gpus):
    why = _cluster_answers()
    if why:
        pytest.skip(why)


def probe_run(seed: int = 0, sleep: float = 0.0, epochs: int = 2, **trainer):
    """spirals that prints CUDA_VISIBLE_DEVICES and sleeps on each step; checkpoints every 2."""
    return make_run("ray_tasks:probe", seed, epochs=epochs, checkpoint_every=2,
                    task_args={**TINY, "step_sleep": sleep}, **trainer)


def slurm(root: Path, **config) -> tuple:
    cfg = EngineConfig(backend="slurm", **{"max_jobs": 2, **config})
    backend = make_backend(cfg, root, root / "engine.log")
    backend.start()
    return backend, Engine(root, backend, slots_for_backend(backend, cfg), tick=0.1, backoff=0.05)


def drain(engine: Engine, timeout: float = 180.0) -> None:
    deadline = patience.Deadline(timeout)
    while not engine.idle():
        assert not deadline.passed(), "the queue did not drain"
        engine.step()


def reference(tmp_path: Path, runs: list) -> Path:
    """The same runs on the local backend, never interrupted."""
    root = tmp_path / "local"
    backend = LocalBackend(forkserver=False)
    with Store(root) as store:
        store.enqueue(runs)
        engine = Engine(root, backend, [Slot("cpu0"), Slot("cpu1")], tick=0.1)
        engine.start()
        drain(engine)
    backend.close()
    return root


def ref_of(backend, run_id):
    return backend.refs.get(run_id)


def squeue(job_id: str) -> str:
    """The job's state letters in squeue ("" when SLURM is done with it)."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%t"], capture_output=True, text=True)
    return out.stdout.strip()


# ---- without a cluster ------------------------------------------------------------------


def test_without_submitit_the_extra_is_named(tmp_path):
    code = ("import sys; sys.modules['submitit'] = None\n"
            "from gridrun.engine.backends.registry import BackendError, make_backend\n"
            "from gridrun.spec import EngineConfig\n"
            "try:\n    make_backend(EngineConfig(backend='slurm'), '.')\n"
            "except BackendError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert "pip install 'gridrun[slurm]'" in proc.stdout, proc.stderr


def test_only_the_backend_imports_submitit():
    import ast

    import gridrun

    package = Path(gridrun.__file__).parent
    importers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] == "submitit" for n in names):
                importers.add(path.relative_to(package).as_posix())
    assert importers == {"engine/backends/slurm.py"}


def test_job_files_are_replaced_whole(tmp_path):
    slurm_job.write(tmp_path, slurm_job.TICKET, {"token": "a"})
    assert slurm_job.read(tmp_path, slurm_job.TICKET) == {"token": "a"}
    (tmp_path / slurm_job.STATUS).write_text("{half")
    assert slurm_job.read(tmp_path, slurm_job.STATUS) == {}
    assert not list(tmp_path.glob("*.tmp"))


def test_auto_gpus_are_the_allocations():
    auto = EngineConfig(gpus="auto")
    names = lambda env: [(s.name, s.cuda_visible_devices) for s in slots_for(auto, env=env)]  # noqa: E731
    assert names({"CUDA_VISIBLE_DEVICES": "2,5"}) == [("gpu2", "2"), ("gpu5", "5")]
    assert names({"SLURM_JOB_GPUS": "1,3"}) == [("gpu1", "1"), ("gpu3", "3")]
    assert names({"CUDA_VISIBLE_DEVICES": "1", "SLURM_JOB_GPUS": "1,3"}) == [("gpu1", "1")]
    assert names({"CUDA_VISIBLE_DEVICES": ""}) == [("cpu0", ""), ("cpu1", "")]  # given none
    assert names({"CUDA_VISIBLE_DEVICES": "GPU-8a1b-2c"}) == [("gpu0", "GPU-8a1b-2c")]
    assert names({"CUDA_VISIBLE_DEVICES": "0,NoDevFiles,1"}) == [("gpu0", "0")]  # CUDA stops there
    assert [s.name for s in slots_for(EngineConfig(gpus=(0,)), env={"CUDA_VISIBLE_DEVICES": "3"})] \
        == ["gpu0"]  # an explicit list is the user's word


def test_slurm_keys_get_the_files_errors(tmp_path):
    f = tmp_path / "x.toml"
    f.write_text('[experiments.a]\ntask = "spirals"\n\n[engine]\nbackend = "slurm"\n'
                 'gpus_per_run = -1\nmem = "lots"\ntime = "soon"\nmax_job = 4\n'
                 'slurm_args = { output = "x", "--bad" = 1 }\n')
    with pytest.raises(SpecError) as e:
        load_engine_config(f)
    text = str(e.value)
    for fragment in ("x.toml:6:", "engine.gpus_per_run: expected an integer >= 0", "x.toml:7:",
                     "engine.mem: expected a size as sbatch --mem takes it", "x.toml:8:",
                     "engine.time: expected a time limit", "x.toml:9:", "did you mean 'max_jobs'?",
                     "--output is set by gridrun", "'--bad' is not an sbatch option name"):
        assert fragment in text, text
    f.write_text('[experiments.a]\ntask = "spirals"\n\n[engine]\nbackend = "slurm"\n'
                 'partition = "gpu"\ntime = 90\nmem = 4000\nruns_per_job = 10\n'
                 'slurm_args = { reservation = "mine", exclusive = true }\n')
    cfg = load_engine_config(f)
    assert (cfg.partition, cfg.time, cfg.mem, cfg.runs_per_job, cfg.gpus_per_run) == \
        ("gpu", "90", "4000M", 10, 1)
    assert cfg.slurm_args == {"reservation": "mine", "exclusive": True}


# ---- on the cluster ---------------------------------------------------------------------


def test_root_check_and_slots(cluster, tmp_path):
    backend, _ = slurm(tmp_path, max_jobs=3)
    assert [s.name for s in backend.slots()] == ["slurm0", "slurm1", "slurm2"]
    assert not list(tmp_path.glob(".gridrun-probe*"))  # the check's job answered and was cleaned


# no timeout of its own: its `gridrun run --wait` is bounded in quiet seconds (800), and the
# global hour (pyproject.toml) is the hang guard a busy machine cannot reach (issue 44)
def test_the_example_file_on_slurm_gives_the_local_metrics(cluster, tmp_path):
    """`gridrun run --wait` of the README's example (its 18-run matrix: a grid, ablations,
    seeds) with its [engine] table changed (three runs a job, two jobs at once on this
    2-core node) and 2 epochs instead of 6 (CI's time: all 18 runs at 6 epochs matched
    when this was written): every run completes in a SLURM job, and a sample of them
    (the first and last cell of each experiment) is bit for bit what the local
    backend gives."""
    from gridrun.spec import load_runs

    head, engine = EXAMPLE.read_text().split("[engine]")
    assert "\nepochs = 6 " in head
    head = head.replace("\nepochs = 6 ", "\nepochs = 2 ")
    locally, on_slurm = tmp_path / "local.toml", tmp_path / "experiments.toml"
    locally.write_text(head + "[engine]" + engine)
    on_slurm.write_text(head + '[engine]\nbackend = "slurm"\ngpus_per_run = 0\nmax_jobs = 6\n'
                               "runs_per_job = 3\n")
    runs = load_runs(on_slurm)
    assert len(runs) == 18
    assert [r.id for r in load_runs(locally)] == [r.id for r in runs]  # [engine] is no part of an id
    root = tmp_path / "slurm"
    try:
        proc = patience.run([*GRIDRUN, "run", str(on_slurm), "--wait", "--no-check", "--root",
                             str(root)], capture_output=True, text=True, timeout=800)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    finally:
        daemon.stop(root)
    with Store(root) as store:
        done = store.list_runs()
    assert {r.status for r in done} == {states.COMPLETED} and len(done) == len(runs)
    assert all(r.placement["job_id"] for r in done)
    by_experiment: dict[str, list] = {}
    for run in runs:
        by_experiment.setdefault(run.experiment, []).append(run)
    sample = [r for rs in by_experiment.values() for r in (rs[0], rs[-1])]
    local = reference(tmp_path, sample)
    for run in sample:
        assert metrics_without_timing(root, run) == metrics_without_timing(local, run), run.variant


def test_a_root_the_nodes_cannot_see_stops_the_start(cluster, tmp_path):
    """The engine's side sees the root through a private tmpfs mount (its own mount
    namespace); the node's job sees the folder beneath it, without the check's file."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to hide the root from the node")
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    code = ("from gridrun.engine.backends.registry import make_backend\n"
            "from gridrun.spec import EngineConfig\n"
            f"backend = make_backend(EngineConfig(backend='slurm'), {str(root)!r})\n"
            "try:\n    backend.start()\nexcept RuntimeError as e:\n    print(e)\n")
    proc = patience.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                         f"mount -t tmpfs -o mode=700 none {root} && exec \"$0\" -c \"$1\"",
                         sys.executable, code], capture_output=True, text=True, timeout=120)
    if "mount" in proc.stderr or "unshare" in proc.stderr:
        pytest.skip(f"cannot make a private mount here: {proc.stderr.strip()[:200]}")
    assert "is not shared with the SLURM node" in proc.stdout, proc.stdout + proc.stderr
    assert "--root" in proc.stdout


def test_gpus_come_from_slurm_a_third_run_waits_and_metrics_match_local(cluster, tmp_path):
    runs = [probe_run(seed=s, sleep=0.3, epochs=2) for s in range(3)]
    backend, engine = slurm(tmp_path, max_jobs=3, gpus_per_run=1)
    with Store(tmp_path) as store:
        store.enqueue(runs)
        engine.start()
        engine.step(0.05)
        assert store.counts() == {states.RUNNING: 3}  # three submitted ...

        def started():
            engine.step(0.05)
            return [r for r in backend.refs.values() if r.started_after is not None]
        two = wait_for(lambda: len(started()) >= 2 and started(), timeout=90)
        assert sorted(r.cuda for r in two) == ["0", "1"]  # SLURM's assignment, distinct
        third = next(r for r in backend.refs.values() if r not in two)
        assert squeue(third.job_id) == "PD"  # ... and the third waits for a GPU in SLURM
        drain(engine)
        done = store.list_runs()
        assert {r.status for r in done} == {states.COMPLETED}
        assert all(r.placement["job_id"] and r.placement["node"] for r in done)
    seen = [(layout.run_dir(tmp_path, "e", r.id) / layout.OUTPUT).read_text() for r in runs]
    assert all("CUDA_VISIBLE_DEVICES='0'" in s or "CUDA_VISIBLE_DEVICES='1'" in s for s in seen)
    local = reference(tmp_path, runs)
    for run in runs:
        assert metrics_without_timing(tmp_path, run) == metrics_without_timing(local, run)


def test_cancel_checkpoints_ends_the_job_and_the_run_is_cancelled(cluster, tmp_path):
    run = probe_run(sleep=0.2, epochs=30)
    backend, engine = slurm(tmp_path)
    with Store(tmp_path) as store:
        store.enqueue([run])
        engine.start()
        checkpoint = layout.run_dir(tmp_path, "e", run.id) / layout.CHECKPOINTS / "last.pt"
        wait_for(lambda: (engine.step(0.05), checkpoint.exists())[1], timeout=90)
        job_id = ref_of(backend, run.id).job_id
        store.cancel([run.id])
        drain(engine, timeout=60)
        assert store.get_run(run.id).status == states.CANCELLED
    wait_for(lambda: squeue(job_id) == "", timeout=30)  # the job is over, not left running


@pytest.mark.parametrize("how", ["signal", "requeue", "scancel"])
def test_a_preempted_or_cancelled_job_resumes_exactly(cluster, tmp_path, tmp_path_factory, how):
    """`scancel --signal` (what SLURM sends before a time limit or a preemption),
    `scontrol requeue` (a preemption that requeues), or a plain `scancel` from
    outside gridrun: the run checkpoints, returns to gridrun's queue, resumes in a
    new job and ends with the metrics of a run never interrupted."""
    run = probe_run(seed=3, sleep=0.15, epochs=6)
    backend, engine = slurm(tmp_path)
    with Store(tmp_path) as store:
        store.enqueue([run])
        engine.start()
        checkpoint = layout.run_dir(tmp_path, "e", run.id) / layout.CHECKPOINTS / "last.pt"
        wait_for(lambda: (engine.step(0.05), checkpoint.exists())[1], timeout=90)
        first = ref_of(backend, run.id).job_id
        cmd = {"signal": ["scancel", "--signal=USR2", first], "requeue": ["scontrol", "requeue", first],
               "scancel": ["scancel", first]}[how]
        subprocess.run(cmd, check=True)
        wait_for(lambda: (engine.step(0.05), ref_of(backend, run.id) is not None
                          and ref_of(backend, run.id).job_id != first)[1], timeout=60)
        drain(engine)
        done = store.get_run(run.id)
        assert done.status == states.COMPLETED, done.error
        assert done.placement["job_id"] != first
    output = (layout.run_dir(tmp_path, "e", run.id) / layout.OUTPUT).read_text()
    assert "resumed from step" in output  # from its checkpoint, not from the start
    assert metrics_without_timing(tmp_path, run) == uninterrupted(run, tmp_path_factory)


def uninterrupted(run, tmp_path_factory, _done: dict = {}):  # noqa: B006 - one reference a run
    """The run's metrics on the local backend, trained once for all three ways."""
    if run.id not in _done:
        local = reference(tmp_path_factory.mktemp("reference"), [run])
        _done[run.id] = metrics_without_timing(local, run)
    return _done[run.id]


def test_a_killed_engine_adopts_the_jobs_in_flight(cluster, tmp_path):
    runs = [probe_run(seed=10 + s, sleep=0.2, epochs=3) for s in range(4)]
    with Store(tmp_path) as store:
        store.enqueue(runs)
        store.set_state("engine_config", dataclasses.asdict(EngineConfig(backend="slurm", max_jobs=2)))
    env = {**os.environ, "GRIDRUN_ENGINE_OPTIONS": '{"tick": 0.1}'}
    first = subprocess.Popen([*GRIDRUN, "engine", "start", "--foreground", "--root", str(tmp_path)],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with Store(tmp_path) as store:
            def started():
                return [r for r in store.list_runs(status=states.RUNNING)
                        if (r.placement or {}).get("state") == "RUNNING"]
            before = wait_for(lambda: len(started()) == 2 and started(), timeout=90)
            first.send_signal(signal.SIGKILL)  # mid-queue: two jobs in flight, two queued
            first.wait()
            jobs = {r.id: r.placement["job_id"] for r in before}
            second = daemon.start(tmp_path)
            assert second.running
            wait_for(lambda: all(r.status in states.FINISHED for r in store.list_runs()), timeout=180)
            done = store.list_runs()
        assert {r.status for r in done} == {states.COMPLETED}
        for r in done:
            if r.id in jobs:  # adopted in its job, never submitted again
                assert r.placement["job_id"] == jobs[r.id]
        assert "adopted" in (tmp_path / daemon.LOG).read_text()
    finally:
        first.kill()
        daemon.stop(tmp_path)
    local = reference(tmp_path, runs)
    for run in runs:
        assert metrics_without_timing(tmp_path, run) == metrics_without_timing(local, run)


def test_a_job_neither_sacct_nor_squeue_knows_interrupts_the_run(cluster, tmp_path, monkeypatch):
    """Accounting lagging or down: after SACCT_GRACE, squeue decides; a job gone from
    both is gone, and the run resumes from its checkpoint."""
    import submitit

    from gridrun.engine.backends import slurm as slurm_backend

    monkeypatch.setattr(slurm_backend, "SACCT_GRACE", 0.0)
    monkeypatch.setattr(slurm_backend, "SETTLE", 0.0)
    backend = slurm_backend.SlurmBackend(tmp_path, EngineConfig(backend="slurm"), check_shared=False)
    ref = slurm_backend._Ref("r1", tmp_path, "token", False, job_id="99999999", state="PENDING")
    ref.handle = slurm_backend.Handle("r1", tmp_path, 0, 0.0, None, extra=ref)
    backend.refs["r1"] = ref
    backend.jobs["99999999"] = submitit.SlurmJob(folder=tmp_path / "%j", job_id="99999999")
    [ended] = wait_for(lambda: backend.poll(0.05), timeout=30)
    assert ended.code == states.EXIT_CODES[states.INTERRUPTED] and ref.state == "VANISHED"


def test_a_bad_partition_fails_the_run_with_sbatchs_message(cluster, tmp_path):
    run = probe_run()
    _, engine = slurm(tmp_path, partition="nosuchpartition")
    with Store(tmp_path) as store:
        store.enqueue([run])
        engine.start()
        drain(engine, timeout=30)
        failed = store.get_run(run.id)
    assert failed.status == states.FAILED
    assert "invalid partition" in failed.error.lower(), failed.error


def test_runs_per_job_runs_a_pack_in_one_job(cluster, tmp_path):
    runs = [probe_run(seed=20 + s, epochs=1) for s in range(4)]
    _, engine = slurm(tmp_path, max_jobs=4, runs_per_job=4, gpus_per_run=0)
    with Store(tmp_path) as store:
        store.enqueue(runs)
        engine.start()
        drain(engine)
        done = store.list_runs()
    assert {r.status for r in done} == {states.COMPLETED}
    assert len({r.placement["job_id"] for r in done}) == 1
    assert not [p for p in tmp_path.rglob("*") if p.is_symlink()]  # nothing doctor would refuse
    seen = [(layout.run_dir(tmp_path, "e", r.id) / layout.OUTPUT).read_text() for r in runs]
    assert all("CUDA_VISIBLE_DEVICES=''" in s for s in seen)  # a 0-GPU job: the runs see none


def test_a_whole_queue_inside_one_allocation(cluster, tmp_path):
    """sbatch --gres=gpu:2: the local backend's gpus = "auto" means the allocation's two
    GPUs; four runs go two at a time, each on one of them."""
    runs = [probe_run(seed=30 + s, sleep=0.3, epochs=2) for s in range(4)]
    with Store(tmp_path) as store:
        store.enqueue(runs)
        store.set_state("engine_config", dataclasses.asdict(EngineConfig()))
    script = tmp_path / "queue.sbatch"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --gres=gpu:2
        #SBATCH --cpus-per-task=2
        #SBATCH --output={tmp_path}/allocation.log
        {' '.join(GRIDRUN)} engine start --foreground --until-idle --root {tmp_path}
        """))
    out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                         check=True)
    job_id = out.stdout.strip()
    wait_for(lambda: squeue(job_id) == "", timeout=180, interval=0.5)
    log = (tmp_path / "allocation.log").read_text()
    assert "slots gpu0, gpu1" in log, log
    with Store(tmp_path) as store:
        done = store.list_runs()
    assert {r.status for r in done} == {states.COMPLETED}, log
    gpus = []
    for r in done:
        text = (layout.run_dir(tmp_path, "e", r.id) / layout.OUTPUT).read_text()
        gpus += [line.split("=")[1] for line in text.splitlines()
                 if line.startswith("CUDA_VISIBLE_DEVICES=")]
    assert sorted(gpus) == ["'0'", "'0'", "'1'", "'1'"]
    # two at a time: some run started before another ended, never three at once
    spans = sorted((r.started_at, r.ended_at) for r in done)
    assert any(b[0] < a[1] for a, b in itertools.pairwise(spans))
    assert not any(c[0] < a[1] and c[0] < b[1]
                   for a, b, c in zip(spans, spans[1:], spans[2:], strict=False))


def test_a_search_decides_on_slurm_what_it_decides_locally(cluster, tmp_path):
    """A small ASHA search (4 trials, rungs at 1, 2 and 4 epochs), each trial's stretch to
    its rung a SLURM job (a promotion resumes from the checkpoint in a new job), gives
    the trials, promotions, stops, winner and winner's weights of the local backend."""
    runs = search_runs(tmp_path, SMALL)
    _, engine = slurm(tmp_path, max_jobs=4, gpus_per_run=0)
    on_slurm = drained(tmp_path, engine, runs)
    here = decided_locally(tmp_path / "local", runs)
    assert len(on_slurm["promotions"]) == 2 + 1 and len(on_slurm["stopped"]) == 3  # 4 -> 2 -> 1
    assert on_slurm == here


def test_a_two_device_run_is_one_job_with_two_gpus_and_the_bits_of_one_device(cluster, tmp_path):
    """Issue 38: the job asks SLURM for both GPUs, the run's ranks start inside it, and an
    invariant run ends with the bits of the same run on one device, trained locally."""
    wide = probe_run(seed=0, epochs=2, accumulate=2, threads=1, devices=2, reduce="invariant")
    _, engine = slurm(tmp_path / "slurm", max_jobs=2, gpus_per_run=1)
    with Store(tmp_path / "slurm") as store:
        store.enqueue([wide])
        engine.start()
        drain(engine, timeout=300)
        row = store.list_runs()[0]
        assert row.status == states.COMPLETED, row.error
    out = (layout.run_dir(tmp_path / "slurm", "e", wide.id) / layout.OUTPUT).read_text()
    assert "CUDA_VISIBLE_DEVICES='0,1'" in out and "2 devices (gloo, reduce = invariant)" in out
    local = reference(tmp_path, [wide.with_trainer(devices=1)])  # the same id: invariant
    assert metrics_without_timing(tmp_path / "slurm", wide) == metrics_without_timing(local, wide)
    hashes = {json.loads((layout.run_dir(r, "e", wide.id) / layout.SUMMARY).read_text())
              ["weights_sha256"] for r in (tmp_path / "slurm", local)}
    assert len(hashes) == 1
