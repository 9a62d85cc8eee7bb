"""The queue and the background engine: queue, run, engine, ls, logs, cancel, retry, pause, resume.

Every command reads or writes the store under the runs root; the engine
applies what they ask. Run ids accept unique prefixes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from gridrun.commands.common import DEFAULT_ROOT, INTERRUPTED, STATES, RootOption, fail, working

FileArg = Annotated[Path, typer.Argument(help="The experiment file (TOML).", exists=True,
                                         dir_okay=False, readable=True, metavar="FILE")]
RunsArg = Annotated[list[str], typer.Argument(help="Run ids (unique prefixes are enough).",
                                              metavar="RUN...")]
CheckOption = Annotated[bool, typer.Option(
    "--check/--no-check", help="Build each task once and run one training and one validation "
    "batch on the CPU before queueing (see `gridrun plan --check`).")]


def provenance(cwd: Path | None = None) -> dict:
    """The git commit of the working directory, whether it is dirty, and a hash of the diff."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.decode(errors="replace") if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"git_commit": None, "dirty": None, "diff_sha256": None, "queued_at": time.time()}
    diff = git("diff", "HEAD") or ""
    untracked = git("status", "--porcelain") or ""
    return {"git_commit": commit.strip(), "dirty": bool(untracked.strip()),
            "diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else None,
            "queued_at": time.time()}


def _store(root: Path, *, create: bool = False, write: bool = True):
    from gridrun.commands.common import open_store

    return open_store(root, create=create, write=write)


def _reader(root: Path):
    """A read-only command's store: creates nothing, a missing root is "no such root"."""
    return _store(root, write=False)


def _resolve(store, prefixes: list[str]) -> list[str]:
    from gridrun.runs.store import RunNotFound

    try:
        return [store.resolve(p) for p in prefixes]
    except RunNotFound as e:
        fail(str(e))


def _queue(file: Path, root: Path, force: bool,
           check: bool = True) -> tuple[list, list[str], list[str]]:
    from gridrun.commands.plan import gpus_an_engine_here_could_take
    from gridrun.engine.backends.registry import BackendError, check_backend
    from gridrun.spec import SpecError, load

    try:
        # one read of the file: its runs and its [engine], which every run must fit
        loaded = load(file, force=force, gpus_here=gpus_an_engine_here_could_take)
        runs, engine = loaded.runs, loaded.engine
        if engine is not None:
            check_backend(engine)
        from gridrun.commands.common import refuse_early

        refuse_early(root)  # a system folder, a symlinked or foreign experiment folder, say
        if check:
            from gridrun.commands.plan import check_or_exit

            check_or_exit(file, runs)
    except SpecError as e:
        fail(f"{e}\nnothing was queued")
    except BackendError as e:
        fail(f"{file}: {e}\nnothing was queued")
    except KeyboardInterrupt:
        fail("\ninterrupted: nothing was queued", INTERRUPTED)
    with _store(root, create=True) as store:
        queued, skipped = store.enqueue(runs, provenance(file.resolve().parent), force=force)
        if engine is not None:
            # applies at the engine's next start (a running engine keeps its slots),
            # however the file was queued; a file without [engine] changes nothing
            store.set_state("engine_config", dataclasses.asdict(engine))
    typer.echo(f"queued {len(queued)} run{'s' * (len(queued) != 1)} from {file}"
               + (f"; skipped {len(skipped)} already queued, running or completed"
                  " (--force runs them again)" if skipped else ""))
    return runs, queued, skipped


def queue(file: FileArg, force: Annotated[bool, typer.Option(
              "--force", help="Run cells again even if they already completed.")] = False,
          check: CheckOption = True, root: RootOption = DEFAULT_ROOT) -> None:
    """Validate an experiment file, check its tasks, and queue its runs (nothing is queued on
    any error)."""
    from gridrun.engine import daemon

    runs, _, _ = _queue(file, root, force, check)
    st = daemon.status(root)
    if not st.running:
        typer.echo(f"the engine is not running: start it with `gridrun engine start --root {root}`")
    else:
        _elsewhere(st, runs)


def _elsewhere(st, runs) -> None:
    """A warning when a task package came from this folder but the running engine was
    started in another one: its workers import task packages from there."""
    import os

    here = os.path.realpath(os.getcwd())
    if not st.cwd or os.path.realpath(st.cwd) == here:
        return
    for top in sorted({r.task.partition(":")[0].split(".")[0] for r in runs if ":" in r.task}):
        module = sys.modules.get(top)
        origin = os.path.realpath(getattr(module, "__file__", None) or "/")
        if origin.startswith(here + os.sep) and not os.path.exists(os.path.join(st.cwd, top)):
            typer.echo(f"warning: the engine runs in {st.cwd} and its workers import task packages "
                       f"from there, but {top!r} is in {here}: install it (pip install -e), or "
                       "`gridrun engine stop` and start it again from here", err=True)


