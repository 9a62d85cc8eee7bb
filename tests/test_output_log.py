"""output.log is capped (the first and the last lines are kept) and `gridrun logs`
reads only the tail it prints, then follows across cuts without losing or repeating."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import patience
import pytest
from test_engine_kit import make_run, prepare, wait_exit
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.engine.backends.base import Slot
from gridrun.engine.backends.local import LocalBackend
from gridrun.runs import layout, outputlog
from gridrun.runs.store import Store
from gridrun.spec import RunSpec

MB = 1 << 20


def chatty(lines: int = 1_000_000, **kwargs):
    """A task that prints ~100 MB (numbered lines) before it trains."""
    from gridrun.tasks.spirals import spirals

    print("FIRST LINE", flush=True)
    for i in range(lines):
        print(f"line {i:>9} " + "x" * 88)
    print("LAST LINE", flush=True)
    return spirals(**kwargs)


@pytest.mark.slow
def test_a_run_printing_100_mb_keeps_a_capped_head_and_tail(tmp_path):
    backend = LocalBackend(forkserver=False)
    run = make_run("test_output_log:chatty", seed=0, epochs=1,
                   task_args={"train_size": 128, "val_size": 32, "hidden": 8})
    try:
        backend.launch(run.id, prepare(tmp_path, run), Slot("cpu0"))
        ended = wait_exit(backend)
    finally:
        for proc in list(backend.procs.values()):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.handle.pid, 9)
        backend.close()
    assert [e.code for e in ended] == [0]
    log = layout.run_dir(tmp_path, "e", run.id) / layout.OUTPUT
    size = log.stat().st_size
    assert 6 * MB < size <= outputlog.CAP + 4096
    with open(log, "rb") as f:
        head = f.read(64)
    assert head.startswith(b"FIRST LINE\nline         0 ")
    tail = outputlog.tail_lines(log, 500)
    assert "LAST LINE" in tail and "line    999999 " in tail
    assert "train step" in tail  # training went on after the prints
    text = log.read_bytes()
    assert text.count(b"[gridrun: output cut here") == 1


def feed(path, chunks, **caps):
    """Run the keeper as the child does: a pipe in, output.log out."""
    proc = subprocess.Popen([sys.executable, "-I", "-S", outputlog.__file__, str(path),
                             *(str(caps[k]) for k in ("head", "cap", "keep") if k in caps)],
                            stdin=subprocess.PIPE)
    for chunk in chunks:
        proc.stdin.write(chunk)
    proc.stdin.close()
    assert patience.wait(proc, 60) == 0


def numbered(n, start=0):
    return [f"line {i}\n".encode() for i in range(start, start + n)]


def test_the_keeper_cuts_the_middle_at_line_ends(tmp_path):
    log = tmp_path / layout.OUTPUT
    log.write_bytes(b"from an earlier attempt\n")  # appended to, never replaced
    feed(log, numbered(20_000), head=1000, cap=20_000, keep=8000)
    data = log.read_bytes()
    assert len(data) <= 20_000
    lines = data.decode().splitlines()
    assert lines[0] == "from an earlier attempt" and lines[1] == "line 0"
    assert lines[-1] == "line 19999"
    marker = next(i for i, line in enumerate(lines) if line.startswith("[gridrun: output cut here"))
    assert marker < 200  # the head is short; then the kept tail, whole lines in order
    tail = [int(x.split()[1]) for x in lines[marker + 1:]]
    assert tail == list(range(tail[0], 20_000))


def test_a_single_huge_line_is_cut_too(tmp_path):
    log = tmp_path / layout.OUTPUT
    feed(log, [b"y" * 5000] * 20 + [b"\nend\n"], head=1000, cap=20_000, keep=8000)
    data = log.read_bytes()
    assert len(data) <= 20_000 and data.endswith(b"\nend\n") and data.startswith(b"y" * 1000)


def test_tail_lines_reads_only_the_end(tmp_path):
    log = tmp_path / layout.OUTPUT
    with open(log, "wb") as f:
        for i in range(0, 300_000, 1000):
            f.write(b"".join(numbered(1000, i)))
    assert outputlog.tail_lines(log, 3) == "line 299997\nline 299998\nline 299999\n"
    assert outputlog.tail_lines(log, 0) == ""
    small = tmp_path / "small.log"
    small.write_bytes(b"a\nb")  # no newline at the end yet
    assert outputlog.tail_lines(small, 5) == "a\nb"
    assert outputlog.tail_lines(tmp_path / "missing.log", 5) == ""


def test_follow_goes_on_across_cuts_without_repeating(tmp_path):
    log = tmp_path / layout.OUTPUT
    feed(log, numbered(500), head=1000, cap=20_000, keep=8000)
    follower = outputlog.Follower(log, lines=3)
    seen = follower.read()
    assert seen.splitlines() == ["line 497", "line 498", "line 499"]
    printed = []
    for start in range(500, 20_000, 700):  # each feed appends and may cut the file
        feed(log, numbered(700, start), head=1000, cap=20_000, keep=8000)
        printed.append(follower.read())
    got = [int(x.split()[1]) for x in "".join(printed).splitlines() if x.startswith("line")]
    assert got == list(range(500, 20_100))
    follower.close()


def test_follow_behind_by_a_whole_cut_says_what_it_missed(tmp_path):
    log = tmp_path / layout.OUTPUT
    feed(log, numbered(100), head=1000, cap=20_000, keep=8000)
    follower = outputlog.Follower(log, lines=1)
    follower.read()
    # the follower does not read while the file is cut several times
    feed(log, numbered(10_000, 100), head=1000, cap=20_000, keep=8000)
    text = follower.read()
    assert "bytes were cut before they could be shown" in text
    assert text.splitlines()[-1] == "line 10099"


def test_logs_prints_the_last_lines(tmp_path):
    root = tmp_path / "runs"
    spec = make_run(seed=3)
    with Store(root) as store:
        store.enqueue([RunSpec(**{**spec.__dict__})])
    folder = prepare(root, spec)
    with open(folder / layout.OUTPUT, "wb") as f:
        for i in range(0, 1_000_000, 10_000):
            f.write(b"".join(numbered(10_000, i)))
    result = CliRunner().invoke(app, ["logs", spec.id[:6], "--root", str(root)])
    assert result.exit_code == 0
    assert result.output.splitlines() == [f"line {i}" for i in range(999_800, 1_000_000)]
    result = CliRunner().invoke(app, ["logs", spec.id, "-n", "2", "--root", str(root)])
    assert result.output == "line 999998\nline 999999\n"


def test_logs_of_a_run_without_output_log_says_so(tmp_path):
    """Not a silent exit 0: the run has no output.log (not started yet, or trained where
    none was written), said in one line with what to do."""
    root = tmp_path / "runs"
    spec = make_run(seed=4)
    with Store(root) as store:
        store.enqueue([RunSpec(**{**spec.__dict__})])
    prepare(root, spec)
    result = CliRunner().invoke(app, ["logs", spec.id[:6], "--root", str(root)])
    assert result.exit_code == 1, result.output
    (line,) = result.output.splitlines()
    assert f"{spec.id} has no output.log yet" in line and "queued" in line
    assert f"gridrun logs -f {spec.id}" in line


def test_teed_keeps_stdout_and_stderr_apart_and_writes_both_to_the_log(tmp_path):
    """A foreground run's output (its subprocesses' too) reaches output.log and still
    its terminal, stderr on stderr."""
    log = tmp_path / layout.OUTPUT
    script = ("import os, sys\nfrom gridrun.runs import outputlog\n"
              f"with outputlog.teed({str(log)!r}):\n"
              "    print('to stdout')\n    print('to stderr', file=sys.stderr)\n"
              "    os.system('echo from a child')\n"
              "print('after')\n")
    done = patience.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["to stdout", "from a child", "after"]
    assert done.stderr.splitlines() == ["to stderr"]
    assert sorted(log.read_text().splitlines()) == ["from a child", "to stderr", "to stdout"]
