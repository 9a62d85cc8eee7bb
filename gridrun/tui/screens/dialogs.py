"""Small modal screens: confirm, a one-line prompt, and queueing a file."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.markup import escape
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.widgets import Footer, Input, Label, Static

from gridrun.tui.source import Plan, TaskCheck


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


class RemoveConfirm(ModalScreen[str | None]):
    """x: remove runs from the store; `y` keeps their folders, `D` deletes them too."""

    CSS_PATH = "dialogs.tcss"
    BINDINGS: ClassVar = [Binding("y", "answer('keep')", "remove, keep folders"),
                          Binding("D", "answer('delete')", "remove and delete folders"),
                          Binding("n,escape", "answer(None)", "no")]

    def __init__(self, ids: list[str], running: int = 0) -> None:
        super().__init__()
        self.ids, self.running = ids, running

    def compose(self) -> ComposeResult:
        n = len(self.ids)
        which = ", ".join(self.ids[:3]) + ("…" if n > 3 else "")
        skipped = (f" ({self.running} running run{'s' * (self.running != 1)} left alone: "
                   "cancel first)") if self.running else ""
        with Vertical(classes="dialog"):
            yield Label(f"Remove {n} run{'s' * (n != 1)} ({which}) from the queue and the store?"
                        f"{skipped}")
            yield Label("y: remove, keep folders   D: remove and delete folders   n / esc: no",
                        classes="hint")

    def action_answer(self, answer: str | None) -> None:
        self.dismiss(answer)


class Prompt(ModalScreen[str | None]):
    """A one-line answer. With `submit`, enter calls it (in a worker) with the answer:
    its return value is the dialog's result; what it raises (a ValueError saying what
    is wrong) is shown in the dialog, which stays open for a corrected answer."""

    CSS_PATH = "dialogs.tcss"
    BINDINGS: ClassVar = [Binding("escape", "dismiss(None)", "cancel")]

    def __init__(self, question: str, default: str,
                 submit: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self.question, self.default, self.submit = question, default, submit

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question)
            yield Input(self.default, id="answer")
            problem = Static("", id="problem")
            problem.display = False  # until an answer is checked
            yield problem
            yield Label("enter: ok   esc: cancel", classes="hint")

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        answer = event.value.strip() or None
        if self.submit is None or answer is None:
            self.dismiss(answer)
            return
        self.show_problem("[dim]checking …[/]")
        self.check(answer)

    @work(thread=True, group="prompt", exclusive=True, exit_on_error=False)
    def check(self, answer: str) -> None:
        try:
            result = self.submit(answer)
        except ValueError as e:
            self.app.call_from_thread(self.refuse, str(e))
            return
        except Exception as e:  # any failure: shown here, never a dialog stuck at "checking"
            self.app.call_from_thread(self.refuse, f"{type(e).__name__}: {e}")
            return
        self.app.call_from_thread(self.dismiss, result)

    def refuse(self, problem: str) -> None:
        self.show_problem(f"[red]{escape(problem)}[/]")

    def show_problem(self, text: str) -> None:
        box = self.query_one("#problem", Static)
        box.update(text)
        box.display = True


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


class PathInput(Input):
    """The path field: tab takes the suggestion (and focus stays in the field)."""

    BINDINGS: ClassVar = [Binding("tab", "complete", "complete", show=False)]

    def action_complete(self) -> None:
        self.cursor_position = len(self.value)
        self.action_cursor_right()  # at the end of the text, this accepts the suggestion


def plain_lines(text: str) -> str:
    """A command's complaint as plain lines: no usage banner, no boxes, no `--help` hint."""
    out = []
    for line in text.splitlines():
        line = line.strip().strip("╭╮╰╯│─ ").strip()
        if line and line != "Error" and not line.startswith(("Usage:", "Try '")):
            out.append(line)
    return "\n".join(out)


