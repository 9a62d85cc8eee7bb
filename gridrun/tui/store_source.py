"""The real source: the store (changes since the last seq), the running runs'
metrics logs (new lines only), telemetry, and the engine's pid file.

Called from the bridge thread and from action workers, never from widgets.
Nothing here imports torch: validating and queueing a file (which imports
task code) happens in `gridrun plan` / `gridrun queue` subprocesses.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gridrun.analysis.devices import devices_of, slot_gpu_names, trainer_of
from gridrun.analysis.runlist import resumed_note
from gridrun.checks import verdict
from gridrun.checks.doctor import lost_queue_warning
from gridrun.runs import layout, nofollow, runlog
from gridrun.runs.layout import NoSuchRoot
from gridrun.runs.progress import INPUT_BOUND, INPUT_BOUND_SHARE, Progress, fold
from gridrun.runs.records import Summary
from gridrun.runs.store import Run, Store
from gridrun.spec.search import bracket_of, rungs
from gridrun.tui import gpus
from gridrun.tui.memory import MEMORY, Book, book, run_memory
from gridrun.tui.source import (
    EngineState,
    Machine,
    Plan,
    RunDetail,
    RunRow,
    TaskCheck,
    Update,
    Verdict,
)
from gridrun.tui.store_tables import StoreTables

FOREIGN = "foreign_gpus"  # the engine's store state: GPUs other users' processes take (engine/foreign.py)


def _row(run: Run) -> RunRow:
    s = Summary.from_json(run.summary) or Summary()  # any JSON may have been stored
    return RunRow(
        id=run.id, experiment=run.experiment, variant=run.variant, seed=run.seed,
        status=run.status, priority=run.priority, step=s.step or 0,
        total_steps=s.total_steps, epoch=s.epoch or 0,
        epochs=run.config.get("trainer", {}).get("epochs"), train_loss=s.train_loss,
        best=s.best_value, best_name=s.early_stop_metric or "",
        best_direction=s.metrics.get(s.early_stop_metric or "", ""),
        samples_per_s=s.samples_per_s, slot=run.slot, devices=devices_of(trainer_of(run.config)),
        queued_at=run.queued_at, started_at=run.started_at, ended_at=run.ended_at, note=run.note,
        flags=(INPUT_BOUND,) if (s.data_wait or 0) > INPUT_BOUND_SHARE else (),
        rungs=trial_rungs(run.config),
        trial=t if isinstance(t := run.config.get("trial"), int) else None)


def trial_rungs(config: Any) -> tuple[int, ...]:
    """The epochs a search's trial pauses at, then its budget; () for any other run."""
    search, trial = config.get("search"), config.get("trial")
    if not isinstance(search, dict) or search.get("scheduler") != "asha" or not isinstance(trial, int):
        return ()
    try:
        return tuple(rungs(search["min_epochs"], search["max_epochs"], search["eta"],
                           bracket_of(trial, search.get("brackets", 1))))
    except (KeyError, TypeError, ValueError):  # a config written by hand: no rungs shown
        return ()


class Live:
    """A running run's metrics log, folded as it grows (see engine/progress.py)."""

    def __init__(self, run: Run, folder: Path) -> None:
        self.folder, self.offset = folder, 0
        # what a log from before the start line declared anything cannot say
        earlier = runlog.read_summary(folder / layout.SUMMARY)  # an earlier attempt's
        self.progress = Progress.known(
            earlier, early_stop_metric=run.config.get("trainer", {}).get("early_stop_metric"))

    def read(self) -> bool:
        """True when something new was read."""
        records, self.offset = runlog.read_from(self.folder / layout.METRICS, self.offset)
        if records:
            self.progress = fold(records, previous=self.progress)
        return bool(records)

    def merge(self, row: RunRow) -> RunRow:
        p = self.progress
        row = replace(row, total_steps=p.total_steps or row.total_steps, best=p.best,
                      best_name=p.metric or "", best_direction=p.direction or "", ends_at=p.ends_at)
        if not p.lines:  # nothing logged yet
            return row
        return replace(row, step=p.step, epoch=p.epoch, train_loss=p.train_loss,
                       samples_per_s=p.samples_per_s, flags=p.flags)


