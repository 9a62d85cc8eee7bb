"""The header line and the machine panel: plain Statics fed by messages."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from gridrun.tui.source import EngineState, Machine
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


class MachinePanel(Static):
    """A line per GPU (or CPU and RAM without one) with a minute of history."""

    def show(self, m: Machine) -> None:
        width = max(10, min(60, self.size.width - 60))
        lines = []
        for g in m.gpus:
            util = "n/a" if g.util is None else f"{g.util:3.0f}%"
            power = "" if g.power is None else f" {g.power:.0f}W"
            temp = "" if g.temp is None else f" {g.temp:.0f}°C"
            runs = f"  {', '.join(g.runs)}" if g.runs else ""
            # other users' processes: no new run starts there (unless [engine] foreign = "share");
            # the history gives way so that the line, cut at the panel's width, still says it
            others = f"  {'shared with' if g.shared else 'taken by'} {', '.join(g.others)}" \
                if g.others else ""
            spark = fmt.sparkline(g.history, max(10, width - len(others)) if others else width)
            lines.append(f"gpu{g.index} {g.name[:18]:<18} {util} {spark} "
                         f"{fmt.size(g.mem_used)}/{fmt.size(g.mem_total)}{power}{temp}{others}{runs}")
        if not m.gpus:
            cpu = "n/a" if m.cpu_percent is None else f"{m.cpu_percent:3.0f}%"
            lines.append(f"cpu {cpu} {fmt.sparkline(m.cpu_history, width)}  "
                         f"ram {fmt.size(m.ram_used)}/{fmt.size(m.ram_total)}  (no GPU)")
        self.update("\n".join(lines))
