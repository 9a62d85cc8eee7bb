"""Bounded inputs and the last tracebacks (issue 24, findings 5, 6 and 7): every one
is one line and a non-zero exit; huge values are refused with the spec's usual
message; names and keys are printed escaped, on the right line; a BOM is
accepted; `rm --delete-folders` removes nothing it cannot delete; a completed
cell queued again keeps its summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import patience
import pytest
from test_engine_kit import drain, engine_for, make_run
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.runs import layout, states
from gridrun.runs.store import Store
from gridrun.spec import SpecError, load_runs

BASE = """
[experiments.a]
task = "spirals"
train_size = 64
val_size = 32
epochs = 1
batch_size = 32
"""


def gridrun(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"{args}: {result.exception!r}\n{result.output}"
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.output


def problems(tmp_path: Path, text: str) -> str:
    path = tmp_path / "exp.toml"
    path.write_text(text)
    with pytest.raises(SpecError) as e:
        load_runs(path)
    return str(e.value)


# ---- finding 5: tracebacks become one line ---------------------------------------------


def test_a_seed_beyond_64_bits_is_refused_by_every_command(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(BASE + "seeds = [99999999999999999999]\n")
    root = str(tmp_path / "runs")
    for args in (["plan", str(path)], ["queue", str(path), "--root", root],
                 ["queue", str(path), "--no-check", "--root", root],
                 ["train", str(path), "--root", root]):
        code, out = gridrun(*args)
        assert code == 2, (args, out)
        assert "exp.toml:8: [experiments.a] seeds: expected" in out and "< 2^63" in out, out
    assert not (tmp_path / "runs").exists()
    for seeds, ok in (("[9223372036854775807]", True), ("[9223372036854775808]", False),
                      ("[-1]", False), ("[0, 7]", True)):
        path.write_text(BASE + f"seeds = {seeds}\n")
        code, out = gridrun("plan", str(path))
        assert (code == 0) == ok, (seeds, out)


def test_a_run_folder_replaced_by_a_file_is_one_line_and_rm_removes_nothing(tmp_path, backend):
    root = tmp_path / "runs"
    run = make_run(seed=0, epochs=1)
    with Store(root) as store:
        store.enqueue([run])
        engine = engine_for(root, backend, slots=1)
        engine.start()
        drain(engine)
    folder = layout.run_dir(root, run.experiment, run.id)
    os.rename(folder, tmp_path / "kept")
    folder.write_text("not a folder any more")
    for follow in ([], ["-f"]):
        code, out = gridrun("logs", run.id, "--root", str(root), *follow)
        assert code == 2 and "is not a folder" in out, out
        assert len(out.strip().splitlines()) == 1
    code, out = gridrun("rm", run.id, "--delete-folders", "--root", str(root))
    assert code == 2 and "not removed" in out and "is not a folder" in out, out
    with Store(root) as store:
        assert [r.id for r in store.list_runs()] == [run.id]  # still in the store
    assert folder.read_text() == "not a folder any more"
    # a real folder is deleted with its run
    folder.unlink()
    os.rename(tmp_path / "kept", folder)
    code, out = gridrun("rm", run.id, "--delete-folders", "--root", str(root))
    assert code == 0 and "deleted" in out, out
    assert not folder.exists() and not [p for p in folder.parent.iterdir()]


def test_ls_on_the_proc_file_system_is_one_line():
    code, out = gridrun("ls", "--root", "/proc")
    assert code == 2 and out.strip().count("\n") == 0 and "system folder" in out


def test_plan_of_a_device_a_fifo_or_a_huge_file_never_hangs_or_reads_it(tmp_path):
    fifo = tmp_path / "exp.toml"
    os.mkfifo(fifo)
    big = tmp_path / "big.toml"
    big.write_text(BASE + "#" * (2 << 20) + "\n")
    for path, says in (("/dev/zero", "not a regular file"), (str(fifo), "not a regular file"),
                       (str(big), "an experiment file is at most 1,048,576 bytes")):
        # a hang (a FIFO opened for reading waits for a writer forever) outlasts any bound:
        # 60 quiet s (tests/patience.py) for a plan that answers in about 1 s
        done = patience.run([sys.executable, "-m", "gridrun", "plan", path], capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 2  # the problem, then "nothing was changed"
        assert "Traceback" not in done.stderr


# ---- finding 6: huge values are refused with the spec's message --------------------------


@pytest.mark.parametrize("key, value, says", [
    ("epochs", "100000000000000000000", "epochs: expected an integer >= 1 and <= 1,000,000"),
    ("epochs", "9223372036854775807", "epochs: expected an integer >= 1 and <= 1,000,000"),
    ("max_steps", "100000000000000000000", "<= 1,099,511,627,776"),
    ("warmup", "100000000000000000000", "warmup: expected a step count >= 0 and <= 1,099,511,627,776"),
    ("log_every", "100000000000000000000", "<= 1,099,511,627,776"),
    ("step_size", "100000000000000000000", "<= 1,099,511,627,776"),
    ("checkpoint_every", "100000000000000000000", "<= 1,099,511,627,776"),
    ("eval_every", "100000000000000000000", "<= 1,099,511,627,776"),
    ("batch_size", "16777217", "batch_size: expected an integer >= 1 and <= 16,777,216"),
    ("accumulate", "65537", "accumulate: expected an integer >= 1 and <= 65,536"),
    ("batch_size", "100000000000000000000", "got 100,000,000,000,000,000,000"),
])
def test_huge_counts_are_refused(tmp_path, key, value, says):
    base = "".join(line + "\n" for line in BASE.splitlines() if not line.startswith(key + " "))
    text = problems(tmp_path, base + f"{key} = {value}\n")
    line = base.count("\n") + 1
    assert f"exp.toml:{line}: [experiments.a] {key}:" in text and says in text, text


def test_the_largest_values_a_run_could_use_pass(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text('[experiments.a]\ntask = "spirals"\n'
                    "epochs = 1000000\nmax_steps = 1099511627776\nbatch_size = 16777216\n"
                    "accumulate = 65536\nlog_every = 1099511627776\nwarmup = 1099511627776\n")
    (run,) = load_runs(path)
    assert run.trainer["epochs"] == 10**6 and run.trainer["accumulate"] == 2**16


def test_a_run_of_more_than_2_to_the_40_steps_is_refused_at_the_task_check(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text('[experiments.long]\ntask = "helper_tasks:huge_data"\n'
                    "train_size = 2000000\nbatch_size = 1\nepochs = 1000000\n")
    code, out = gridrun("queue", str(path), "--root", str(tmp_path / "runs"))
    assert code == 2 and "2,000,000,000,000 optimizer steps" in out and "2^40" in out, out
    assert not (tmp_path / "runs").exists()
    path.write_text(path.read_text() + "max_steps = 1000\n")  # capped: fine
    code, out = gridrun("plan", "--check", str(path))
    assert code == 0, out


# ---- finding 7: escaped names, the right line, a BOM, ls --status --------------------------


def test_a_key_with_a_right_to_left_override_is_escaped_on_its_own_line(tmp_path):
    text = problems(tmp_path, BASE + '"lr\\u202e" = 0.1\n')
    assert "\u202e" not in text
    assert "exp.toml:8: [experiments.a] lr\\u202e: unknown key 'lr\\u202e'" in text, text
    raw = problems(tmp_path, BASE + '"a\u202eb" = 1\n')  # the character itself, in the file
    assert "\u202e" not in raw
    assert "exp.toml:8: [experiments.a] a\\u202eb:" in raw, raw
    escaped = problems(tmp_path, BASE + '"a\\u001b[31m" = 1\n')  # an escape sequence, spelt
    assert "\x1b" not in escaped and "exp.toml:8: [experiments.a] a\\x1b[31m:" in escaped


def test_an_experiment_name_with_control_characters_is_escaped(tmp_path):
    text = problems(tmp_path, '[experiments."x\\u202ey\\u0007"]\ntask = "spirals"\n')
    assert "\u202e" not in text and "\x07" not in text
    assert 'exp.toml:1: [experiments."x\\u202ey\\x07"]' in text, text


def test_a_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_bytes(b"\xef\xbb\xbf" + BASE.lstrip().encode())
    code, out = gridrun("plan", str(path))
    assert code == 0 and "total: 1 run" in out, out
    path.write_bytes(b"\xef\xbb\xbf" + BASE.lstrip().replace("epochs = 1", "epochs = 0").encode())
    code, out = gridrun("plan", str(path))
    assert code == 2 and "exp.toml:5: [experiments.a] epochs:" in out, out  # lines still right


def test_ls_refuses_an_unknown_status_and_lists_them(tmp_path):
    root = tmp_path / "runs"
    root.mkdir(mode=0o700)
    code, out = gridrun("ls", "--status", "bogus", "--root", str(root))
    assert code == 2 and out.strip() == ("unknown status 'bogus': choose one of "
                                         + ", ".join(states.ALL)), out


def test_a_completed_cell_queued_again_after_the_store_was_emptied_keeps_its_summary(
        tmp_path, backend):
    root = tmp_path / "runs"
    run = make_run(seed=3, epochs=1)
    with Store(root) as store:
        store.enqueue([run])
        engine = engine_for(root, backend, slots=1)
        engine.start()
        drain(engine)
        first = store.list_runs()[0]
        assert first.status == states.COMPLETED
        summary = layout.run_dir(root, run.experiment, run.id) / layout.SUMMARY
        before = summary.read_bytes()
        assert store.remove([run.id]) == {run.id: "removed"}  # the folder stays
        store.enqueue([run])
        drain(engine)
        again = store.list_runs()[0]
    assert again.status == states.COMPLETED
    assert summary.read_bytes() == before
    assert again.summary["wall_time_s"] == json.loads(before)["wall_time_s"]


def test_nothing_reads_an_experiment_file_without_a_bound(tmp_path):
    """The bounded reader is the one way in: a FIFO whose writer never comes."""
    from gridrun.spec.load import FileRefused, read_text

    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    got: list = []

    def read() -> None:
        try:
            read_text(fifo)
        except FileRefused as e:
            got.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)  # the refusal is a stat (microseconds): only a blocked open comes near 10 s
    assert got and "not a regular file" in str(got[0]), "reading a FIFO blocked"
