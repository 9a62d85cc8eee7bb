"""The train lines: when to write one, and the loop's one host sync that feeds it.

Between log points the losses stay on the device (`TrainState.pending`) and
the meter only counts samples and tokens on the host; at a log point
`state.read_pending` (which the Checkpointer shares) reads every device value
the line needs at once. The meter owns the interval's clock and counters and
the run's throughput totals.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gridrun.runs import records
from gridrun.runs.runlog import MetricsWriter
from gridrun.train.loop.build import Setup
from gridrun.train.loop.memory import MemoryBudget
from gridrun.train.loop.state import TrainState, read_pending
from gridrun.train.remedies import input_bound


class Meter:
    """Counts what the loop trains on, decides which steps are log points and
    writes their train lines; the time spent evaluating is left out of the
    intervals (`restart_interval`)."""

    def __init__(self, setup: Setup, state: TrainState, writer: MetricsWriter,
                 summary: dict[str, Any], log: Callable[[str], None],
                 budget: MemoryBudget | None = None):
        self.setup, self.writer, self.summary, self.log = setup, writer, summary, log
        self.budget = budget or MemoryBudget()
        self.counts_tokens = setup.task.count_tokens
        self.samples = self.tokens = 0  # in the interval
        self.total_samples = self.total_tokens = 0
        self.train_time = 0.0
        self.logged_step = state.step
        self.interval_start = time.perf_counter()

    def count(self, batch: Any) -> None:
        # several devices: the others train as many (whole) batches at once
        ranks = self.setup.world.size
        self.samples += self.setup.count_samples(batch) * ranks
        if self.counts_tokens:
            self.tokens += self.counts_tokens(batch) * ranks

    def due(self, state: TrainState) -> bool:
        """Whether the step about to be taken is a log point: every `log_every`
        steps, the last step and each epoch's last."""
        setup, step = self.setup, state.step + 1
        return step % setup.cfg["log_every"] == 0 or step == setup.total or (
            state.position + setup.accumulate >= setup.batches_per_epoch)

    def restart_interval(self) -> None:
        self.interval_start = time.perf_counter()

    def log_point(self, state: TrainState, lr: float) -> int | None:
        """Read the interval's values and write its train line; the diverged
        step instead (nothing written) when a loss is not finite."""
        diag = self.setup.diagnostics
        losses, diverged_step, read = read_pending(self.setup, state, extra=diag.device_values())
        elapsed = time.perf_counter() - self.interval_start
        self.train_time += elapsed
        self.total_samples += self.samples
        self.total_tokens += self.tokens
        if diverged_step is not None:
            return diverged_step
        samples, tokens, steps = self.samples, self.tokens, state.step - self.logged_step
        mean_loss, speed = sum(losses) / len(losses), samples / elapsed if elapsed else None
        self.writer.write(records.train_line(
            time.time(), state.step, state.epoch, mean_loss, lr, speed, elapsed / steps,
            counts_tokens=bool(self.counts_tokens),
            tokens_per_s=tokens / elapsed if elapsed else None,
            diagnostics=diag.line(read, elapsed)))
        self.summary["train_loss"] = mean_loss
        self.log(f"train step {state.step:>6}/{self.setup.total}  epoch {state.epoch}  "
                 f"loss {mean_loss:.4f}  lr {lr:.3g}  {speed or 0:,.0f} samples/s")
        state.pending.clear()
        self.samples = self.tokens = 0
        self.logged_step = state.step
        self.interval_start = time.perf_counter()
        self.budget.check()  # host values only: over its budget, the run ends here (OverBudget)
        return None

    def summarize(self) -> None:
        """The run's throughput and data wait, over the intervals it trained."""
        if self.train_time:
            summary = self.summary
            summary["data_wait"] = min(1.0, self.setup.diagnostics.total_waited / self.train_time)
            summary["samples_per_s"] = self.total_samples / self.train_time
            summary["tokens_per_s"] = (self.total_tokens / self.train_time
                                       if self.counts_tokens else None)
            found = input_bound(self.setup.cfg, self.setup.task.train_data, summary,
                                self.setup.diagnostics.total_waited, self.train_time,
                                self.total_samples)
            if found:
                summary["input_bound"] = found
                self.log(found["text"])