class StoreSource(StoreTables):
    def __init__(self, root: str | Path, *, python: str = sys.executable) -> None:
        self.root = Path(root)
        self.python = python
        # creates nothing: a root without a store, or no root yet, reads as empty until a
        # queue (`gridrun queue`, which the interface runs) makes them
        try:
            self.store = Store(self.root, create=False, create_store=False)
            self._missing = None
        except NoSuchRoot as e:
            self._missing = f"{e} yet: queueing a file creates it"
            self.store = Store.nothing(self.root, self._missing)
        self.seq = 0
        self.removed_seq = 0  # removals read (store.removed_since)
        self.rows: dict[str, RunRow] = {}
        self.live: dict[str, Live] = {}
        self._telemetry_t = 0.0
        # the GPUs by name ("gpu0", "node2:gpu0"; tui/gpus.py): never by index alone
        self._on_gpus: dict[str, tuple[str, ...]] = {}  # the running runs' GPUs (their slots)
        self._taken: gpus.Taken = {}  # the GPUs others take (FOREIGN)
        self._book = Book()  # the GPUs' memory (MEMORY)
        self._history: dict[str, deque[float]] = {}  # by GPU (UUID, else name), and "cpu"
        self._engine: EngineState | None = None
        self._first = True  # the first poll warns of an empty store beside run folders
        self._skipped: dict[str, int] = {}  # run id -> metrics lines that were not records
        StoreTables.__init__(self)

    # ---- polling ------------------------------------------------------------------

    def _reopen(self) -> None:
        """A view of a root without a store: the real one once `gridrun queue` made it."""
        if self.store.view is not None and (self.root / layout.DB_NAME).is_file():
            try:
                store = Store(self.root, create=False, create_store=False)
            except (NoSuchRoot, layout.UnsafePath):
                return
            if store.view is None:
                self.store.close()
                self.store, self._missing = store, None
            else:
                store.close()

    def poll(self) -> Update:
        self._reopen()
        first = self.seq == 0 and self.removed_seq == 0
        gone, self.removed_seq = self.store.removed_since(self.removed_seq)
        gone = () if first else tuple(i for i in gone if self.rows.pop(i, None) is not None)
        for run_id in gone:
            self.live.pop(run_id, None)
        changed, self.seq = self.store.changes_since(self.seq)  # the first read: queue order
        out: dict[str, RunRow] = {}
        for run in changed:
            row = self.rows[run.id] = _row(run)
            if run.status == "running":
                self.live.setdefault(run.id, Live(run, run.run_dir(self.root)))
            else:
                self.live.pop(run.id, None)
            out[run.id] = row
        for run_id, live in self.live.items():
            if live.read() or run_id in out:
                out[run_id] = self.rows[run_id] = live.merge(self.rows[run_id])
        notice = (self._missing or lost_queue_warning(self.root, self.store)) if self._first else None
        self._first = False
        return Update(runs=tuple(out.values()), engine=self._engine_state(),
                      machine=self._machine(), notice=notice, removed=gone)

    def _engine_state(self) -> EngineState | None:
        from gridrun.engine import daemon

        st = daemon.status(self.root, store=self.store)
        state = EngineState(running=st.running, paused=self.store.paused, counts=self.store.counts(),
                            not_responding=None if st.responding else int(st.heartbeat_age or 0),
                            waiting_for_space=st.waiting_for_space is not None)
        if state == self._engine:
            return None
        self._engine = state
        return state

    def _holders(self) -> dict[str, tuple[str, ...]]:
        """The running runs on each GPU (by name), from the slots they hold: a run on
        several ("gpu0+gpu1", "node2:gpu0+node2:gpu1") is on each of them."""
        on: dict[str, list[str]] = {}
        for run_id in self.live:  # the running runs
            for gpu in slot_gpu_names(self.rows[run_id].slot):
                on.setdefault(gpu, []).append(run_id)
        return {gpu: tuple(ids) for gpu, ids in on.items()}

    def _machine(self) -> Machine | None:
        """A new telemetry sample, or the runs on its GPUs changed: the machine again."""
        sample, holders = self.store.latest_telemetry(), self._holders()
        taken = gpus.taken(self._said(FOREIGN))  # the GPUs other users' processes take
        memory = book(self._said(MEMORY))
        if sample is None or (sample.t, holders, taken, memory) == (
                self._telemetry_t, self._on_gpus, self._taken, self._book):
            return None
        new, self._telemetry_t, self._on_gpus = sample.t != self._telemetry_t, sample.t, holders
        self._taken, self._book = taken, memory
        d = sample.data
        rows = gpus.rows(d, holders, taken, memory, self._history, new)
        system = d.get("system") or {}
        cpu = self._history.setdefault("cpu", deque(maxlen=60))
        if new:
            cpu.append(system.get("cpu_percent") or 0.0)
        return Machine(gpus=rows, cpu_percent=system.get("cpu_percent"),
                       ram_used=system.get("ram_used_bytes"),
                       ram_total=system.get("ram_total_bytes"), cpu_history=tuple(cpu),
                       memory_wait=memory.wait, ledger=memory.ledger)

    def _said(self, key: str) -> Any:
        """A store state the running engine keeps (None while it does not run)."""
        if self._engine is None or not self._engine.running:
            return None
        try:
            return self.store.get_state(key)
        except Exception:  # a busy or damaged store: the panel goes on without it
            return None

    def _folder(self, run_id: str) -> Path:
        row = self.rows.get(run_id)
        experiment = row.experiment if row else self.store.get_run(run_id).experiment
        return layout.run_dir(self.root, experiment, run_id)

    def metrics(self, run_id: str, offset: int) -> tuple[list[dict[str, Any]], int]:
        got = runlog.read(self._folder(run_id) / layout.METRICS, offset)  # never through a link
        # lines that are not records are counted for the detail screen's note
        self._skipped[run_id] = (self._skipped.get(run_id, 0) if offset else 0) + got.skipped
        return got.records, got.offset

    def output_tail(self, run_id: str, max_bytes: int = 8192) -> str:
        try:
            with nofollow.open_file(self._folder(run_id) / layout.OUTPUT) as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - max_bytes))
                return f.read().decode(errors="replace")
        except layout.UnsafePath as e:  # a link: said, never followed
            return f"[{e}]"
        except OSError:
            return ""

    def detail(self, run_id: str) -> RunDetail:
        run = self.store.get_run(run_id)
        folder = self._folder(run_id)
        summary = Summary.from_json(run.summary) or runlog.read_summary(folder / layout.SUMMARY)
        skipped = self._skipped.get(run_id, 0)
        notes = (runlog.skipped_note(skipped, folder / layout.METRICS),) if skipped else ()
        shown = None
        if (found := verdict.read(folder)) is not None:  # None: missing or garbage
            when = found.get("when")
            when = when if isinstance(when, int | float) and math.isfinite(when) else None
            shown = Verdict(found["ok"], verdict.describe(found, short=True), when)
        data = summary and summary.to_json()
        if (resumed := resumed_note(data)):  # a resume could not keep what decides its bits
            notes = (*notes, resumed)
        return RunDetail(config=run.spec.config, summary=data, error=run.error, notes=notes,
                         verdict=shown, where=run.where,
                         memory=run_memory(run.placement, run.adjustments, data))

    # ---- actions: intents written into the store ------------------------------------------

    def cancel(self, ids: Sequence[str]) -> str:
        out = self.store.cancel(ids)
        return "; ".join(f"{i}: {o}" for i, o in list(out.items())[:4]) + \
            (f" (+{len(out) - 4} more)" if len(out) > 4 else "")

    def retry(self, ids: Sequence[str], fresh: bool = False) -> str:
        out = self.store.retry(ids, fresh=fresh)
        return (f"{sum(o == 'queued' for o in out.values())} of {len(out)} queued again"
                + " from scratch" * fresh)

    def bump_priority(self, ids: Sequence[str], delta: int) -> str:
        self.store.set_priority(ids, delta, relative=True)
        return f"priority {delta:+d} for {len(ids)} run{'s' * (len(ids) != 1)}"

    def remove(self, ids: Sequence[str], delete_folders: bool = False) -> str:
        """`gridrun rm`: queued and ended runs leave the store; folders kept unless asked."""
        from gridrun.runs.rundirs import remove_runs

        out = remove_runs(self.store, self.root, list(ids), delete_folders=delete_folders)
        done = [i for i, o in out.items() if o.startswith("removed")]
        refused = [f"{i}: {o}" for i, o in out.items() if not o.startswith("removed")]
        folders = " and their folders" if delete_folders else " (folders kept)"
        text = f"removed {len(done)} run{'s' * (len(done) != 1)}{folders if done else ''}"
        return "; ".join([text, *refused[:2]]) + (f" (+{len(refused) - 2} more)" if len(refused) > 2 else "")

    def set_paused(self, paused: bool) -> str:
        (self.store.pause if paused else self.store.resume)()
        return "queue paused: running runs finish, nothing new starts" if paused else "queue resumed"

    def _gridrun(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        # plain usage errors: a rich box drawn for an 80-column pipe breaks a long path apart
        env = {**os.environ, "TYPER_USE_RICH": "0"}
        return subprocess.run([self.python, "-m", "gridrun", *args], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env)

    def start_engine(self) -> str:
        done = self._gridrun("engine", "start", "--root", str(self.root))
        return (done.stdout or done.stderr).strip() or "engine started"

    def plan(self, path: str) -> Plan:
        if problem := _not_a_file(path):
            return Plan(path, errors=problem)
        done = self._gridrun("plan", "--json", path)
        if done.returncode != 0:
            return Plan(path, errors=(done.stderr or done.stdout).strip() or "invalid file")
        return Plan(path, runs=tuple(json.loads(done.stdout)["runs"]))

    def check_tasks(self, path: str) -> TaskCheck:
        if problem := _not_a_file(path):
            return TaskCheck(path, error=problem)
        try:
            done = self._gridrun("plan", "--check", "--json", path)
        except subprocess.TimeoutExpired as e:
            return TaskCheck(path, error=f"the task check took more than {e.timeout:g} s "
                                         f"(try `gridrun plan --check {path}`)")
        try:
            check = json.loads(done.stdout)["check"]
            return TaskCheck(path, problems=tuple(check["problems"]), notes=tuple(check["notes"]),
                             seconds=check["seconds"])
        except (ValueError, KeyError, TypeError):  # no report: say what the command said
            return TaskCheck(path, error=(done.stderr or done.stdout).strip()
                             or f"the task check failed (exit {done.returncode})")

    def queue_file(self, path: str) -> str:
        done = self._gridrun("queue", path, "--root", str(self.root))
        text = (done.stdout + done.stderr).strip()
        if done.returncode != 0:
            raise RuntimeError(text or f"gridrun queue failed ({done.returncode})")
        return text

    def export_model(self, run_id: str) -> str:
        """`gridrun export-model RUN` in a subprocess (torch stays out of the interface):
        ONNX when the export extra is installed, else a torch.export archive."""
        import importlib.util

        fmt = "onnx" if importlib.util.find_spec("onnxruntime") else "pt2"
        try:
            done = self._gridrun("export-model", run_id, "--format", fmt, "--json",
                                 "--root", str(self.root), timeout=600)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"exporting {run_id} took more than 10 minutes "
                               f"(try `gridrun export-model {run_id}`)") from None
        try:
            report = json.loads(done.stdout)
        except ValueError:  # no report: the command's own one-paragraph reason
            raise RuntimeError((done.stderr or done.stdout).strip()
                               or f"gridrun export-model failed ({done.returncode})") from None
        worst = max((o["max_abs"] for o in report["outputs"].values()), default=0.0)
        where = self._folder(run_id) / "export" / "best" / report["model"]
        verdict = (f"parity ok (max abs diff {worst:.2g})" if report["ok"]
                   else f"PARITY FAILED: {report['problems'][0]}")
        text = (f"exported {run_id} to {where} in {report['export_s']:.1f} s: {verdict}; "
                "parity.json and model.json beside it")
        if not report["ok"]:
            raise RuntimeError(text)
        return text

    def clone(self, run_id: str, override: str) -> str:
        """Queue `run_id` with `override` ("lr=0.01 epochs=60") applied, checked as a
        file's keys are: ValueError with the spec's message, and nothing queued, when
        a key or value is wrong. Trainer keys are checked here; a task key needs the
        task factory's signature (its module imports torch), so that check runs in a
        `python -m gridrun.spec derive` subprocess, as the file checks do."""
        from gridrun.spec import SpecError, derive, needs_task, parse_overrides

        spec = self.store.get_run(run_id).spec
        try:
            overrides = parse_overrides(override, where=f"clone of {run_id}")
            new = self._derive_apart(spec, override) if needs_task(overrides) else derive(spec, overrides)
        except (SpecError, ValueError) as e:  # ValueError: the subprocess's answer
            raise ValueError(f"{e}\nnothing was queued") from None
        queued, _ = self.store.enqueue([new])
        return f"queued clone {new.id} ({new.variant})" if queued else \
            f"{new.id} is already queued, running or done"

    def _derive_apart(self, spec, override: str):
        from gridrun.spec import RunSpec

        request = json.dumps({"run": spec.to_dict(), "overrides": override})
        try:
            done = subprocess.run([self.python, "-m", "gridrun.spec", "derive"], input=request,
                                  capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired as e:
            raise ValueError(f"checking the task's keys took more than {e.timeout:g} s") from None
        try:
            answer = json.loads(done.stdout)
        except ValueError:
            answer = None
        answer = answer if isinstance(answer, dict) else {}
        if "run" in answer:
            return RunSpec.from_dict(answer["run"])
        raise ValueError("\n".join(answer.get("problems", ())) or (done.stderr or done.stdout).strip()
                         or f"the clone's check failed (exit {done.returncode})")


def _not_a_file(path: str) -> str:
    """Why `path` cannot be an experiment file, in one line ('' when it can be)."""
    target = Path(path).expanduser()
    if not target.exists():
        return f"{path}: no such file"
    if target.is_dir():
        return f"{path} is a folder: give an experiment file (TOML)"
    return ""
