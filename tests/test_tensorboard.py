"""`gridrun tensorboard`: every finite value of every metrics line, read back with
TensorBoard's own event reader, at its step and time; a second call adds only
what is new; a cut log is written again; no tensorboard, one line."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import patience
import pytest
from typer.testing import CliRunner

from gridrun.analysis.tensorboard import SYNCED, run_folder, scalars
from gridrun.cli import app
from gridrun.runs import layout, runlog, states
from gridrun.runs import records as rec
from gridrun.runs.store import Store
from gridrun.spec import load_runs

EXTRA = "needs the tensorboard package (pip install 'gridrun[tensorboard]')"
FILE = """
[defaults]
task = "spirals"
epochs = 1
batch_size = 64
train_size = 256
val_size = 64
hidden = 8
log_every = 2

[experiments.tb]
grid = { lr = [1e-3, 1e-2] }
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Two small runs trained in this process, completed in the store."""
    import torch

    from gridrun.train.loop.trainer import train

    base = tmp_path_factory.mktemp("tb")
    spec = base / "tb.toml"
    spec.write_text(FILE)
    root = base / "runs"
    runs = load_runs(spec)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with Store(root) as store:
            store.enqueue(runs)
            for run in runs:
                train(run, layout.make_run_dir(root, run.experiment, run.id), log=lambda s: None)
                store.transition(run.id, states.QUEUED, states.RUNNING)
                store.transition(run.id, states.RUNNING, states.COMPLETED)
    finally:
        torch.set_num_threads(threads)
    return root


def tensorboard(*args: str):
    return CliRunner().invoke(app, ["tensorboard", "--no-serve", *args])


def events(folder: Path) -> dict[str, list[tuple[int, float, float]]]:
    """tag -> [(step, value, wall time)], with TensorBoard's own reader, every point kept."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(folder), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    return {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)), e.wall_time)
                  for e in acc.Tensors(tag)] for tag in acc.Tags()["tensors"]}


def expected(metrics: Path) -> dict[str, list[tuple[int, float, float]]]:
    """What metrics.jsonl says, as float32 values (what an event holds)."""
    import numpy as np

    out: dict[str, list] = {}
    for line in runlog.read_all(metrics):
        for tag, value in scalars(line):
            out.setdefault(tag, []).append((line[rec.STEP], float(np.float32(value)), line[rec.T]))
    return out


def test_events_read_back_equal_the_metrics_log(root, tmp_path):
    pytest.importorskip("tensorboard", reason=EXTRA)
    logdir = tmp_path / "logs"
    result = tensorboard("--root", str(root), "--logdir", str(logdir))
    assert result.exit_code == 0, result.output
    runs = Store(root).list_runs()
    for run in runs:
        folder = run_folder(logdir, run.experiment, run.variant, run.seed, run.id)
        assert folder.name == f"s0 {run.id}" and folder.parent.name == run.variant  # lr=0.001
        got, want = events(folder), expected(run.run_dir(root) / layout.METRICS)
        assert got == want
        assert {"train/loss", "train/lr", "val/loss", "val/accuracy", "throughput/samples_per_s",
                "diagnostics/grad_norm", "memory/rss"} <= set(got)
    points = sum(len(v) for run in runs for v in expected(run.run_dir(root) / layout.METRICS).values())
    assert result.output.strip() == f"wrote {points:,} scalars of 2 runs to {logdir}"


def test_a_second_call_adds_only_what_is_new(root, tmp_path):
    pytest.importorskip("tensorboard", reason=EXTRA)
    logdir = tmp_path / "logs"
    assert tensorboard("--root", str(root), "--logdir", str(logdir)).exit_code == 0
    again = tensorboard("--root", str(root), "--logdir", str(logdir))
    assert again.output.strip() == f"wrote 0 scalars of 0 runs to {logdir}"

    run = Store(root).list_runs()[0]
    metrics = run.run_dir(root) / layout.METRICS
    saved = metrics.read_bytes()
    try:
        with runlog.MetricsWriter(metrics) as w:  # the run logs on (as a live one would)
            w.write(rec.train_line(time.time(), 9999, 9, 0.125, 1e-4, 100.0, 0.01))
        more = tensorboard("--root", str(root), "--logdir", str(logdir), run.id[:6])
        assert more.output.strip() == f"wrote 4 scalars of 1 run to {logdir}"  # loss lr smp/s time
        folder = run_folder(logdir, run.experiment, run.variant, run.seed, run.id)
        assert events(folder) == expected(metrics)  # each point once, across two event files
        assert len(list(folder.glob("events.out.tfevents.*"))) == 2

        metrics.write_bytes(saved[:len(saved) // 2])  # cut (a resume drops lines after its checkpoint)
        metrics.write_bytes(metrics.read_bytes()[:metrics.read_bytes().rfind(b"\n") + 1])
        tensorboard("--root", str(root), "--logdir", str(logdir), run.id)
        assert events(folder) == expected(metrics)  # written again, from the start
        assert json.loads((folder / SYNCED).read_text())["offset"] == metrics.stat().st_size
    finally:
        metrics.write_bytes(saved)


def test_without_tensorboard_one_line(root, tmp_path, monkeypatch):
    for name in ("tensorboard", "tensorboard.summary"):  # as if the extra were not installed
        monkeypatch.setitem(sys.modules, name, None)
    result = tensorboard("--root", str(root), "--logdir", str(tmp_path / "logs"))
    assert result.exit_code == 2
    assert result.output.strip() == ("gridrun tensorboard needs the tensorboard package: "
                                     "pip install 'gridrun[tensorboard]'")
    assert not (tmp_path / "logs").exists()


def test_a_logdir_inside_the_root_is_refused(root):
    result = tensorboard("--root", str(root), "--logdir", str(root / "logs"))
    assert result.exit_code == 2 and "inside the runs root" in result.output


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def at_a_terminal() -> None:
    """ctrl-c at a terminal reaches a process whose SIGINT is not ignored; a SIG_IGN left in
    the test process by an earlier test would be inherited through exec (and Python keeps
    an ignored SIGINT ignored), so the command would never see the ctrl-c sent below."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def serving(root: Path, logdir: Path) -> tuple[subprocess.Popen, list[str]]:
    """`gridrun tensorboard` serving the root's runs (its own session, as a shell's job),
    and the run names TensorBoard lists once it answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gridrun", "tensorboard", "--root", str(root),
                             "--logdir", str(logdir), "--port", str(port), "--every", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True, preexec_fn=at_a_terminal)
    assert "wrote" in proc.stdout.readline()
    assert f"http://localhost:{port}/" in proc.stdout.readline()
    deadline, names = patience.Deadline(60), []
    while not deadline.passed():
        try:
            with urllib.request.urlopen(f"http://localhost:{port}/data/runs", timeout=2) as r:
                names = json.loads(r.read())
            if len(names) == 2:
                break
        except OSError:
            pass
        time.sleep(0.5)
    return proc, names