def run(file: FileArg,
        wait: Annotated[bool, typer.Option("--wait", help="Block without a display until the "
                                           "file's runs end; exit 1 if any did not complete.")] = False,
        force: Annotated[bool, typer.Option("--force", help="Run completed cells again.")] = False,
        check: CheckOption = True, root: RootOption = DEFAULT_ROOT) -> None:
    """Queue an experiment file, make sure the engine runs, and follow the runs."""
    from gridrun.engine import daemon

    queued_at = time.time()  # what starts from here on is this command's to tell
    runs, _, _ = _queue(file, root, force, check)
    where = f"--root {shlex.quote(str(root))}"
    again = f"`gridrun run {shlex.quote(str(file))} {where}` (it queues nothing new)"
    try:
        with working("starting the engine"):
            st = daemon.start(root)
    except RuntimeError as e:
        fail(str(e), 1)
    except KeyboardInterrupt:
        started = daemon.status(root).running
        fail("\ninterrupted: the runs are queued; the engine "
             + ("goes on starting in the background" if started
                else f"did not start (`gridrun engine start {where}`)")
             + f"; {again} follows them", INTERRUPTED)
    typer.echo(f"engine running (pid {st.pid}); log: {st.log}")
    from gridrun.commands.follow import follow

    try:
        ok = follow(root, [r.id for r in runs], live=not wait and sys.stdout.isatty(),
                    since=queued_at)
    except KeyboardInterrupt:
        typer.echo(f"\ndetached: the runs go on in the background. Come back with {again}, "
                   f"`gridrun ls {where}` or `gridrun {where}`.")
        raise typer.Exit(0) from None
    _results(root, file, runs)
    raise typer.Exit(0 if ok else 1)


def _results(root: Path, file: Path, runs: list) -> None:
    experiments = sorted({r.experiment for r in runs})
    typer.echo("results: " + ", ".join(str(root / e) for e in experiments))
    try:
        from gridrun.analysis import tables
    except ImportError:
        return
    try:
        with _reader(root) as store:
            statuses = {r.id: r.status for r in store.list_runs(ids=[r.id for r in runs])}
        typer.echo(tables.comparison_text(root, experiments, statuses).rstrip())
    except Exception as e:  # the table is a courtesy; the runs are done either way
        typer.echo(f"(no comparison table: {e})", err=True)


def engine_start(root: RootOption = DEFAULT_ROOT,
                 foreground: Annotated[bool, typer.Option(
                     "--foreground", help="Run the engine in this process until it is stopped "
                     "(SIGTERM: running runs checkpoint and return to the queue), e.g. in an "
                     "sbatch script.")] = False,
                 until_idle: Annotated[bool, typer.Option(
                     "--until-idle", help="With --foreground: exit once nothing is queued or "
                     "running.")] = False) -> None:
    """Start the background engine for this root (one per root)."""
    from gridrun.commands.common import open_root
    from gridrun.engine import daemon
    from gridrun.runs import layout

    open_root(root, create=True, claim=True)  # as every command: refused before any write
    if foreground or until_idle:
        raise typer.Exit(daemon.serve(root, until_idle=until_idle))

    try:
        with working("starting the engine"):
            st = daemon.start(root)
    except (layout.UnsafePath, layout.NoSuchRoot) as e:
        fail(str(e))
    except RuntimeError as e:
        fail(str(e), 1)
    typer.echo(f"engine running (pid {st.pid}); log: {st.log}")


def engine_stop(root: RootOption = DEFAULT_ROOT,
                force: Annotated[bool, typer.Option("--force", help="SIGKILL (runs resume at "
                                                    "the next start).")] = False) -> None:
    """Stop the engine: running runs checkpoint and return to the queue."""
    from gridrun.commands.common import open_root
    from gridrun.engine import daemon

    open_root(root)
    try:
        with working("stopping the engine" + ("" if force else ": running runs checkpoint first")):
            stopped = daemon.stop(root, force=force)
    except RuntimeError as e:
        fail(str(e), 1)
    typer.echo("engine stopped" if stopped else "the engine was not running")


