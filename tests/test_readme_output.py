"""The README shows what the program prints: every block that shows output is
produced here and compared, line for line, with what the README says.

A block of output follows a marker in the README:

    <!-- output -->           the block's `$ gridrun ...` lines are run (in a work
                              folder holding experiments.toml and the trained
                              runs/), each followed by what it prints;
    <!-- output: NAME -->     the block comes from PRODUCERS[NAME] (the end of
                              `gridrun run`, the interface in tmux, ...);
    <!-- file: NAME -->       the next block is a file the commands use;
    <!-- machine-dependent: REASON -->
                              the block is not compared: what it shows varies
                              by machine or torch build (measured rates, torch's
                              own messages, ...); REASON says what, and so does
                              the README's text (readers do not see the marker).

Every plain block (a fence with no language tag) has one of these markers on the
line right before it (test_every_plain_block_is_checked_or_marked_machine_dependent).
Only what varies between two runs on the same machine is masked (MASKS: times,
the machine panel, floating-point noise of other runtimes); a column renamed
in the program without the README fails here.

The example's 18 runs are trained once for the module, in this process, one
thread each (the numbers are the engine's, bit for bit).
"""

from __future__ import annotations

import contextlib
import re
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import patience
import pytest
from typer.testing import CliRunner

from gridrun.cli import app

# The module's fixture (about 30 s on a quiet 2 cores) races no clock: the training is
# bounded by its work alone (pytest-timeout's global guard ends a hang), the tmux waits
# count quiet seconds (tests/patience.py) and the keys wait for the runs on screen
# (issue 44: a busy machine failed it on a fixed 1,200 s and on a screen held still).

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EXAMPLE = ROOT / "experiments.toml"
BLOCK = re.compile(r"<!-- (output|file)(?:: ([\w./-]+))? -->\n```[^\n]*\n(.*?)```", re.S)
FIRST = 12  # the interface is shown after the first 12 runs (width-lr) of the 18
PARITY_ROW = re.compile(r"^(\s+output\s+float32)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)(\s+ok)$", re.M)
UNSEEN = re.compile(r"(not part of the metrics\): max abs diff) (\S+)")
# export-model's metrics to 6-7 digits: the last one moves with the CPU's instruction set
# (torch's kernels dispatch on it: AVX2 and AVX-512 round the example's loss apart)
EXPORT_METRIC = re.compile(r"^(  (?:loss|accuracy)) +(\S+) +(\S+) +(\S+)$", re.M)
MASKS = [
    (re.compile(r"\b\d+(?:\.\d+)? s\b"), "N s"),  # wall times
    (re.compile(r"sha256 [0-9a-f]{16}…"), "sha256 …"),  # weights: another torch build rounds otherwise
    # parity: another CPU or torch build gives other rounding; parity_within_tolerance checks them
    (PARITY_ROW, r"\1 DIFF DIFF \4 \5\6"),
    (UNSEEN, r"\1 DIFF"),
    (EXPORT_METRIC, r"\1 CLOSE CLOSE CLOSE"),  # close_figures compares them
    (re.compile(r"^ cpu .*$", re.M), " cpu …"),  # the machine panel of the interface
]


def masked(text: str) -> str:
    text = "\n".join(line.rstrip() for line in text.strip("\n").splitlines())
    for pattern, replacement in MASKS:
        text = pattern.sub(replacement, text)
    return text


def close_figures(got: str, readme: str, rel: float = 1e-5) -> None:
    """export-model's metrics: the program's agree with the README's to `rel`, and its
    recorded, PyTorch and ONNX columns agree with one another as closely."""
    rows = {m[1]: [float(v) for v in m.groups()[1:]] for m in EXPORT_METRIC.finditer(readme)}
    for m in EXPORT_METRIC.finditer(got):
        values = [float(v) for v in m.groups()[1:]]
        for value, shown in zip(values, rows.get(m[1], values), strict=True):
            assert abs(value - shown) <= rel * abs(shown), (m[0], rows.get(m[1]))
        assert max(values) - min(values) <= rel * abs(values[0]), m[0]


