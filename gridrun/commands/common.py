"""Options and helpers shared by the commands."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand

from gridrun.runs import states

DEFAULT_ROOT = Path("runs")
STATES = ", ".join(states.ALL)  # for help texts
INTERRUPTED = 130  # a command stopped by ctrl-c exits as shells report SIGINT


def choices(enum: type[Enum]) -> str:
    """An enum's values for a help text, whole: `table, csv or json`."""
    values = [str(e.value) for e in enum]
    return ", ".join(values[:-1]) + " or " + values[-1] if len(values) > 1 else values[0]


class Command(TyperCommand):
    """A command whose usage line names a required argument as `FILE`, as the
    help's own panels do (Typer writes `{FILE}`)."""

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p
                for p in super().collect_usage_pieces(ctx)]


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the option was typed on the command line (not a default or $GRIDRUN_ROOT).
    By the enum's name: Typer ships its own copy of Click's ParameterSource."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _parse_root(value: Any) -> Path:
    """`--root ''` is refused (it would be the current folder)."""
    if isinstance(value, Path):
        return value
    if not str(value).strip():
        fail("--root is empty: give the runs root, a folder (default ./runs)")
    return Path(value)


def _root(ctx: typer.Context, param: typer.CallbackParam, value: Path) -> Path:
    """Which root a command uses: its own `--root`, else the top-level
    `gridrun --root DIR`, else $GRIDRUN_ROOT, else ./runs."""
    top = ctx.find_root()
    if top is ctx or _given(ctx, param.name) or not _given(top, param.name):
        return value
    return top.params[param.name]


RootOption = Annotated[
    Path,
    typer.Option(
        "--root",
        envvar="GRIDRUN_ROOT",
        help="The runs root (default ./runs, or $GRIDRUN_ROOT, or `gridrun --root DIR CMD`).",
        metavar="DIR",
        parser=_parse_root,
        callback=_root,
    ),
]


def fail(message: str, code: int = 2) -> NoReturn:
    """End a command with a clean message on stderr (no traceback)."""
    say(message)
    raise typer.Exit(code)


def say(message: str) -> None:
    """A line on stderr, through `sys.stderr` as it is now: under a `working`
    spinner, above it (click's echo writes past rich's redirection)."""
    print(message, file=sys.stderr, flush=True)


def open_root(root: Path, *, create: bool = False, claim: bool = False) -> Path:
    """The one way a command opens a root, before it writes anything there: a system
    folder, the home folder, a root others can write, another user's, or one holding a
    folder that is another user's, a symlink or others can write, are refused in one
    line each (exit 2), the same from every command; a missing root is "no such root"
    unless `create` (only `queue`, `run`, `train` and `engine start` create one, and
    only under a folder that exists). `claim`: the command writes the store there
    (layout.claim_root: a fresh clone's `runs/` is made private, silently)."""
    from gridrun.runs.layout import NoSuchRoot, UnsafePath, check_root

    try:
        return check_root(root, create=create, experiments=True, claim=claim)
    except (UnsafePath, NoSuchRoot) as e:
        fail(str(e))


def refuse_early(root: Path) -> None:
    """Before a command that queues does any work: the root it will use is refused now,
    as `open_root` would refuse it later, without creating it yet."""
    from gridrun.runs import layout

    problems = layout.refusal(root)
    if problems:
        fail("\n".join(problems))


@contextmanager
def open_store(root: Path, *, create: bool = False, write: bool = True) -> Iterator[Any]:
    """The store under `root`, for a command (the root opened as `open_root` does).
    `write=False` is a reader's: a root without a store reads as empty and nothing
    is created; a store on a full disk is read as it is on disk. Any trouble ends the
    command with its one-line reason (exit 2), wherever it shows: damage, a full disk,
    a read-only file system or permissions are told apart. An empty store while run
    folders exist says so on stderr first."""
    from gridrun.runs.layout import NoSuchRoot, UnsafePath
    from gridrun.runs.store import Store, StoreError

    open_root(root, create=create, claim=write)
    try:
        store = Store(root, create=create, create_store=write)
    except (StoreError, UnsafePath, NoSuchRoot) as e:  # one line each, with what to do
        fail(str(e))
    except OSError as e:
        fail(f"cannot use the root {root}: {e.strerror or e}")
    try:
        with store:
            if not store.has_runs():
                from gridrun.checks.doctor import lost_queue_warning

                warning = lost_queue_warning(root, store)
                if warning:
                    typer.echo(f"warning: {warning}", err=True)
            yield store
    except (StoreError, UnsafePath) as e:  # damage found later, a write on a full disk
        fail(str(e))


class _Silent:
    """What `working` yields where it shows nothing."""

    def update(self, message: str) -> None:
        pass


class _Spinner:
    """A spinner and its text in a transient `rich.live.Live` on stderr."""

    def __init__(self, message: str) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.spinner import Spinner

        self.spinner = Spinner("dots", message, style="green")
        self.live = Live(self.spinner, console=Console(stderr=True), transient=True,
                         refresh_per_second=12.5)

    def update(self, message: str) -> None:
        self.spinner.update(text=message)
        self.live.refresh()  # now: the next step may hold the interpreter for seconds


@contextmanager
def working(message: str, *, quiet: bool = False) -> Iterator[Any]:
    """Say what a slow step is doing: a spinner with `message` on stderr while the
    block runs (its `update(message)` changes the text), on a terminal only:
    nothing when stderr is piped, nor with `quiet` (`--json`). Lines printed
    meanwhile appear above it; it is gone when the block ends."""
    if quiet or not sys.stderr.isatty():
        yield _Silent()
        return
    spinner = _Spinner(message)
    spinner.live.start(refresh=True)  # drawn before the block starts
    try:
        yield spinner
    finally:
        spinner.live.stop()