def descendants(pid: int) -> set[int]:
    """The live processes below `pid` (from /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    found, todo = set(), [pid]
    while todo:
        above = todo.pop()
        below = [p for p, parent in parents.items() if parent == above]
        found.update(below)
        todo.extend(below)
    return found


def alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if state[state.rindex(")") + 2] != "Z":
            out.add(pid)
    return out


@pytest.mark.slow
def test_it_starts_tensorboard_on_the_events(root, tmp_path):
    pytest.importorskip("tensorboard", reason=EXTRA)
    proc, names = None, []
    try:
        proc, names = serving(root, tmp_path / "logs")
        runs = Store(root).list_runs()
        assert sorted(names) == sorted(f"tb/{r.variant}/s0 {r.id}" for r in runs)
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGINT)  # ctrl-c: gridrun stops TensorBoard and exits
            assert patience.wait(proc, 30) == 0


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_stops_tensorboard_and_its_children(root, tmp_path, sig):
    """Sent to gridrun alone (a service manager, a closed terminal): TensorBoard and what
    it started end with it, as on ctrl-c, instead of serving on."""
    pytest.importorskip("tensorboard", reason=EXTRA)
    proc, below = None, set()
    try:
        proc, names = serving(root, tmp_path / "logs")
        assert len(names) == 2
        below = descendants(proc.pid)
        assert below, "TensorBoard is not running under gridrun"
        os.kill(proc.pid, sig)
        patience.wait(proc, 30)
        deadline = patience.Deadline(15)
        while alive(below) and not deadline.passed():
            time.sleep(0.2)
        assert not alive(below), "TensorBoard (or a process it started) still runs"
        assert proc.returncode == 0
    finally:
        for pid in alive(below):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if proc is not None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)


# ---- where event files may not go, a full disk, a log that is a link (issue 36) ----------


def gridrun_tensorboard(root: Path, logdir: Path, *args: str) -> subprocess.CompletedProcess:
    """The command as users run it: its own process, so what a thread of it prints shows."""
    return patience.run([sys.executable, "-m", "gridrun", "tensorboard", "--no-serve", "--root",
                         str(root), "--logdir", str(logdir), *args], capture_output=True,
                        text=True, timeout=120)


def test_a_logdir_in_a_system_folder_is_refused_in_one_line(root):
    for logdir in ("/proc/self/gridrun-tb", "/proc/gridrun-tb/logs"):
        result = tensorboard("--root", str(root), "--logdir", logdir)
        assert result.exit_code == 2, result.output
        assert result.output.strip() == (f"refusing to write event files in {logdir}: it is in "
                                         "the system folder /proc; choose a folder of your own "
                                         "(--logdir)")


def test_a_full_disk_is_one_line_and_what_follows_writes_each_point_once(root, tmp_path):
    pytest.importorskip("tensorboard", reason=EXTRA)
    from tmpfs_kit import fill, mounted

    with mounted(tmp_path / "disk", "2m") as disk:
        filler = fill(disk)
        logdir = disk / "logs"
        done = gridrun_tensorboard(root, logdir)
        assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
        assert done.stderr.strip() == (f"cannot write event files in {logdir}: the disk is full; "
                                       "what was written before stays (free some space, or choose "
                                       "another --logdir)")
        filler.unlink()
        done = gridrun_tensorboard(root, logdir)
        assert done.returncode == 0, done.stderr
        for run in Store(root).list_runs():  # each point once: nothing half-written is left
            folder = run_folder(logdir, run.experiment, run.variant, run.seed, run.id)
            assert events(folder) == expected(run.run_dir(root) / layout.METRICS)


def test_a_metrics_log_that_is_a_link_is_skipped_with_a_note(root, tmp_path):
    pytest.importorskip("tensorboard", reason=EXTRA)
    import shutil

    copy = tmp_path / "runs"
    shutil.copytree(root, copy, symlinks=True)
    linked, kept = Store(copy).list_runs()
    metrics = linked.run_dir(copy) / layout.METRICS
    metrics.unlink()
    metrics.symlink_to(kept.run_dir(copy) / layout.METRICS)
    done = gridrun_tensorboard(copy, tmp_path / "logs")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"note: {metrics} is a symbolic link: gridrun never follows a link inside its root, so "
        f"it was not read (remove it: rm {metrics})"]
    points = sum(len(v) for v in expected(kept.run_dir(copy) / layout.METRICS).values())
    assert done.stdout.strip() == f"wrote {points:,} scalars of 1 run to {tmp_path / 'logs'}"