def parity_within_tolerance(text: str) -> None:
    """The parity figures the masks hide still hold: each output's differences are finite
    and under its atol, and so is the unseen shape's."""
    atols = []
    for row in PARITY_ROW.finditer(text):
        diff, rel, atol = float(row[2]), float(row[3]), float(row[4])
        assert 0 <= diff < atol and rel >= 0, row[0]
        atols.append(atol)
    for unseen in UNSEEN.finditer(text):
        assert atols and 0 <= float(unseen[2]) < min(atols), unseen[0]


def blocks() -> list[tuple[str, str | None, str]]:
    """(kind, name, text) of every marked block, in README order."""
    return [(kind, name or None, text) for kind, name, text in BLOCK.findall(README.read_text())]


@dataclass
class Example:
    work: Path  # holds experiments.toml and runs/
    interface: str | None  # tmux captures (None without tmux)
    compare_screen: str | None
    seconds: float  # training the 18 runs


def gridrun(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "80"}, terminal_width=80)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.output


def tmux_capture(work: Path, size: tuple[int, int], keys: list[str],
                 wait: tuple[str, ...], ready: tuple[str, ...] = ()) -> str | None:
    """`gridrun` in a real terminal of `size` in `work`: once the screen shows each of
    `ready` and holds still, press `keys`; wait until it shows each of `wait` and stays,
    read it back (tmux capture-pane), quit."""
    if shutil.which("tmux") is None:
        return None
    sock = work / "tmux.sock"
    tmux = ["tmux", "-f", "/dev/null", "-S", str(sock)]
    command = f"exec env -u COLUMNS -u LINES -u NO_COLOR -u GRIDRUN_ROOT {sys.executable} -m gridrun"
    # tmux's own commands answer at once: 30 quiet s only catch a wedged tmux server
    patience.run([*tmux, "new-session", "-d", "-s", "r", "-x", str(size[0]), "-y", str(size[1]),
                  "-c", str(work), command], check=True, timeout=30)

    def settled(texts: tuple[str, ...], still: int) -> str:
        """The screen once it shows each of `texts` and holds still for `still` captures."""
        screen, same = "", 0
        while not deadline.passed():
            time.sleep(0.3)
            last, screen = screen, patience.run([*tmux, "capture-pane", "-p", "-t", "r"],
                                                capture_output=True, text=True, timeout=30).stdout
            same = same + 1 if screen == last else 0
            if all(t in screen for t in texts) and same >= still:  # there, and drawn to the end
                return screen
        raise AssertionError(f"{texts!r} never appeared in the interface in {deadline}:\n{screen}")

    try:
        deadline = patience.Deadline(120)  # the interface starts and draws in ~3 quiet s
        if keys:  # keys sent before the runs are on screen can be lost or act on no row
            settled(("? help", *ready), still=3)
            patience.run([*tmux, "send-keys", "-t", "r", *keys], timeout=30)
        return settled(wait, still=1)
    finally:
        patience.run([*tmux, "send-keys", "-t", "r", "q"], capture_output=True, timeout=30)
        time.sleep(0.5)
        patience.run([*tmux, "kill-server"], capture_output=True, timeout=30)
        sock.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Example:
    import torch

    from gridrun.spec import load_runs

    work = tmp_path_factory.mktemp("readme")
    shutil.copy(EXAMPLE, work / "experiments.toml")
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        mp.delenv("GRIDRUN_ROOT", raising=False)
        torch.set_num_threads(1)  # 2 slots' worth of threads on 2 cores, not 4 (same numbers)
        try:
            assert "queued 18 runs" in gridrun("queue", "experiments.toml")
            seconds = 0.0
            runs = load_runs(Path("experiments.toml"))
            for i, run in enumerate(runs):
                if i == FIRST:
                    interface = tmux_capture(work, (80, 24), [], ("·6 ✓12",))
                started = time.monotonic()
                out = gridrun("train", "experiments.toml", run.id)
                seconds += time.monotonic() - started
                assert out.rstrip().endswith(f"completed: runs/{run.experiment}/{run.id}"), out
            screen = tmux_capture(work, (120, 9), ["End", "t"], ("Welch's", "± 0.0048"),
                                  ready=("✓18 of 18",))
        finally:
            torch.set_num_threads(threads)
        print(f"\nthe example's 18 runs trained in {seconds:.1f} s (gridrun train, one thread)")
        yield Example(work, interface, screen, seconds)


