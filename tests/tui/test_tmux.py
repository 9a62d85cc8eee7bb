"""The interface in a real terminal: tmux runs `gridrun`, the test types keys
and reads the screen back. Queue a file by keyboard, start the engine, wait
for the runs, compare, export the CSV, quit."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import patience
import pytest

from gridrun.engine import daemon
from gridrun.runs.store import Store

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")

EXPERIMENTS = """
[defaults]
task = "spirals"
epochs = 3
lr = 1e-2
batch_size = 64
train_size = 512
val_size = 128
hidden = 16
seeds = 2

[experiments.tricks]
ablations.sgd = { optimizer = "sgd", lr = 0.05 }

[engine]
cpu_slots = 2
"""


# Pytest plugins may export COLUMNS/LINES (they would pin the app to 80x24); the
# developer's COLORTERM or NO_COLOR would change the colours the tests read.
APP_ENV = "env -u COLUMNS -u LINES -u COLORTERM -u NO_COLOR"


class Terminal:
    def __init__(self, socket: Path, cwd: Path, command: str, size: tuple[int, int] = (120, 36)):
        self.socket = socket
        started = self.tmux("new-session", "-d", "-s", "gridrun", "-x", str(size[0]),
                            "-y", str(size[1]), "-c", str(cwd), command)
        assert started.returncode == 0, started.stderr

    def tmux(self, *args: str) -> subprocess.CompletedProcess:
        # -f /dev/null: the user's ~/.tmux.conf (default-terminal, ...) must not change the test
        return patience.run(["tmux", "-f", "/dev/null", "-S", str(self.socket), *args],
                            capture_output=True, text=True, timeout=30)

    def screen(self, escapes: bool = False) -> str:
        return self.tmux("capture-pane", "-p", *(["-e"] if escapes else []), "-t", "gridrun").stdout

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "gridrun", *keys)

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        deadline = patience.Deadline(timeout)
        while not deadline.passed():
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{text!r} never appeared; the screen:\n{self.screen()}")

    def alive(self) -> bool:
        return self.tmux("has-session", "-t", "gridrun").returncode == 0

    def close(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.tmux("kill-server")


def test_queue_watch_compare_export_quit_in_tmux(tmp_path):
    work, root = tmp_path / "work", tmp_path / "runs"
    work.mkdir()
    (work / "experiments.toml").write_text(EXPERIMENTS)
    command = f"exec {APP_ENV} GRIDRUN_ROOT={root} {sys.executable} -m gridrun"
    term = Terminal(tmp_path / "tmux.sock", work, command)
    try:
        term.wait_for("a queue file")  # the footer: the app is up and reads keys
        time.sleep(0.5)
        term.keys("a")
        term.wait_for("./experiments.toml")
        term.keys("Enter")
        term.wait_for("4 runs")
        term.wait_for("enter queues the runs", timeout=60)  # the task check, in a subprocess
        term.keys("Enter")
        term.wait_for("queued 4 runs")
        term.keys("E")
        deadline = patience.Deadline(240)
        while not deadline.passed():
            with Store(root) as store:
                if {r.status for r in store.list_runs()} == {"completed"}:
                    break
            time.sleep(0.5)
        else:
            raise AssertionError(f"runs did not finish; the screen:\n{term.screen()}")
        main = term.wait_for("✓4 of 4", timeout=10)
        assert "tricks" in main and "sgd" in main and "baseline" in main

        term.keys("t")
        term.wait_for("compare: tricks")
        compare = term.wait_for("±")
        assert "baseline" in compare and "sgd" in compare and "2/2" not in compare
        term.keys("e")
        term.wait_for("Export the table as CSV to")
        term.keys("Enter")
        term.wait_for("wrote")
        term.keys("q")
        deadline = patience.Deadline(10)
        while term.alive() and not deadline.passed():
            time.sleep(0.1)
        assert not term.alive(), "q did not quit"
        assert daemon.status(root).running, "quitting the interface must leave the engine running"
    finally:
        try:
            term.close()
        finally:
            daemon.stop(root, force=True)

    table = pd.read_csv(work / "tricks.csv")  # the export's default: the current folder
    assert list(table["ablation"]) == ["baseline", "sgd"]
    assert list(table["n"]) == [2, 2]
    assert {"loss_mean", "loss_std", "accuracy_mean", "loss_delta", "loss_p"} <= set(table.columns)
    with Store(root) as store:
        assert len(store.list_runs()) == 4



def colours(screen: str) -> set[int]:
    """The 256-colour indices tmux uses to redraw a captured screen."""
    return {int(m) for m in re.findall(r"\x1b\[[0-9;]*?[34]8;5;(\d+)", screen)}


GREYS = {16, 231, *range(232, 256)}  # black, white and the grey ramp of the 256 colours


def test_no_color_paints_in_greys_only(tmp_path):
    from test_engine_kit import make_run

    root = tmp_path / "runs"
    with Store(root) as store:
        runs = [make_run(seed=s) for s in range(3)]
        store.enqueue(runs)
        for run, end in zip(runs, ("completed", "failed"), strict=False):
            store.transition(run.id, "queued", "running")
            store.transition(run.id, "running", end)
    screens = {}
    for name, env in (("colour", ""), ("no colour", "NO_COLOR=1 ")):
        term = Terminal(tmp_path / f"{name}.sock", tmp_path, f"exec {APP_ENV} "
                        f"{env}GRIDRUN_ROOT={root} {sys.executable} -m gridrun", size=(100, 20))
        try:
            term.wait_for("failed")
            time.sleep(0.5)
            screens[name] = term.screen(escapes=True)
        finally:
            term.close()
    assert colours(screens["colour"]) - GREYS, "the check needs a coloured screen to compare with"
    assert colours(screens["no colour"]) <= GREYS, screens["no colour"]


def test_clone_with_two_overrides_then_reopen_in_tmux(tmp_path):
    """Issue 17's crash: clone with `epochs=60 lr=0.005`, quit, open again. The clone is
    one run with both keys; a row of the wrong types (what the old clone queued) renders;
    the interface stays up and quits with status 0."""
    import json

    from test_engine_kit import make_run

    root = tmp_path / "runs"
    with Store(root) as store:
        run = make_run(seed=0)
        store.enqueue([run])
        store.transition(run.id, "queued", "running")
        store.transition(run.id, "running", "completed")
        bad = make_run(seed=1)  # the row the old clone queued: epochs = '60 lr=0.005'
        store.enqueue([bad])
        config = bad.to_dict()
        config["trainer"] = {**config["trainer"], "epochs": "60 lr=0.005"}
        with store._tx() as db:
            db.execute("UPDATE runs SET config = ?, summary = ? WHERE id = ?",
                       (json.dumps(config), json.dumps({"step": "x", "train_loss": "y"}), bad.id))
    rc = tmp_path / "rc"
    command = (f"{APP_ENV} GRIDRUN_ROOT={root} {sys.executable} -m gridrun; echo $? > {rc}; "
               "sleep 30")

    def opened(n: int) -> Terminal:
        if rc.exists():
            rc.unlink()
        # a socket of its own each time: kill-server returns before the old server is gone,
        # and a new session on its socket then dies with it ("server exited unexpectedly")
        term = Terminal(tmp_path / f"tmux{n}.sock", tmp_path, command, size=(100, 30))
        term.wait_for("queue file")
        term.wait_for(bad.id[:6])
        time.sleep(0.5)
        return term

    term = opened(1)
    try:
        for _ in range(5):  # the completed run is the first row
            term.keys("k")
        term.keys("d")
        term.wait_for("Clone")
        term.keys("C-u")  # the field starts empty, but be sure
        term.tmux("send-keys", "-t", "gridrun", "-l", "epochs=60 lr=0.005")
        # Enter only once the field shows what was typed: a busy machine may still be
        # drawing the dialog when the keys arrive (CI failed so: no clone was queued)
        term.wait_for("epochs=60 lr=0.005")
        term.keys("Enter")
        # the clone is checked in a subprocess (torch, the task) that may take up to its
        # own 120 s limit on a machine running two test files at once
        term.wait_for("queued clone", timeout=120)
        term.keys("q")
        deadline = patience.Deadline(30)  # a loaded machine: as long as wait_for's
        while not rc.exists() and not deadline.passed():
            time.sleep(0.1)
        assert rc.read_text().strip() == "0"
    finally:
        term.close()

    with Store(root) as store:
        clones = [r for r in store.list_runs() if r.id not in (run.id, bad.id)]
    assert len(clones) == 1
    assert clones[0].config["trainer"]["epochs"] == 60 and clones[0].config["trainer"]["lr"] == 0.005

    term = opened(2)
    try:
        screen = term.wait_for(clones[0].id)
        assert "epochs=60" in screen and "Traceback" not in screen
        time.sleep(1.5)  # a few refreshes later, still up
        assert term.alive() and not rc.exists()
        term.keys("q")
        deadline = patience.Deadline(30)  # a loaded machine: as long as wait_for's
        while not rc.exists() and not deadline.passed():
            time.sleep(0.1)
        assert rc.read_text().strip() == "0"
    finally:
        term.close()
