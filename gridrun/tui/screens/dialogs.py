"""Small modal screens: confirm, a one-line prompt, and queueing a file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.widgets import Footer, Input, Label, Static

from gridrun.tui.source import Plan


class Confirm(ModalScreen[bool]):
    CSS_PATH = "dialogs.tcss"
    BINDINGS: ClassVar = [Binding("y", "answer(True)", "yes"), Binding("n,escape", "answer(False)", "no")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question)
            yield Label("y: yes   n / esc: no", classes="hint")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class Prompt(ModalScreen[str | None]):
    CSS_PATH = "dialogs.tcss"
    BINDINGS: ClassVar = [Binding("escape", "dismiss(None)", "cancel")]

    def __init__(self, question: str, default: str) -> None:
        super().__init__()
        self.question, self.default = question, default

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question)
            yield Input(self.default, id="answer")
            yield Label("enter: ok   esc: cancel", classes="hint")

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)


class PathSuggester(Suggester):
    """Completes a path from the files on disk (TOML files and folders first)."""

    async def get_suggestion(self, value: str) -> str | None:
        folder, _, stem = value.rpartition("/")
        try:
            names = sorted(os.listdir(folder or "."))
        except OSError:
            return None
        for name in sorted(names, key=lambda n: not n.endswith(".toml")):
            if name.startswith(stem) and name != stem:
                full = f"{folder}/{name}" if folder else name
                return full + ("/" if Path(full).is_dir() else "")
        return None


class QueueScreen(ModalScreen[None]):
    """`a`: a file path; enter checks it (a subprocess runs `gridrun plan --json`)
    and shows the plan or the errors; enter again queues it."""

    CSS_PATH = "dialogs.tcss"
    BINDINGS: ClassVar = [Binding("escape", "dismiss(None)", "cancel")]

    def __init__(self, default: str = "./experiments.toml") -> None:
        super().__init__()
        self.default, self.plan = default, None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("Queue an experiment file (tab completes; enter checks, enter again queues)")
            yield Input(self.default, id="path", suggester=PathSuggester(use_cache=False))
            with VerticalScroll(id="plan-box"):
                yield Static("", id="plan")
            yield Footer()

    @on(Input.Changed, "#path")
    def path_changed(self) -> None:
        self.plan = None

    @on(Input.Submitted, "#path")
    def submitted(self, event: Input.Submitted) -> None:
        path = event.value.strip()
        if self.plan is not None and self.plan.ok and self.plan.path == path:
            self.queue(path)
        else:
            self.query_one("#plan", Static).update(f"checking {path} …")
            self.check(path)

    @work(thread=True, group="queue", exclusive=True, exit_on_error=False)
    def check(self, path: str) -> None:
        plan = self.app.source.plan(path)
        self.app.call_from_thread(self.show_plan, plan)

    def show_plan(self, plan: Plan) -> None:
        self.plan = plan
        box = self.query_one("#plan", Static)
        if not plan.ok:
            box.update(f"[b red]{plan.path} has problems; nothing was queued[/]\n{plan.errors}")
            return
        known = getattr(self.app, "known_status", lambda i: None)
        done = sum(known(r["id"]) == "completed" for r in plan.runs)
        active = sum(known(r["id"]) in ("queued", "running") for r in plan.runs)
        by_exp: dict[str, int] = {}
        for r in plan.runs:
            by_exp[r["experiment"]] = by_exp.get(r["experiment"], 0) + 1
        lines = [f"[b]{len(plan.runs)} runs[/] in {len(by_exp)} experiments; "
                 f"{done} already done, {active} queued or running, "
                 f"{len(plan.runs) - done - active} new.  [b]enter[/] queues them."]
        lines += [f"  {name}: {n}" for name, n in by_exp.items()]
        lines += [f"  {r['id']}  {r['experiment']}  {r['variant'] or '-'}  seed {r['seed']}"
                  for r in plan.runs[:200]]
        box.update("\n".join(lines))

    @work(thread=True, group="queue", exclusive=True, exit_on_error=False)
    def queue(self, path: str) -> None:
        message = self.app.source.queue_file(path)
        self.app.call_from_thread(self.app.notify, message)
        self.app.call_from_thread(self.dismiss, None)