def run_end(example: Example, capsys) -> str:
    """What `gridrun run experiments.toml` prints once its runs have ended."""
    from gridrun.commands.engine import _results
    from gridrun.commands.follow import follow
    from gridrun.spec import load_runs

    runs = load_runs(Path("experiments.toml"))
    capsys.readouterr()
    assert follow(Path("runs"), [r.id for r in runs], live=False)
    _results(Path("runs"), Path("experiments.toml"), runs)
    return capsys.readouterr().out


@contextlib.contextmanager
def folder(example: Example, name: str, files: dict[str, str]):
    """A fresh folder `name` in the work folder holding `files`, the current one meanwhile
    (the module's runs/ stay as the other blocks show them)."""
    path = example.work / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    for file, text in files.items():
        (path / file).write_text(text)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(path)
        yield path


def checked(example: Example, name: str, exp: str) -> str:
    """`gridrun plan --check exp.toml` on `exp`: its lines about the file (the README shows
    those, not the plan's table)."""
    with folder(example, name, {"exp.toml": exp}):
        out = gridrun("plan", "--check", "exp.toml")
    return "\n".join(line for line in out.splitlines() if line.startswith("exp.toml:"))


def preprocess_check(example: Example, capsys) -> str:
    """The task check on a data path that skips the task's preprocess (tests/bad_tasks.py)."""
    return checked(example, "preprocess", '[defaults]\nepochs = 1\nbatch_size = 16\n\n'
                   '[experiments.my-exp]\ntask = "bad_tasks:preprocess_forgotten"\n')


def switch_note(example: Example, capsys) -> str:
    return checked(example, "switch", '[experiments.sp]\ntask = "spirals"\naugmentation = false\n')


def unknown_source(example: Example, capsys) -> str:
    return checked(example, "vary", '[experiments.x]\ntask = "shapes"\nepochs = 1\nseeds = 5\n'
                   'vary = "orderr"\n')


SHOWN = 4  # the search's leaderboard: the README shows its best 4 rows, then "..."


def search_leaderboard(example: Example, capsys) -> str:
    """The end of `gridrun run examples/search.toml`: its 27 trials queued, run by an engine
    in this process (2 slots, the local backend's fork server: 5-8 s on 2 cores), and
    `gridrun compare spirals-search`, cut to the best SHOWN rows as the README shows it."""
    from test_engine_kit import drain, engine_for

    from gridrun.engine.backends.local import LocalBackend

    search = (ROOT / "examples" / "search.toml").read_text()
    with folder(example, "search", {"search.toml": search}) as work:
        assert "queued 27 runs" in gridrun("queue", "search.toml")
        local = LocalBackend()
        try:
            engine = engine_for(work / "runs", local, slots=2)
            engine.start()
            drain(engine, timeout=120)  # quiet seconds (tests/patience.py): 10 s of work
        finally:
            local.close()
        out = gridrun("compare", "spirals-search").splitlines()
    header = next(i for i, line in enumerate(out) if line.startswith("RANK"))
    rows = next(i for i, line in enumerate(out[header + 1:]) if not line[:1].isdigit())
    assert rows > SHOWN, out
    return "\n".join([*out[:header + 1 + SHOWN], "...", *out[header + 1 + rows:]])


EXPORT = "runs/shapes-cnn/1e358ca3c3/export/best"  # the README's shapes run's export folder


