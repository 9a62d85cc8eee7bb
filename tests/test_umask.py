"""gridrun under the umask many users have (002: group-writable files by default).

The root and its folders are made 0700 whatever the umask; a file's own mode
bits inside a private folder let no one else in, so they are never a reason to
refuse a root, and gridrun's processes create their files 0600 anyway."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import patience
from test_engine_kit import kill_quietly

from gridrun.engine import daemon
from gridrun.runs import layout

TINY = """
[defaults]
task = "spirals"
epochs = 1
train_size = 128
val_size = 32
hidden = 8
depth = 1
seeds = 2

[experiments.u]

[engine]
cpu_slots = 2
"""


def gridrun(*args, umask: int = 0o002, cwd=None) -> subprocess.CompletedProcess:
    return patience.run([sys.executable, "-m", "gridrun", *args], capture_output=True, text=True,
                        timeout=300, preexec_fn=lambda: os.umask(umask), cwd=cwd)


def test_the_engine_runs_and_reruns_under_umask_002(tmp_path):
    file = tmp_path / "e.toml"
    file.write_text(TINY)
    root = tmp_path / "runs"
    try:
        done = gridrun("run", str(file), "--wait", "--root", str(root))
        assert done.returncode == 0, done.stdout + done.stderr
        # a second engine start on the same root (its own files are there now)
        assert gridrun("engine", "stop", "--root", str(root)).returncode == 0
        again = gridrun("run", str(file), "--wait", "--force", "--root", str(root))
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        kill_quietly(daemon.status(root).pid)
    assert layout.root_problems(root, deep=True) == []
    for path in root.rglob("*"):
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert not mode & 0o077, f"{path} is {mode:04o}"


def test_a_group_writable_file_inside_a_private_folder_is_no_problem(tmp_path):
    root = layout.make_private_dir(tmp_path / "runs")
    run_dir = layout.make_run_dir(root, "e", "0123456789")
    (run_dir / "metrics.jsonl").write_text("")
    os.chmod(run_dir / "metrics.jsonl", 0o664)
    (root / "engine.log").write_text("")
    os.chmod(root / "engine.log", 0o664)
    assert layout.root_problems(root, deep=True) == []
    assert layout.make_run_dir(root, "e", "0123456789") == run_dir
    os.chmod(run_dir, 0o770)  # a folder others can write is still refused
    assert "writable by group or others" in layout.root_problems(root, deep=True)[0]