def engine_status(root: RootOption = DEFAULT_ROOT,
                  as_json: Annotated[bool, typer.Option(
                      "--json", help="One JSON object: running, starting, pid, responding, "
                      "heartbeat_age, paused, counts, log, foreign_gpus, gpu_memory (each GPU's memory: "
                      "committed by this engine's runs, by other engines, used by others' "
                      "processes, free; why the queue waits for memory), nvml (why NVML fails).")] = False) -> None:
    """Whether the engine runs, the queue's counts, and why queued runs wait (threads,
    slots, GPUs other users' processes take, GPU memory)."""
    from gridrun.engine import daemon, foreign, packing, sampling

    with _reader(root) as store:
        st = daemon.status(root, store=store)
        counts, paused = store.counts(), store.paused
        cap = store.get_state("cpu_cap") if st.running else None  # scheduler.CPU_CAP
        short = store.get_state("slots_wait") if st.running else None  # scheduler.SLOTS_WAIT
        others = store.get_state(foreign.STATE) if st.running else None  # scheduler.FOREIGN
        book = store.get_state(packing.STATE) if st.running else None  # the memory book
        nvml = store.get_state(sampling.NVML) if st.running else None  # NVML there but failing
    cap = cap if isinstance(cap, dict) and counts.get("queued") else None
    short = short if isinstance(short, dict) and counts.get("queued") else None
    if as_json:
        typer.echo(json.dumps({"running": st.running, "starting": st.starting, "pid": st.pid,
                               "responding": st.responding, "heartbeat_age": st.heartbeat_age,
                               "waiting_for_space": st.waiting_for_space, "free_bytes": st.free_bytes,
                               "state": st.state, "paused": paused, "counts": counts,
                               "log": str(st.log), "cpu_cap": cap, "slots_wait": short,
                               "foreign_gpus": others, "gpu_memory": book, "nvml": nvml}))
        return
    state = "not running" if not st.running else (
        f"starting its backend (pid {st.pid})" if st.starting else f"running (pid {st.pid})")
    if st.waiting_for_space:
        state = waiting_text(st)
    if not st.responding:
        state = (f"not responding for {st.heartbeat_age:.0f} s (pid {st.pid}): stopped or stuck; "
                 f"`kill -CONT {st.pid}` wakes a stopped one, "
                 f"`gridrun engine stop --force --root {shlex.quote(str(root))}` ends it")
    typer.echo(f"engine: {state}"
               + (" · paused" if paused else "") + f" · root {root}")
    typer.echo("runs: " + (", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"))
    if cap is not None:  # queued runs wait with CPU slots free: their threads hold them back
        from gridrun.engine.backends.slots import thread_cap_note

        typer.echo(thread_cap_note(cap))
    if short is not None:  # the first queued run needs more slots at once than are free
        from gridrun.engine.placement import slots_wait_note

        typer.echo(slots_wait_note(short))
    for line in foreign.gpu_lines(others):  # GPUs other users' processes take
        typer.echo(line)
    if counts.get("queued") and (line := foreign.waits_line(others)):
        typer.echo(line)
    for line in [*sampling.nvml_lines(nvml), *packing.book_lines(book)]:  # GPUs' memory, waits
        typer.echo(line)


def waiting_text(st) -> str:
    """The engine's wait for disk space, for people (engine status, ls)."""
    from gridrun.runs import space

    since = time.strftime("%H:%M:%S", time.localtime(st.waiting_for_space))
    return (f"running (pid {st.pid}), waiting for disk space since {since} "
            f"({space.human(st.free_bytes)} free on {st.root}): it launches nothing until "
            "there is space, then resumes by itself; free some space")


def ls(root: RootOption = DEFAULT_ROOT,
       as_json: Annotated[bool, typer.Option("--json", help="One JSON array of runs.")] = False,
       status: Annotated[str | None, typer.Option(
           help=f"Only runs in this state: {STATES}.", metavar="STATE")] = None,
       experiment: Annotated[str | None, typer.Option(help="Only this experiment.",
                                                     metavar="NAME")] = None) -> None:
    """List runs in queue order."""
    from gridrun.commands.follow import run_lines
    from gridrun.engine import daemon, foreign
    from gridrun.runs import states

    if status is not None and status not in states.ALL:
        fail(f"unknown status {status!r}: choose one of {', '.join(states.ALL)}")
    with _reader(root) as store:
        runs = store.list_runs(status=status, experiment=experiment)
        st = daemon.status(root, heartbeat=False)
        others = store.get_state(foreign.STATE) if st.running else None  # scheduler.FOREIGN
    if st.waiting_for_space:
        typer.echo(f"engine: {waiting_text(st)}", err=True)
    for line in foreign.gpu_lines(others):  # GPUs other users' processes take: no run starts there
        typer.echo(line, err=True)
    paused = ("paused: the disk is full; back to the queue (resumes from its checkpoint) "
              "once there is space")
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in runs], indent=1, default=str))
        return
    if not runs:
        typer.echo("no runs")
        return

    def note_of(r) -> str:
        return " · ".join(x for x in (r.where, paused if r.id in st.paused else r.note) if x)

    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    typer.echo("\n".join(run_lines(runs, note_of, width)))