def predict_refusal(example: Example, capsys) -> str:
    """`gridrun predict` given 0-1 floats for a shapes export's uint8 input. The refusal reads
    model.json alone, so the folder holds a 1-epoch shapes run's export (pt2: no extra
    needed) where the README's run exported: a second or two, not that run's 15 epochs."""
    import numpy as np

    from gridrun.spec import load_runs
    from gridrun.tasks.shapes import shapes

    exp = ('[experiments.shapes-cnn]\ntask = "shapes"\nepochs = 1\nbatch_size = 32\n'
           "train_size = 64\nval_size = 32\nseeds = 1\nthreads = 1\n")
    with folder(example, "deploy", {"exp.toml": exp}):
        run = load_runs(Path("exp.toml"))[0].id
        assert "completed" in gridrun("train", "exp.toml", run)
        assert "parity ok" in gridrun("export-model", run, "--format", "pt2",
                                      "-o", f"{EXPORT}/model.pt2")
        raw, _ = shapes(train_size=64, val_size=32).raw_val_data[1]
        np.save("val1-floats.npy", raw.numpy().astype(np.float32) / 255)
        command = f"predict {EXPORT} val1-floats.npy"
        return f"$ gridrun {command}\n" + gridrun(*command.split())


def task_check(example: Example, capsys) -> str:
    """The task check on the README's own task with a mistake: `hit` for `hit_rate`."""
    from test_readme import example_code

    pkg = example.work / "mypkg"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    code = example_code()
    assert '"hit_rate": (' in code
    (pkg / "tasks.py").write_text(code.replace('"hit_rate": (', '"hit": (', 1))
    sys.modules.pop("mypkg", None)
    sys.modules.pop("mypkg.tasks", None)
    sys.path.insert(0, str(example.work))
    try:
        return "$ gridrun queue exp.toml\n" + gridrun("queue", "exp.toml")
    finally:
        sys.path.remove(str(example.work))
        sys.modules.pop("mypkg", None)
        sys.modules.pop("mypkg.tasks", None)


def interface(example: Example, capsys) -> str:
    if example.interface is None:
        pytest.skip("needs tmux")
    return example.interface


def compare_screen(example: Example, capsys) -> str:
    if example.compare_screen is None:
        pytest.skip("needs tmux")
    return example.compare_screen


PRODUCERS = {"run-end": run_end, "task-check": task_check, "interface": interface,
             "compare-screen": compare_screen, "preprocess-check": preprocess_check,
             "switch-note": switch_note, "unknown-source": unknown_source,
             "search-leaderboard": search_leaderboard, "predict-refusal": predict_refusal}
MARKER = re.compile(r"<!-- (output|output: [\w./-]+|file: [\w./-]+|machine-dependent: [^>]*\S) -->")


def plain_blocks(text: str | None = None) -> list[tuple[int, str]]:
    """(line number, the line right before it) of every fenced block with no language."""
    found, inside, previous = [], False, ""
    for number, line in enumerate((text or README.read_text()).splitlines(), 1):
        if line.startswith("```"):
            if not inside and line.rstrip() == "```":
                found.append((number, previous))
            inside = not inside
        previous = line
    return found


