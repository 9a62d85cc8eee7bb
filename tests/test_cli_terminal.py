"""What a person at a terminal sees that a pipe does not: a spinner saying what a
slow command is doing (on stderr, a terminal only), one clear line on ctrl-c
while `gridrun run` starts the engine, the root in every hint, and a warning
for a root others can read."""

from __future__ import annotations

import os
import pty
import select
import stat
import subprocess
import sys
from types import SimpleNamespace

import patience
import pytest
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.commands import follow
from gridrun.engine import daemon

SMALL = """
[experiments.small]
task = "spirals"
epochs = 1
train_size = 64
val_size = 32
seeds = 2
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return path


def stderr_on_a_terminal(args: list[str], cwd) -> tuple[int, str, str]:
    """Run gridrun with stderr on a pseudo-terminal: (exit code, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gridrun", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=slave, stdin=subprocess.DEVNULL, text=True,
                            env={**os.environ, "COLUMNS": "80", "TERM": "xterm-256color"})
    os.close(slave)
    got = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            got += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    out = proc.stdout.read()
    return patience.wait(proc, 60), out, got.decode(errors="replace")


def test_the_task_check_says_what_it_does_on_a_terminal_only(small, tmp_path):
    code, out, terminal = stderr_on_a_terminal(["plan", "--check", str(small)], tmp_path)
    assert code == 0 and "task check passed" in out
    assert "importing torch and the tasks" in terminal and "checking the tasks" in terminal
    piped = patience.run([sys.executable, "-m", "gridrun", "plan", "--check", str(small)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert piped.returncode == 0 and piped.stderr == ""
    assert "\x1b" not in piped.stdout


def test_json_says_nothing_extra_on_a_terminal(small, tmp_path):
    code, out, terminal = stderr_on_a_terminal(["plan", "--check", "--json", str(small)], tmp_path)
    assert code == 0 and out.startswith("{")
    assert "importing torch" not in terminal


def test_ctrl_c_while_the_engine_starts_is_one_line_with_the_root(small, tmp_path, monkeypatch):
    root = tmp_path / "my runs"

    def interrupted(root, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(daemon, "start", interrupted)
    result = CliRunner().invoke(app, ["run", str(small), "--no-check", "--root", str(root)])
    assert result.exit_code == 130
    said = [line for line in result.output.splitlines() if line.strip()]
    assert said[0].startswith("queued 2 runs")
    assert len(said) == 2 and said[1].startswith("interrupted: the runs are queued"), said
    assert f"--root '{root}'" in said[1] and "gridrun engine start" in said[1]


def test_ctrl_c_during_the_task_check_queues_nothing(small, tmp_path, monkeypatch):
    from gridrun.commands import plan

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(plan, "check_or_exit", interrupted)
    result = CliRunner().invoke(app, ["run", str(small), "--root", str(tmp_path / "runs")])
    assert result.exit_code == 130
    assert result.output.strip() == "interrupted: nothing was queued"


def test_the_detach_hint_names_the_root_in_use(small, tmp_path, monkeypatch):
    root = tmp_path / "runs"
    monkeypatch.setattr(daemon, "start", lambda root: SimpleNamespace(pid=1, log=root / "engine.log"))

    def detached(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(follow, "follow", detached)
    result = CliRunner().invoke(app, ["run", str(small), "--no-check", "--root", str(root)])
    assert result.exit_code == 0
    hint = result.output.strip().splitlines()[-1]
    assert hint.startswith("detached:")
    assert hint.count(f"--root {root}") == 3, hint  # run again, ls, the interface


def test_a_root_others_can_read_is_used_with_one_warning_and_left_alone(tmp_path):
    from gridrun.runs.store import Store

    root = tmp_path / "runs"
    root.mkdir(mode=0o700)
    Store(root).close()  # a gridrun root: it holds its store (an empty folder gets no advice)
    os.chmod(root, 0o755)
    done = patience.run([sys.executable, "-m", "gridrun", "ls", "--root", str(root)],
                        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "no runs"
    assert done.stderr.splitlines() == [
        f"warning: the runs root {root} is readable by group or others (mode 0755); "
        f"make it private with `chmod 700 {root}`"]
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o755  # never changed behind the user's back
    os.chmod(root, 0o700)
    quiet = patience.run([sys.executable, "-m", "gridrun", "ls", "--root", str(root)],
                         capture_output=True, text=True, timeout=60)
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_ls_on_a_terminal_cuts_each_line_at_its_width(small, tmp_path):
    """Piped, `ls` writes whole lines (for grep); on a terminal each line ends at the
    terminal's width with `…`, never wrapped over the next rows."""
    queued = CliRunner().invoke(app, ["queue", str(small), "--no-check", "--root",
                                      str(tmp_path / "runs")])
    assert queued.exit_code == 0, queued.output
    piped = patience.run([sys.executable, "-m", "gridrun", "ls", "--root", "runs"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)
    whole = piped.stdout.splitlines()
    assert len(whole) == 3 and whole[0].split() == ["ID", "STATUS", "EXPERIMENT", "VARIANT",
                                                    "SEED", "BEST", "NOTE"]
    assert max(map(len, whole)) > 40
    master, slave = pty.openpty()
    proc = patience.run([sys.executable, "-m", "gridrun", "ls", "--root", "runs"], cwd=tmp_path,
                        stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                        env={**os.environ, "COLUMNS": "40"}, timeout=60)
    os.close(slave)
    got = b""
    while select.select([master], [], [], 0.2)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    os.close(master)
    shown = got.decode().replace("\r\n", "\n").splitlines()
    assert proc.returncode == 0 and len(shown) == 3
    assert shown == [line if len(line) <= 40 else line[:39] + "…" for line in whole]
