"""The pages show what the program prints: the kit that reads the README and every
docs/*.md page (docs/reference/ is generated and tested on its own) for its blocks, and
runs gridrun the way the pages say. tests/test_readme_output.py holds the tests, and
tests/docs_producers.py what makes the blocks no single command prints.

A block of output follows a marker on a page:

    <!-- output -->           the block's `$ gridrun ...` lines are run (in a work
                              folder holding experiments.toml and the trained
                              runs/), each followed by what it prints;
    <!-- output: NAME -->     the block comes from PRODUCERS[NAME] (the end of
                              `gridrun run`, the interface in tmux, ...);
    <!-- file: NAME -->       the next block is a file the page's commands use
                              (written into the work folder for that page's blocks);
    <!-- machine-dependent: REASON -->
                              the block is not compared: what it shows varies
                              by machine or torch build (measured rates, torch's
                              own messages, ...); REASON says what, and so does
                              the page's text (readers do not see the marker).

Every plain block (a fence with no language tag) has one of these markers on the
line right before it. Only what varies between two runs on the same machine is
masked (MASKS: times, the machine panel, floating-point noise of other runtimes);
a column renamed in the program without the page fails.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import patience
from typer.testing import CliRunner

from gridrun.cli import app

# The module's fixture (about 30 s on a quiet 2 cores) races no clock: the training is
# bounded by its work alone (pytest-timeout's global guard ends a hang), the tmux waits
# count quiet seconds (tests/patience.py) and the keys wait for the runs on screen
# (issue 44: a busy machine failed it on a fixed 1,200 s and on a screen held still).

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
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
    # where Python looked for a task: the work folder and the interpreter are this machine's
    (re.compile(r"looked in the current directory \([^)]*\) and the installed packages of [^:]*:"),
     "looked in the current directory (…) and the installed packages of …:"),
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


def pages() -> list[str]:
    """The tested pages, relative to the repository: the README, then docs/*.md in order
    (docs/reference/ is generated from the code and tested with its generator)."""
    return ["README.md", *sorted(str(p.relative_to(ROOT)) for p in DOCS.glob("*.md"))]


def page_text(page: str) -> str:
    return (ROOT / page).read_text()


def blocks(page: str = "README.md") -> list[tuple[str, str | None, str]]:
    """(kind, name, text) of every marked block of `page`, in its order."""
    return [(kind, name or None, text) for kind, name, text in BLOCK.findall(page_text(page))]


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


MARKER = re.compile(r"<!-- (output|output: [\w./-]+|file: [\w./-]+|machine-dependent: [^>]*\S) -->")


def plain_blocks(text: str | None = None) -> list[tuple[int, str]]:
    """(line number, the line right before it) of every fenced block with no language."""
    found, inside, previous = [], False, ""
    for number, line in enumerate((README.read_text() if text is None else text).splitlines(), 1):
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


def write_files(work: Path, page: str) -> None:
    """The page's files, in the work folder its commands run in."""
    for kind, name, text in blocks(page):
        if kind == "file":
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_text(text)


FENCED = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def typed(page: str, language: str) -> list[str]:
    """The text of every fenced block of `language` on `page`."""
    return [text for lang, text in FENCED.findall(page_text(page)) if lang == language]


def typed_commands(page: str) -> list[str]:
    """Every `gridrun ...` a bash block of `page` tells you to type (`x && gridrun y`
    included, and `gridrun engine status | stop` as both), without its comment."""
    found = []
    for text in typed(page, "bash"):
        for line in text.splitlines():
            line = line.split(" #", 1)[0].strip()
            for part in re.split(r" && ", line):
                first, *others = part.removeprefix("exec ").strip().split(" | ")
                if first.startswith("gridrun"):
                    found.append(first)
                    group = " ".join(shlex.split(first)[:command_depth(first)])
                    found += [f"{group} {other}" for other in others]
    return found


def command_depth(line: str) -> int:
    """How many words of `gridrun ...` lead to the group its last command is in
    (`gridrun engine status`: 2; `gridrun cancel ID`: 1)."""
    import typer.main

    from gridrun.cli import app

    command, depth = typer.main.get_command(app), 1
    for i, word in enumerate(shlex.split(line)[1:], 1):
        if not hasattr(command, "commands") or word not in command.commands:
            break
        command, depth = command.commands[word], i
    return depth


def refused_words(line: str) -> list[str]:
    """The words of `gridrun ...` that name no command or option of the program."""
    import typer.main

    from gridrun.cli import app

    command = typer.main.get_command(app)
    words = shlex.split(line.replace("[", " ").replace("]", " "))[1:]
    bad, options = [], {"--help"}
    for word in words:
        if word.startswith("-") and word != "-":
            options |= {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
            if word.split("=", 1)[0] not in options:
                bad.append(word)
        elif hasattr(command, "commands") and word in command.commands:
            command = command.commands[word]
        elif hasattr(command, "commands"):
            bad.append(word)  # no such command: what follows cannot be told
            break
    return bad