def commands(text: str) -> list[tuple[str, str]]:
    """A block of `$ command` lines, each followed by what it prints."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        else:
            assert out, f"a command block must start with `$ gridrun ...`:\n{text}"
            out[-1][1].append(line)
    return [(command, "\n".join(lines)) for command, lines in out]


def write_files(work: Path) -> None:
    for kind, name, text in blocks():
        if kind == "file":
            (work / name).write_text(text)


def cases() -> list:
    """A case per output block, named by its producer or its first command."""
    return [pytest.param(i, name, id=name or text.splitlines()[0].removeprefix("$ "))
            for i, (kind, name, text) in enumerate(blocks()) if kind == "output"]


@pytest.mark.parametrize("index,name", cases())
def test_readme_block_is_what_the_program_prints(example, monkeypatch, capsys, index, name):
    monkeypatch.chdir(example.work)
    monkeypatch.delenv("GRIDRUN_ROOT", raising=False)
    write_files(example.work)
    text = blocks()[index][2]
    if name is not None:
        got = PRODUCERS[name](example, capsys)
    else:
        parts = []
        for command, _ in commands(text):
            words = shlex.split(command)
            assert words[0] == "gridrun", command
            if words[1] == "export-model" and "--format" not in words:  # ONNX: the export extra
                pytest.importorskip("onnxruntime")
            parts.append(f"$ {command}\n{gridrun(*words[1:])}")
        got = "\n".join(p.rstrip("\n") for p in parts)
    assert masked(got) == masked(text), (
        f"README block {index} ({name or 'commands'}) differs from the program; it prints:\n{got}")
    parity_within_tolerance(got)
    close_figures(got, text)


def test_every_producer_has_its_block_and_every_block_a_producer():
    named = {name for kind, name, _ in blocks() if kind == "output" and name}
    assert named == set(PRODUCERS), named ^ set(PRODUCERS)
    assert len([1 for kind, name, _ in blocks() if kind == "output" and not name]) >= 4
    # every output or file marker is read: one spelled otherwise would leave its block unchecked
    markers = [line for line in README.read_text().splitlines()
               if re.match(r"<!-- (output|file)\b", line)]
    assert len(markers) == len(blocks()), markers


def test_every_plain_block_is_checked_or_marked_machine_dependent():
    """A block of output is compared with what the program prints, or says why it cannot be."""
    unmarked = [f"README.md:{number}" for number, previous in plain_blocks()
                if not MARKER.fullmatch(previous.strip())]
    assert not unmarked, ("each needs <!-- output -->, <!-- output: NAME -->, <!-- file: NAME --> "
                          f"or <!-- machine-dependent: REASON --> on the line before: {unmarked}")
    # the fences are read as the README's renderer reads them: a closing fence is no opening
    sample = "```bash\nx\n```\n```\nout\n```\n<!-- machine-dependent: y -->\n```\nz\n```\n"
    assert plain_blocks(sample) == [(4, "```"), (8, "<!-- machine-dependent: y -->")]


def test_a_column_renamed_in_the_program_fails_the_check(example, monkeypatch, capsys):
    """The check can fail: rename the tables' `seeds` column and the run's ending differs."""
    from gridrun.analysis import tables

    monkeypatch.chdir(example.work)
    text = next(t for kind, name, t in blocks() if name == "run-end")
    assert masked(run_end(example, capsys)) == masked(text)
    original = tables.format_table

    def renamed(*args, **kwargs):
        return original(*args, **kwargs).replace("seeds", "reps ")

    monkeypatch.setattr(tables, "format_table", renamed)
    assert masked(run_end(example, capsys)) != masked(text)


def test_masks_hide_only_what_varies():
    assert masked("exported in 4.40 s (the run trained in 10.2 s)") == \
        "exported in N s (the run trained in N s)"
    assert masked("final weights sha256 ef403ca5e325be83…)") == "final weights sha256 …)"
    assert masked("  0.9571 0.9331") == "  0.9571 0.9331"  # results are never masked
    # the parity row as export-model prints it (two leading spaces: the old mask never matched)
    row = "  output       float32      {}     0.000315    1e-04   1e-03  ok"
    assert masked(row.format("1.91e-05")) == masked(row.format("1.14e-05"))
    assert masked(row.format("1.91e-05")) == "  output       float32 DIFF DIFF 1e-04 1e-03  ok"
    assert masked(row.format("1.91e-05").replace("ok", "FAILED")) != masked(row.format("1.14e-05"))
    parity_within_tolerance(row.format("1.91e-05"))
    with pytest.raises(AssertionError):
        parity_within_tolerance(row.format("2.5e-04"))
    # export-model's metrics: the last digit may move, a result may not
    readme = "  loss            0.0522043    0.0522043    0.0522043"
    assert masked(readme.replace("43", "44")) == masked(readme)
    close_figures(readme.replace("43", "44"), readme)
    with pytest.raises(AssertionError):
        close_figures(readme.replace("0.0522043", "0.0523043"), readme)
