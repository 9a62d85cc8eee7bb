"""The header line and the machine panel: plain Statics fed by messages."""

from __future__ import annotations

import shlex

from rich.text import Text
from textual.widgets import Static

from gridrun.tui.source import EngineState, GpuMemory, GpuRow, Machine, MemoryWait
from gridrun.tui.widgets import fmt

ORDER = ("running", "queued", "waiting", "completed", "stopped", "failed", "diverged", "oom", "cancelled",
         "interrupted")


class StatusHeader(Static):
    """Root, engine state (and the key that starts it), counts by status."""

    root, engine, filtered = "", None, None  # filtered: (shown, of) while a filter is on

    def show_filtered(self, shown: int | None, total: int = 0, needle: str = "") -> None:
        filtered = (shown, total, needle) if shown is not None else None
        if filtered != self.filtered:
            self.filtered = filtered
            self.show(self.root, self.engine)

    def show(self, root: str, engine: EngineState | None) -> None:
        self.root, self.engine = root, engine
        text = Text()
        text.append(" gridrun ", style="bold reverse")
        text.append(f" {root}  ")
        if engine is None:
            text.append("engine …", style="dim")
        elif engine.running and engine.not_responding is not None:
            text.append(f"engine ◌ not responding for {engine.not_responding} s", style="bold red")
        elif engine.running and engine.waiting_for_space:
            text.append("engine ● waiting for disk space (free some: it resumes by itself)",
                        style="bold red")
        elif engine.running:
            text.append("engine ● running" + (" (paused)" if engine.paused else ""),
                        style="bold yellow" if engine.paused else "bold green")
        else:
            text.append("engine ○ stopped (E starts it)", style="bold red")
            if engine.paused:
                text.append(" paused", style="yellow")
        if engine is not None:
            text.append("  ")
            counts = {s: fmt.whole(n) or 0 for s, n in engine.counts.items()}
            for status in ORDER:
                if n := counts.get(status, 0):
                    glyph, style = fmt.GLYPHS[status]
                    text.append(f"{glyph}{n} ", style=style)
            text.append(f"of {sum(counts.values())}", style="dim")
        if self.filtered is not None:
            shown, total, needle = self.filtered
            text.append(f"  {shown} of {total} shown", style="bold")
            text.append(f" (/{fmt.text(needle, 20)}; esc clears)", style="dim")
        self.update(text)


def farewell(engine: EngineState | None, root: str) -> str:
    """What quitting prints: the engine as the header last showed it (the same
    `EngineState`), what becomes of the queue, and the command that acts on it. It
    used to say "the engine keeps running" even when the header said stopped."""
    where = f"--root {shlex.quote(root)}"
    again = f"`gridrun {where}` opens this view again."
    if engine is None:  # quit before the first poll: claim nothing
        return f"gridrun: the engine's state was not read yet (`gridrun engine status {where}` says). {again}"
    counts = {s: fmt.whole(n) or 0 for s, n in engine.counts.items()}
    queued, running = counts.get("queued", 0), counts.get("running", 0)
    waiting = f"the {queued} queued run{'s' * (queued != 1)} wait{'s' * (queued == 1)}"
    if engine.running and engine.not_responding is not None:
        return (f"gridrun: the engine has not responded for {engine.not_responding} s (stopped or "
                f"stuck): `gridrun engine status {where}` says what to do. {again}")
    if engine.running and engine.waiting_for_space:
        return ("gridrun: the engine keeps running but launches nothing until there is disk "
                f"space (free some: it resumes by itself). {again}")
    resume = f"`gridrun resume {where}`"
    if engine.running and engine.paused:
        what = "; ".join(n for n in ("running runs finish" * bool(running),
                                     f"{waiting} for {resume}" * bool(queued)) if n)
        return f"gridrun: the engine keeps running, its queue paused{': ' * bool(what)}{what}. {again}"
    if engine.running:
        going = " and ".join(n for n in (f"{running} running" * bool(running),
                                          f"{queued} queued" * bool(queued)) if n)
        total = running + queued
        go_on = (f": {going} run{'s' * (total != 1)} go{'es' * (total == 1)} on" if going
                 else " (nothing is queued)")
        return f"gridrun: the engine keeps running{go_on}. {again}"
    start = f"`gridrun engine start {where}`"
    if queued:
        paused = f" and {resume} resumes the paused queue" if engine.paused else ""
        return f"gridrun: the engine is stopped: {waiting} until {start} starts it{paused}. {again}"
    return f"gridrun: the engine is stopped ({start} starts it). {again}"


