"""`gridrun mirror mlflow`: the root's runs mirrored into MLflow, once or live (--follow)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from gridrun.commands.common import DEFAULT_ROOT, RootOption, fail, open_root, open_store, say

NO_URI = ("no MLflow tracking URI: give --tracking-uri URI or set MLFLOW_TRACKING_URI "
          "(http://127.0.0.1:5000 for a local `mlflow server`)")


class _Signalled(BaseException):
    """SIGTERM or SIGHUP while following: stopped as ctrl-c stops it (a BaseException, as
    KeyboardInterrupt: MLflow's client turns an Exception met in a request into its own)."""


def _raise(signum: int, frame: Any) -> None:
    raise _Signalled(signal.Signals(signum).name)


def mlflow(
    tracking_uri: Annotated[str | None, typer.Option(
        "--tracking-uri", envvar="MLFLOW_TRACKING_URI", show_envvar=False, metavar="URI",
        help="The MLflow tracking server (http://host:5000) or store. Default: "
        "$MLFLOW_TRACKING_URI.")] = None,
    follow: Annotated[bool, typer.Option(
        "--follow", help="Keep mirroring while runs train, until ctrl-c; started before "
        "anything was queued, it waits for the root's store. Without it: send what is new "
        "once and exit.")] = False,
    every: Annotated[float, typer.Option(
        "--every", min=0.5, metavar="SECONDS",
        help="With --follow: how often to read the queue's changes and the running runs' "
        "new lines.")] = 2.0,
    root: RootOption = DEFAULT_ROOT,
) -> None:
    """Mirror the runs into MLflow: each run an MLflow run in the experiment of its name.

    Params: the resolved config, but the keys an attempt may change (devices, threads,
    ...: tags gridrun.config.*). Metrics: every train and validation value at its step,
    named as `gridrun tensorboard` names them. Tags: the run id and its root's, variant,
    ablation, seed, status, each source's seed, the weights' hash and the environment
    that decides the bits (its latest attempt's). Files: config.toml, summary.json and
    the export folder (model.json). A search's trials are children of one run per search,
    which holds the leaderboard. Needs the mlflow extra: pip install 'gridrun[mlflow]'.

    Incremental: the run in its root is the key (its id and the root's id, kept in the
    store), so a second mirror adds nothing and two roots holding the same run id are two
    MLflow runs; where each run stopped is kept in ROOT/.mirror-mlflow.json (the one file
    it writes in the root), and what MLflow holds wins over it. With --follow, a server
    that is down is said in one line and tried again with a backoff; runs never wait for it.

    A request has 30 s in all (MLFLOW_HTTP_REQUEST_TIMEOUT), an answer at most 64 MB;
    credentials in the URI are never printed or kept. Exits 1 when nothing could be sent.
    """
    from gridrun.analysis.mlflow import client as mc
    from gridrun.analysis.mlflow import mirror as mm
    from gridrun.analysis.mlflow import uri as mu
    from gridrun.userfiles import RefusedFile

    uri = (tracking_uri or "").strip().rstrip("/")
    if not uri:
        fail(NO_URI)
    scrub = mu.Scrubber(uri)  # every line the mirror says passes through it: no credential
    try:
        mu.check_local(uri, root)
    except RefusedFile as e:
        fail(scrub(str(e)))
    try:
        client = mc.client_for(uri, note=lambda line: say(f"note: {line}"))
    except mc.MLflowMissing as e:
        fail(str(e))
    except Exception as e:  # a URI MLflow does not take
        fail(scrub(f"cannot use the tracking URI {scrub.shown}: {mc.reason(e)}"))
    if follow:
        _follow(root, client, uri, scrub, every)
        return
    with open_store(root, write=False) as store:
        mirror = _mirror(root, store, client, uri, scrub)
        mirror.read(store)
        try:
            mirror.step()
        except Exception as e:
            fail(scrub(f"could not send to {scrub.shown}: {mc.reason(e)}; "
                       f"{mm.waits(mirror.waiting())}; what was sent stays (run it again to "
                       "send the rest)"), 1)
        runs, refused = mirror.mirrored(), mirror.refused_runs()
        typer.echo(f"mirrored {runs} run{'s' * (runs != 1)} to {scrub.shown}: {mirror.created} "
                   f"new, {mirror.points:,} metric points, {mirror.files} files sent"
                   + (f"; {refused} refused (said above)" if refused else ""))
        if refused and not runs:  # nothing could be sent: a script must not read success
            raise typer.Exit(1)


def _mirror(root: Path, store: Any, client: Any, uri: str, scrub: Any) -> Any:
    """The mirror of `root`'s runs, from where its cursor says it stopped; what it says
    passes through `scrub` (analysis/mlflow/uri.py)."""
    from gridrun.analysis.mlflow import mirror as mm
    from gridrun.analysis.mlflow.cursor import Cursor
    from gridrun.runs.layout import UnsafePath

    if store.root_id() is None:  # a store from before root ids, read as it is on disk
        fail(f"{root}'s store has no root id yet and cannot be written now ({store.view}); "
             "the mirror keys runs by their root: run it again once the store can be written")
    try:
        cursor, note = Cursor.load(root, uri)
    except UnsafePath as e:
        fail(str(e))
    if note:
        say(f"note: {note}")
    return mm.Mirror(root, client, cursor, tell=lambda line: typer.echo(scrub(line)),
                     warn=lambda line: say(scrub(line)))


def _await_store(root: Path, every: float) -> None:
    """Until ROOT/gridrun.db exists (the first `gridrun queue` makes it, and the root):
    said once on stderr. A root that is there is checked first, as every command does."""
    from gridrun.runs import layout

    if os.path.lexists(root / layout.DB_NAME):
        return
    if os.path.lexists(root):
        open_root(root)  # refused now if it can never be a root
    elif why := layout.system_folder(root):
        fail(why)
    say(f"{root} has no store yet (nothing was queued there): waiting for the first "
        "`gridrun queue` to make it")
    while not os.path.lexists(root / layout.DB_NAME):
        time.sleep(every)


def _follow(root: Path, client: Any, uri: str, scrub: Any, every: float) -> None:
    from gridrun.analysis.mlflow import mirror as mm
    from gridrun.analysis.mlflow.cursor import CURSOR

    previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        typer.echo(f"mirroring the runs to {scrub.shown} (ctrl-c stops; where it stopped: "
                   f"{root / CURSOR})")
        _await_store(root, every)
        with open_store(root, write=False) as store:
            mm.follow(_mirror(root, store, client, uri, scrub), store, scrub.shown, every)
    except (KeyboardInterrupt, _Signalled) as e:
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
            typer.echo(f"mirror stopped{f' ({e})' if isinstance(e, _Signalled) else ''}")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Mirror the runs into an experiment tracker (MLflow), once or live.",
                        no_args_is_help=True, rich_markup_mode="markdown")
    group.command("mlflow")(mlflow)
    app.add_typer(group, name="mirror")