def logs(run_id: Annotated[str, typer.Argument(help="A run id (a unique prefix is enough).",
                                               metavar="RUN")],
         follow_: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing until the "
                                               "run ends.")] = False,
         lines: Annotated[int, typer.Option("-n", "--lines", min=0, metavar="N", help="How many of the last "
                                            "lines to print first.")] = 200,
         root: RootOption = DEFAULT_ROOT) -> None:
    """Print the end of a run's output.log (it keeps the first 1 MB and the last ~6-9 MB
    of what the run printed); -f goes on with what the run prints next."""
    from gridrun.runs import layout, outputlog, states

    with _reader(root) as store:
        run_id = _resolve(store, [run_id])[0]
        run_ = store.get_run(run_id)
        follower = outputlog.Follower(run_.run_dir(root) / layout.OUTPUT, lines)
        said = False
        try:
            while True:
                text = follower.read()
                if not follower.opened and not said:  # not there (a link was refused already)
                    waits = follow_ and run_.status not in states.FINISHED
                    note = outputlog.missing(run_id, run_.status, run_.run_dir(root), follow=waits)
                    if not waits:
                        fail(note, 1)
                    print(note, file=sys.stderr, flush=True)
                    said = True
                if text:
                    sys.stdout.write(text)
                    sys.stdout.flush()
                if not follow_:
                    return
                if store.get_run(run_id).status in states.FINISHED:
                    sys.stdout.write(follower.read())  # what came between the read and the check
                    return
                time.sleep(0.5)
        finally:
            follower.close()


def _apply(action: str, runs: list[str], root: Path, *, fresh: bool = False) -> None:
    """Cancel or retry each run, printing each outcome; exit 2 if any was refused
    (an unknown id, a run already ended or not retryable) after applying the rest."""
    from gridrun.runs.store import RunNotFound

    refused = False
    with _store(root) as store:
        ids, outcomes = [], {}
        for prefix in runs:
            try:
                ids.append(store.resolve(prefix))
            except RunNotFound as e:
                outcomes[prefix] = str(e)
                refused = True
        if action == "cancel":
            applied = store.cancel(dict.fromkeys(ids))
        else:
            applied = store.retry(dict.fromkeys(ids), fresh=fresh)
        for prefix in runs:  # in the order given
            if prefix in outcomes:
                typer.echo(f"{prefix}: {outcomes[prefix]}", err=True)
        for run_id, outcome in applied.items():
            ok = not outcome.startswith("not ")  # "not cancelled: it is completed"
            refused |= not ok
            typer.echo(f"{run_id}: {outcome}{' (from scratch)' * (fresh and ok)}", err=not ok)
    if refused:
        raise typer.Exit(2)


def cancel(runs: RunsArg, root: RootOption = DEFAULT_ROOT) -> None:
    """Cancel runs: queued ones at once; running ones checkpoint and stop. Exits 2 if
    any run could not be cancelled (the others still are)."""
    _apply("cancel", runs, root)


def retry(runs: RunsArg, fresh: Annotated[bool, typer.Option(
              "--fresh", help="Start over: delete the runs' checkpoints instead of resuming.")] = False,
          root: RootOption = DEFAULT_ROOT) -> None:
    """Queue failed, diverged, out-of-memory or cancelled runs again (they resume from
    their checkpoint, or with --fresh start over). Exits 2 if any run could not be
    retried (the others still are)."""
    _apply("retry", runs, root, fresh=fresh)


def pause(root: RootOption = DEFAULT_ROOT) -> None:
    """Launch nothing new; running runs finish."""
    with _store(root) as store:
        store.pause()
    typer.echo("paused: running runs finish, nothing new starts (`gridrun resume` to go on)")


def resume(root: RootOption = DEFAULT_ROOT) -> None:
    """Launch queued runs again after `gridrun pause`."""
    with _store(root) as store:
        store.resume()
    typer.echo("resumed")


def register(app: typer.Typer) -> None:
    app.command()(queue)
    app.command()(run)
    app.command()(ls)
    app.command()(logs)
    app.command()(cancel)
    app.command()(retry)
    app.command()(pause)
    app.command()(resume)
    group = typer.Typer(help="Start, stop or ask about the background engine.", no_args_is_help=True,
                        rich_markup_mode="markdown")
    group.command("start")(engine_start)
    group.command("stop")(engine_stop)
    group.command("status")(engine_status)
    app.add_typer(group, name="engine")
