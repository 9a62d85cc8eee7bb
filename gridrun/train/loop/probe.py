"""The probe: what watches a run as it trains, from outside the loop.

`build` shows it the model before anything wraps it and `step` shows it each
micro-batch before its forward; diverge.py replays a diverged run with one that
records where the first NaN was born. It sits below every other module of the
loop, so those that call it never import the trainer that takes it.
"""

from __future__ import annotations

from typing import Any

import torch


class Probe:
    """Watches a run as it trains (diverge.py replays a diverged run with one);
    the null probe watches nothing."""

    def attach(self, model: torch.nn.Module) -> None:
        pass

    def before_step(self, step: int, batch: Any) -> None:
        """Before the forward of each micro-batch of optimizer step `step` (1-based)."""