class QueueScreen(ModalScreen[None]):
    """`a`: a file path; enter checks it (subprocesses run `gridrun plan --json`, then
    `gridrun plan --check --json` for its tasks) and shows the plan or the problems;
    enter again queues it, only once both passed."""

    CSS_PATH = "dialogs.tcss"
    BINDINGS: ClassVar = [Binding("escape", "dismiss(None)", "cancel")]

    def __init__(self, default: str = "./experiments.toml") -> None:
        super().__init__()
        self.default, self.plan = default, None
        self.tasks: TaskCheck | None = None  # the task check of `plan`, once it ended
        self.plan_text = ""

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("Queue an experiment file (tab completes; enter checks, enter again queues)")
            yield PathInput(self.default, id="path", suggester=PathSuggester(use_cache=False),
                            select_on_focus=False)
            with VerticalScroll(id="plan-box"):
                yield Static("", id="plan")
            yield Footer()

    @on(Input.Changed, "#path")
    def path_changed(self) -> None:
        self.plan = self.tasks = None

    @on(Input.Submitted, "#path")
    def submitted(self, event: Input.Submitted) -> None:
        path = event.value.strip()
        if self.plan is not None and self.plan.ok and self.plan.path == path:
            if self.tasks is None:
                self.app.bell()  # still checking its tasks
            elif self.tasks.ok:
                self.queue(path)
            else:
                self.start_check(path)
        else:
            self.start_check(path)

    def start_check(self, path: str) -> None:
        self.plan = self.tasks = None
        self.query_one("#plan", Static).update(f"checking {escape(path)} …")
        self.check(path)

    @work(thread=True, group="queue", exclusive=True, exit_on_error=False)
    def check(self, path: str) -> None:
        plan = self.app.source.plan(path)
        self.app.call_from_thread(self.show_plan, plan)
        if plan.ok:
            tasks = self.app.source.check_tasks(path)
            self.app.call_from_thread(self.show_tasks, tasks)

    def show_tasks(self, tasks: TaskCheck) -> None:
        if self.plan is None or self.plan.path != tasks.path:
            return  # the path changed meanwhile
        self.tasks = tasks
        box = self.query_one("#plan", Static)
        notes = "".join(f"\n[dim]{escape(n)}[/]" for n in tasks.notes)
        if tasks.ok:
            took = f" in {tasks.seconds:.1f} s" if tasks.seconds is not None else ""
            box.update(f"tasks checked{took}.  [b]enter[/] queues the runs.{notes}\n{self.plan_text}")
            return
        n = len(tasks.problems)
        what = (f"the task check found {n} problem{'s' * (n != 1)}" if n
                else "the task check could not run")
        lines = "\n".join(escape(p) for p in tasks.problems) or escape(tasks.error)
        box.update(f"[b red]{what}; nothing was queued[/]  (enter checks again)\n{lines}{notes}"
                   f"\n\n{self.plan_text}")

    def show_plan(self, plan: Plan) -> None:
        self.plan = plan
        box = self.query_one("#plan", Static)
        if not plan.ok:
            box.update(f"[b red]{escape(plan.path)} has problems; nothing was queued[/]\n"
                       f"{escape(plain_lines(plan.errors))}")
            return
        known = getattr(self.app, "known_status", lambda i: None)
        done = sum(known(r["id"]) == "completed" for r in plan.runs)
        active = sum(known(r["id"]) in ("queued", "running") for r in plan.runs)
        by_exp: dict[str, int] = {}
        for r in plan.runs:
            by_exp[r["experiment"]] = by_exp.get(r["experiment"], 0) + 1
        lines = [f"[b]{len(plan.runs)} runs[/] in {len(by_exp)} experiments; "
                 f"{done} already done, {active} queued or running, "
                 f"{len(plan.runs) - done - active} new."]
        lines += [f"  {escape(name)}: {n}" for name, n in by_exp.items()]
        lines += [escape(f"  {r['id']}  {r['experiment']}  {r['variant'] or '-'}  seed {r['seed']}")
                  for r in plan.runs[:200]]
        self.plan_text = "\n".join(lines)
        box.update(f"[dim]checking tasks…[/]\n{self.plan_text}")

    @work(thread=True, group="queue", exclusive=True, exit_on_error=False)
    def queue(self, path: str) -> None:
        message = self.app.source.queue_file(path)
        self.app.call_from_thread(self.queued, message)

    def queued(self, message: str) -> None:
        """The toast names the interface's own key for a stopped engine, not the CLI."""
        lines = [line for line in message.splitlines() if "gridrun engine start" not in line]
        engine = getattr(getattr(self.app, "main", None), "engine", None)
        if engine is not None and not engine.running:
            lines.append("the engine is stopped: press E to start it")
        self.app.notify("\n".join(lines) or message)
        self.dismiss(None)
