"""Tasks for the Ray backend tests, used as "ray_tasks:NAME" (tests/ is on PYTHONPATH)."""

from __future__ import annotations

import os
import time

from gridrun import Task
from gridrun.tasks.spirals import spirals


def probe(step_sleep: float = 0.0, **kwargs) -> Task:
    """spirals that prints the CUDA_VISIBLE_DEVICES it saw (into output.log), and
    sleeps on every training batch so a test can watch or stop it mid-run."""
    print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}", flush=True)
    task = spirals(**kwargs)
    inner = task.loss

    def loss(model, batch):
        time.sleep(step_sleep)
        return inner(model, batch)

    task.loss = loss
    return task
