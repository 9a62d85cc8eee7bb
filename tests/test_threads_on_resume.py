"""What a resume does with `threads` (issue 44): a run stopped mid-way keeps, under
"auto", the threads its checkpoint was trained with (the same bits as never
stopping); resumed under a number it cannot keep, it says which field changed in
summary.json, output.log, `ls` and `verify`. Apart from test_invariant_defaults.py
so that the two files' runs share the CI's two workers."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from gridrun.runs import layout

# 10 steps an epoch, 20 in all: the stop at step 9 has an epoch's end and 11 steps after it
SLOW = """
[experiments.slow]
task = "helper_tasks:gated"
inner_task = "shapes"  # convolutions and BatchNorm: other bits on 1 thread than on 2
at = 9
train_size = 320
val_size = 64
epochs = 2
batch_size = 32
checkpoint_every = 2
log_every = 2
"""


def cli(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gridrun", *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_auto_threads_are_kept_on_resume_and_a_change_that_cannot_be_is_said_everywhere(tmp_path):
    """threads = 2 written in the file, stopped mid-way; resumed under "auto" the run
    keeps its 2 threads (the same bits as never stopping); resumed under an explicit
    1 it cannot: summary.json, output.log, `ls` and `verify` say which field changed."""
    gate = tmp_path / "gate"  # the 9th batch waits there: stopped at step 9

    def train(root: str, threads: str) -> subprocess.Popen:
        (tmp_path / "e.toml").write_text(SLOW + f'gate = "{gate}"\n' + threads)
        return cli("train", "e.toml", "--root", root, cwd=tmp_path)

    def ended(proc: subprocess.Popen) -> str:
        out, _ = proc.communicate()
        assert proc.returncode == 0, out
        return out

    gate.touch()  # the undisturbed run passes it
    ended(train("whole", "threads = 2\n"))
    (whole,) = (tmp_path / "whole" / "slow").iterdir()
    whole_hash = json.loads((whole / layout.SUMMARY).read_text())["weights_sha256"]

    gate.unlink()
    Path(f"{gate}.reached").unlink()
    proc = train("kept", "threads = 2\n")
    while not Path(f"{gate}.reached").exists() and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    gate.touch()
    out, _ = proc.communicate()
    assert "interrupted at step" in out, out
    # the same stopped run twice: resumed under "auto" in one root, under 1 in its copy
    shutil.copytree(tmp_path / "kept", tmp_path / "changed")
    (run_dir,) = (tmp_path / "kept" / "slow").iterdir()

    ended(train("kept", ""))  # no threads key: "auto"
    kept = json.loads((run_dir / layout.SUMMARY).read_text())
    assert [a["threads"] for a in kept["attempts"]] == [2, 2]
    assert kept["environment_changes"] == [] and kept["weights_sha256"] == whole_hash

    run_dir = tmp_path / "changed" / "slow" / run_dir.name
    out = ended(train("changed", "threads = 1\n"))
    changed = json.loads((run_dir / layout.SUMMARY).read_text())
    (change,) = changed["environment_changes"]
    assert change["field"] == "threads" and (change["from"], change["to"]) == (2, 1)
    at = change["step"]
    line = f"resumed at step {at} in another environment (threads 2 -> 1)"
    assert line in out and line in (run_dir / layout.OUTPUT).read_text()
    assert any(line in w for w in changed["warnings"])
    ls = subprocess.run([sys.executable, "-m", "gridrun", "ls", "--root", "changed"],
                        cwd=tmp_path, capture_output=True, text=True)
    assert f"resumed in another environment: threads 2 -> 1 at step {at}" in ls.stdout
    checked = subprocess.run([sys.executable, "-m", "gridrun", "verify", changed["run_id"],
                              "--root", "changed"], cwd=tmp_path, capture_output=True, text=True)
    assert checked.returncode != 0, checked.stdout
    assert (f"the run was resumed in another environment: threads 2 -> 1 at step {at}"
            in checked.stdout + checked.stderr), checked.stdout + checked.stderr
