"""The README and every docs/*.md page show what the program prints: every block that
shows output is produced here and compared, line for line, with what the page says
(tests/docs_kit.py: the markers and how a block is read; tests/docs_producers.py: the
blocks no single command prints). Every `gridrun` command a page tells you to type names
a command and options that exist, and every TOML block parses.

The example's 18 runs are trained once for the module, in this process, one thread
each (the numbers are the engine's, bit for bit); every page's blocks run on them.
"""

from __future__ import annotations

import re
import shlex
import shutil
import time
import tomllib
from pathlib import Path

import pytest
from docs_kit import (
    EXAMPLE,
    FIRST,
    MARKER,
    ROOT,
    Example,
    blocks,
    close_figures,
    command_depth,
    commands,
    gridrun,
    masked,
    page_text,
    pages,
    parity_within_tolerance,
    plain_blocks,
    refused_words,
    tmux_capture,
    typed,
    typed_commands,
    write_files,
)
from docs_producers import PRODUCERS, run_end

# The module's fixture (about 30 s on a quiet 2 cores) races no clock: the training is
# bounded by its work alone (pytest-timeout's global guard ends a hang), the tmux waits
# count quiet seconds (tests/patience.py) and the keys wait for the runs on screen
# (issue 44: a busy machine failed it on a fixed 1,200 s and on a screen held still).


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




def cases() -> list:
    """A case per output block of every page, named by its page and its producer or its
    first command."""
    return [pytest.param(page, i, name,
                         id=f"{page}:{name or text.splitlines()[0].removeprefix('$ ')}")
            for page in pages()
            for i, (kind, name, text) in enumerate(blocks(page)) if kind == "output"]


@pytest.mark.parametrize("page,index,name", cases())
def test_page_block_is_what_the_program_prints(example, monkeypatch, capsys, page, index, name):
    monkeypatch.chdir(example.work)
    monkeypatch.delenv("GRIDRUN_ROOT", raising=False)
    write_files(example.work, page)
    text = blocks(page)[index][2]
    if name is not None:
        got = PRODUCERS[name](example, capsys)
    else:
        parts = []
        for command, _ in commands(text):
            words = shlex.split(command)
            if words[:2] == ["head", "-n"]:  # what a command wrote: its first lines
                lines = Path(words[3]).read_text().splitlines()[:int(words[2])]
                parts.append(f"$ {command}\n" + "\n".join(lines))
                continue
            assert words[0] == "gridrun", command
            if words[1] == "export-model" and "--format" not in words:  # ONNX: the export extra
                pytest.importorskip("onnxruntime")
            parts.append(f"$ {command}\n{gridrun(*words[1:])}")
        got = "\n".join(p.rstrip("\n") for p in parts)
    assert masked(got) == masked(text), (
        f"{page} block {index} ({name or 'commands'}) differs from the program; it prints:\n{got}")
    parity_within_tolerance(got)
    close_figures(got, text)


def test_every_producer_has_its_block_and_every_block_a_producer():
    named = {name for page in pages() for kind, name, _ in blocks(page) if kind == "output" and name}
    assert named == set(PRODUCERS), named ^ set(PRODUCERS)
    for page in pages():
        # every output or file marker is read: one spelled otherwise would leave its block unchecked
        markers = [line for line in page_text(page).splitlines()
                   if re.match(r"<!-- (output|file)\b", line)]
        assert len(markers) == len(blocks(page)), (page, markers)


@pytest.mark.parametrize("page", pages())
def test_every_plain_block_is_checked_or_marked_machine_dependent(page):
    """A block of output is compared with what the program prints, or says why it cannot be."""
    unmarked = [f"{page}:{number}" for number, previous in plain_blocks(page_text(page))
                if not MARKER.fullmatch(previous.strip())]
    assert not unmarked, ("each needs <!-- output -->, <!-- output: NAME -->, <!-- file: NAME --> "
                          f"or <!-- machine-dependent: REASON --> on the line before: {unmarked}")


def test_fences_are_read_as_the_renderer_reads_them():
    # a closing fence is no opening
    sample = "```bash\nx\n```\n```\nout\n```\n<!-- machine-dependent: y -->\n```\nz\n```\n"
    assert plain_blocks(sample) == [(4, "```"), (8, "<!-- machine-dependent: y -->")]


@pytest.mark.parametrize("page", pages())
def test_a_file_shown_as_the_repository_s_is_that_file(page):
    """`<!-- file: experiments.toml -->`: the block is the file in the clone, whole, so the
    outputs beside it come from what the page shows."""
    for kind, name, text in blocks(page):
        if kind == "file" and (ROOT / name).is_file():
            assert text == (ROOT / name).read_text(), f"{page} shows {name} otherwise than it is"


@pytest.mark.parametrize("page", pages())
def test_every_command_a_page_gives_exists(page):
    """`gridrun CMD --option` in a page's bash blocks: the command and its options exist
    (a renamed option fails here, not in a reader's terminal)."""
    wrong = {line: bad for line in typed_commands(page) if (bad := refused_words(line))}
    assert not wrong, f"{page}: commands or options the program does not have: {wrong}"


@pytest.mark.parametrize("page", pages())
def test_every_toml_block_parses(page):
    for text in typed(page, "toml"):
        tomllib.loads(text)


def test_the_check_can_fail_on_a_command_and_an_option():
    assert refused_words("gridrun compare tricks --format latex") == []
    assert refused_words("gridrun engine status") == []
    assert refused_words("gridrun compair tricks") == ["compair"]
    assert refused_words("gridrun compare --formats latex") == ["--formats"]
    assert command_depth("gridrun engine status") == 2 and command_depth("gridrun cancel 3f") == 1


MINIMUM = {"output": 27, "file": 14, "machine-dependent": 9, "command": 40, "toml": 20}


def test_the_pages_exercise_their_blocks(capsys):
    """How many blocks the tests run over, by kind: a page's blocks moved out of every
    marker would otherwise pass unseen."""
    counts = dict.fromkeys(MINIMUM, 0)
    for page in pages():
        for kind, _, _ in blocks(page):
            counts[kind] += 1
        counts["machine-dependent"] += sum(1 for _, previous in plain_blocks(page_text(page))
                                           if previous.startswith("<!-- machine-dependent:"))
        counts["command"] += len(typed_commands(page))
        counts["toml"] += len(typed(page, "toml"))
    with capsys.disabled():
        print(f"\nblocks exercised over {len(pages())} pages: "
              + ", ".join(f"{n} {kind}" for kind, n in counts.items()))
    assert all(counts[kind] >= least for kind, least in MINIMUM.items()), counts


def test_a_column_renamed_in_the_program_fails_the_check(example, monkeypatch, capsys):
    """The check can fail: rename the tables' `seeds` column and the run's ending differs."""
    from gridrun.analysis import tables

    monkeypatch.chdir(example.work)
    text = next(t for page in pages() for kind, name, t in blocks(page) if name == "run-end")
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
