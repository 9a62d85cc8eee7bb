"""`gridrun run` follows its runs: a progress bar per active run and an overall count."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import typer

BAR = 20


def _progress(run, root: Path, offsets: dict, folded: dict, now: float | None = None) -> str:
    """One run's line: its progress by steps (by epochs for a log without a length),
    loss, best value and time left, from the one fold over its metrics log."""
    from gridrun.runs import layout, progress, runlog
    from gridrun.tui.widgets.fmt import duration

    trainer = run.config.get("trainer", {})
    records, offsets[run.id] = runlog.read_from(run.run_dir(root) / layout.METRICS,
                                                offsets.get(run.id, 0))
    p = folded.get(run.id) or progress.Progress.known(
        early_stop_metric=trainer.get("early_stop_metric"))
    p = folded[run.id] = progress.fold(records, previous=p)
    epochs = trainer.get("epochs") or None
    filled = int((p.fraction(epochs) or 0.0) * BAR)
    where = (f"step {p.step}/{p.total_steps} epoch {p.epoch}" if p.total_steps
             else f"epoch {p.epoch}/{epochs} step {p.step}" if epochs else f"step {p.step}")
    eta = p.eta(now)
    return (f"  {run.id}  {(run.variant or 'baseline')[:22]:<22} s{run.seed:<2} "
            f"[{'#' * filled}{'.' * (BAR - filled)}] {where}"
            + (f" loss {p.train_loss:.4f}" if isinstance(p.train_loss, int | float) else "")
            + (f" best {p.metric} {p.best:.4g}" if p.best is not None else "")
            + (f" eta {duration(eta)}" if eta is not None else ""))


def follow(root: Path, ids: list[str], *, live: bool, interval: float = 0.5) -> bool:
    """Until every run in `ids` has ended; True if all completed. Ctrl-C raises KeyboardInterrupt."""
    from gridrun.commands.common import open_store
    from gridrun.engine import daemon
    from gridrun.runs import states

    offsets: dict = {}
    folded: dict = {}
    drawn = 0
    previous = None
    next_engine_check = 0.0
    with open_store(root) as store:  # damage found while following: one line, exit 2
        while True:
            runs = store.list_runs(ids=ids)
            counts: dict[str, int] = {}
            for r in runs:
                counts[r.status] = counts.get(r.status, 0) + 1
            ended = sum(counts.get(s, 0) for s in states.FINISHED)
            overall = (f"{ended}/{len(runs)} ended · {counts.get(states.RUNNING, 0)} running · "
                       f"{counts.get(states.QUEUED, 0)} queued"
                       + "".join(f" · {counts[s]} {s}" for s in states.FINISHED
                                 if s != states.COMPLETED and counts.get(s)))
            if store.paused:
                overall += " · paused (gridrun resume)"
            if live:
                width = shutil.get_terminal_size().columns
                lines = [_progress(r, root, offsets, folded, time.time())[:width]
                         for r in runs if r.status == states.RUNNING] + [overall]
                sys.stdout.write("\x1b[1A\x1b[2K" * drawn + "\n".join(lines) + "\n")
                sys.stdout.flush()
                drawn = len(lines)
            elif overall != previous:
                typer.echo(overall)
                previous = overall
            if ended == len(runs):
                return counts.get(states.COMPLETED, 0) == len(runs)
            if time.monotonic() >= next_engine_check:
                next_engine_check = time.monotonic() + 2.0
                if not daemon.status(root).running:
                    typer.echo(f"the engine is not running; the runs wait in the queue. "
                               f"Start it with `gridrun engine start --root {root}`.", err=True)
                    return False
            time.sleep(interval)
