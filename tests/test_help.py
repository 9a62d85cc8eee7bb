"""Every command's `--help` at 80 columns reads well: each command and option is
described, nothing is cut (`…`), choices and defaults show whole, required
arguments show as FILE or RUN in the usage line, and no paragraph breaks a
line where the next word would have fitted (a hard-wrapped docstring)."""

from __future__ import annotations

import itertools
import re

import pytest
import typer
from typer.testing import CliRunner

from gridrun.cli import app

WIDTH = 80


def commands() -> list[tuple[list[str], object]]:
    """(the words that name it, the command) for the root and every command below it."""
    found = []

    def walk(path: list[str], cmd) -> None:  # Typer's own copy of Click: by duck type
        found.append((path, cmd))
        if hasattr(cmd, "commands"):
            for name, sub in sorted(cmd.commands.items()):
                walk([*path, name], sub)

    walk([], typer.main.get_command(app))
    return found


COMMANDS = commands()


def help_of(path: list[str]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)},
                                terminal_width=WIDTH)
    assert result.exit_code == 0, result.output
    return result.output


def choices(param) -> list[str]:
    return [str(c) for c in getattr(param.type, "choices", None) or ()]


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_help_at_80_columns(path, cmd):
    out = help_of(path)
    lines = out.splitlines()
    assert all(len(line) <= WIDTH for line in lines), out
    assert "…" not in out, f"something was cut:\n{out}"
    assert (cmd.help or "").strip(), f"`gridrun {' '.join(path)}` has no description"
    flat = " ".join(out.replace("│", " ").split())
    words = set(re.findall(r"\w+", flat))
    for param in cmd.params:
        if not (getattr(param, "help", None) or "").strip():
            raise AssertionError(f"`gridrun {' '.join(path)}`: {param.opts[0]} has no description")
        for choice in choices(param):  # whole, as a word (not `jso n`)
            assert re.search(rf"(?<![\w-]){re.escape(choice)}(?![\w-])", flat), (choice, out)
    for text in [cmd.help, *(getattr(p, "help", None) or "" for p in cmd.params)]:
        lost = set(re.findall(r"\w+", text)) - words  # markdown eats `<metric>`, say
        assert not lost, f"`gridrun {' '.join(path)} --help` lost {sorted(lost)}:\n{out}"
    usage = next(line for line in lines if "Usage:" in line)
    assert "{" not in usage and "<" not in usage, usage
    for param in cmd.params:
        if param.param_type_name == "argument":
            assert param.metavar and param.metavar.isupper(), (path, param.name)
            assert param.metavar in usage, usage


def broken_lines(out: str) -> list[tuple[str, str]]:
    """Pairs of lines of one paragraph where the first ended although the second's
    first word would have fitted after it: a line break from the source, not from
    the width. Outside the panels (the description) and inside them (a
    continuation line: empty to the left of its text, under text of the line above)."""
    found = []
    lines = out.splitlines()
    for a, b in itertools.pairwise(lines):
        if not a.strip() or not b.strip() or "Usage:" in a:
            continue
        if not a.startswith("│") and not b.startswith("│"):
            if len(a.strip()) + 1 + len(b.split()[0]) <= WIDTH - 2:
                found.append((a, b))
            continue
        if not (a.startswith("│") and b.startswith("│")):
            continue
        inner = b[1:].rstrip("│")
        col = 1 + len(inner) - len(inner.lstrip())  # where b's text starts
        body = a.rstrip(" │")
        cells = [m.end() for m in re.finditer(r"(?<=\S)  +(?=\S)", body)]
        last = cells[-1] if cells else len(body) - len(body[1:].lstrip())
        if not inner.strip() or col != last:
            continue  # b is not the next line of a's last cell (the description)
        if b[col] == "[":  # Typer's [default: ...], [env var: ...], [required]
            continue
        room = len(b) - 2 - col  # up to the panel's right padding
        if len(a[col:len(a) - 1].rstrip()) + 1 + len(b[col:].split()[0]) <= room:
            found.append((a, b))
    return found


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_help_paragraphs_are_not_hard_wrapped(path, cmd):
    out = help_of(path)
    assert not broken_lines(out), f"broken lines in `gridrun {' '.join(path)} --help`:\n{out}"


def test_the_broken_line_check_sees_a_hard_wrapped_docstring():
    """The check above can fail: plain Typer keeps a docstring's line breaks."""
    demo = typer.Typer(rich_markup_mode="rich")

    @demo.command()
    def cmd(x: int = typer.Option(1, help="An option.")) -> None:
        """Short.

        A first line that stops
        early, then goes on."""

    out = CliRunner().invoke(demo, ["--help"], env={"COLUMNS": str(WIDTH)}).output
    assert broken_lines(out), out


def test_every_command_is_walked():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"", "run", "verify", "export-model", "engine status", "compare", "tensorboard",
            "mirror", "mirror mlflow"} <= names