class MachinePanel(Static):
    """A line per GPU (or CPU and RAM without one) with a minute of history; under it, when
    the engine packs runs by memory, who holds the GPU's memory, and why the queue waits."""

    BOOK_LINES = 6  # the panel's height when it shows memory (main.tcss: #machine.-book)

    def show(self, m: Machine) -> None:
        width = max(10, min(60, self.size.width - 60))
        blocks: list[list[Text]] = []  # a GPU's lines
        for g in m.gpus:
            blocks.append([Text(gpu_line(g, width, self.content_size.width))])
            if g.memory is not None:
                blocks[-1].append(Text(memory_line(g.memory)))
        if not m.gpus:
            cpu = "n/a" if m.cpu_percent is None else f"{m.cpu_percent:3.0f}%"
            blocks.append([Text(f"cpu {cpu} {fmt.sparkline(m.cpu_history, width)}  "
                                f"ram {fmt.size(m.ram_used)}/{fmt.size(m.ram_total)}  (no GPU)")])
        notes = [Text(n, style="yellow") for n in (wait_line(m.memory_wait), m.ledger) if n]
        book = bool(notes) or any(g.memory is not None for g in m.gpus)
        self.set_class(book, "-book")
        if book:  # the GPUs that fit above the notes, each with its memory line
            kept, room = [], self.BOOK_LINES - len(notes)
            for block in blocks:
                if len(block) > room:
                    break
                kept.append(block)
                room -= len(block)
            blocks = kept
        self.update(Text("\n").join([line for block in blocks for line in block] + notes))


def gpu_line(g: GpuRow, width: int, room: int = 0) -> str:
    """A GPU's line: its name ("gpu0", or "node2:gpu0" on a Ray node), model, use, a
    `width`-long minute of history, memory, power, temperature, who else takes it and its
    runs. Where other users' processes take it (no new run starts there, unless [engine]
    foreign = "share"), the history and then the model give way so that the line, cut at
    the panel's `room` columns (0: not known yet), still says who."""
    util = "n/a" if g.util is None else f"{g.util:3.0f}%"
    power = "" if g.power is None else f" {g.power:.0f}W"
    temp = "" if g.temp is None else f" {g.temp:.0f}°C"
    runs = f"  {', '.join(g.runs)}" if g.runs else ""
    others = f"  {'shared with' if g.shared else 'taken by'} {', '.join(g.others)}" \
        if g.others else ""
    spark = fmt.sparkline(g.history, max(10, width - len(others)) if others else width)
    model, tail = f"{g.name[:18]:<18}", f"{fmt.size(g.mem_used)}/{fmt.size(g.mem_total)}{power}{temp}"
    line = f"{g.label} {model} {util} {spark} {tail}"
    if not others or not room or len(line) + len(others) <= room:
        return f"{line}{others}{runs}"
    over = len(line) + len(others) - room
    cut = min(over, len(spark))
    spark, over = spark[cut:], over - cut  # the latest values stay
    model = model[:max(0, len(model) - over)].rstrip()
    line = " ".join(p for p in (g.label, model, util, spark, tail) if p)
    return f"{line}{others}{runs}"


def gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.1f}"


def memory_line(m: GpuMemory) -> str:
    """'mem gridrun 24.0 GiB (3) · engines 8.0 · others 20.0 · free 28.0 GiB', under its GPU's
    name: what this engine's runs commit (how many), other gridrun engines, other people's
    processes, and what is free."""
    return (f"     mem gridrun {gib(m.ours)} GiB ({m.runs}) · engines {gib(m.engines)} · "
            f"others {gib(m.others)} · free {gib(m.free)}" + " GiB" * (m.free is not None))


def wait_line(w: MemoryWait | None) -> str:
    """Why the first queued run waits for GPU memory, in a line that fits 80 columns."""
    if w is None:
        return ""
    if w.busy:
        return f"waits: {w.busy}"
    if w.need is None:
        return f"waits: {w.run_id} wants a GPU alone (its shape was never measured)"
    held = f" (engines hold {gib(w.engines)})" if w.engines else ""
    return f"waits: {w.run_id} needs {gib(w.need)} GiB free, most free {gib(w.free)}{held}"
