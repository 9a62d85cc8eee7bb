"""Shared test setup.

Tests start real worker processes; tasks written for the tests live in
tests/helper_tasks.py, so the tests folder is put on PYTHONPATH for every
child process as well as this one.
"""

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p
)
# Tests never touch ./runs by accident.
os.environ.pop("GRIDRUN_ROOT", None)


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    """One warm fork server for a test module's in-process engines."""
    from gridrun.engine.backends.local import LocalBackend

    b = LocalBackend(log_path=tmp_path_factory.mktemp("fs") / "forkserver.log")
    b.start()
    yield b
    b.close()


@pytest.fixture(scope="module")
def stand_in_gpus():
    """A test cluster's GPUs are fake (Ray's num_gpus, SLURM's GRES on /dev/null): a run
    given one trains on the CPU and says so (GRIDRUN_FAKE_GPUS); without it the run
    fails with the environment error, as on a real machine."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRIDRUN_FAKE_GPUS", "1")
        yield


_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


@pytest.fixture(autouse=True)
def own_gpu_ledger(tmp_path_factory, monkeypatch):
    """Each test's engines share a GPU ledger of their own (engine/ledger.py), never the
    machine's in /dev/shm: an engine another test left behind in this process (its pid
    lives on) would otherwise commit memory on every later test's fake GPUs."""
    monkeypatch.setenv("GRIDRUN_LEDGER", str(tmp_path_factory.mktemp("ledger") / "gpu-ledger"))


@pytest.fixture(autouse=True)
def signals_as_found(request):
    """A test that changes this process's signal handlers (a process's `main` called in
    process, a library that installs its own) must not hand them to every later test: a
    SIGINT left ignored is inherited by each child started after it, which then cannot
    be stopped with ctrl-c. Put them back, and say which test moved them."""
    import signal

    before = {name: signal.getsignal(getattr(signal, name)) for name in _SIGNALS}
    yield
    moved = [name for name in _SIGNALS if signal.getsignal(getattr(signal, name)) != before[name]]
    for name in moved:
        signal.signal(getattr(signal, name), before[name])
    if moved and os.environ.get("GRIDRUN_TEST_SIGNALS") == "strict":
        pytest.fail(f"{request.node.nodeid} left {', '.join(moved)} changed", pytrace=False)


class _VirtualTime:
    """The `time` module, except that `sleep` takes no real time and moves this clock's
    `perf_counter` on instead."""

    def __init__(self):
        import time

        self._time, self.slept = time, 0.0

    def perf_counter(self) -> float:
        return self._time.perf_counter() + self.slept

    def sleep(self, seconds: float) -> None:
        self.slept += seconds

    def __getattr__(self, name):
        return getattr(self._time, name)


@pytest.fixture
def virtual_sleep(monkeypatch):
    """The test tasks' sleeps (helper_tasks) are virtual and the trainer's clocks (the
    data wait, the training time) see them: an input-bound run's share of waiting stays
    far above any threshold however busy the machine is (a real 2 ms sleep per sample
    measured 49% waiting beside other work, 0.5 expected), and the test sleeps not at all."""
    import helper_tasks

    from gridrun.train import diagnostics
    from gridrun.train.loop import meter

    clock = _VirtualTime()
    for module in (helper_tasks, diagnostics, meter):
        monkeypatch.setattr(module, "time", clock)
    return clock


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real MLflow tracking server for the test module that asks for it (the mirror's
    tests), stopped at the module's end."""
    from mlflow_kit import Server

    s = Server(tmp_path_factory.mktemp("mlflow"))
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    """An MLflow client of the module's `server`."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=server.uri)
