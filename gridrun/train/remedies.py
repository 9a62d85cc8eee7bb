"""What an input-bound run should change, with its own numbers: the line the meter
writes at a run's end when it waited for data more than INPUT_BOUND_SHARE of its
training time, and how a dataset reads its samples (`storage`), which decides whether
packing can help.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from gridrun.runs.progress import INPUT_BOUND_SHARE


def storage(dataset: Any) -> str | None:
    """How a dataset reads its samples, when it says so ("files", "lmdb", "hdf5"), or
    "memory" for tensors held already (a TensorDataset, a tensor), looking through
    wrappers (a Subset's `.dataset`, `.records`; a ConcatDataset whose parts agree)."""
    for _ in range(4):
        if dataset is None:
            return None
        kind = getattr(dataset, "storage", None)
        if isinstance(kind, str):
            return kind
        if isinstance(dataset, torch.utils.data.TensorDataset | torch.Tensor):
            return MEMORY
        if isinstance(dataset, torch.utils.data.ConcatDataset):
            kinds = {storage(part) for part in dataset.datasets}
            return kinds.pop() if len(kinds) == 1 else None
        inner = getattr(dataset, "dataset", None)  # never `or`: a tensor has no truth value
        dataset = inner if inner is not None else getattr(dataset, "records", None)
    return None


MEMORY = "memory"  # storage(): the samples are tensors in memory already, nothing to pack
IN_MEMORY = ("a larger batch_size: its samples are tensors in memory already (a TensorDataset), "
             "nothing to read or pack; what is left is the loader's cost per batch, shared by "
             "more samples")
FEWER_WORKERS = ("fewer workers: each batch of tensors in memory is copied from a worker to the "
                 "training process; num_workers = 0 may be faster")


def input_bound(cfg: Mapping[str, Any], dataset: Any, summary: Mapping[str, Any], waited: float,
                train_time: float, samples: int) -> dict[str, Any] | None:
    """When the run waited for data more than INPUT_BOUND_SHARE of its training
    time: by how much, and what to change, with the run's own numbers."""
    share = waited / train_time if train_time > 0 else 0.0
    if share <= INPUT_BOUND_SHARE or not samples:
        return None
    delivered = samples / train_time
    model = samples / (train_time - waited) if train_time > waited else None
    workers = cfg["num_workers"]
    # what one loading process managed: with 0 workers, the training process's own
    # loading pace (samples over the time it spent loading); with workers, their share
    per_process = (samples / waited if workers == 0 else delivered / workers) if waited else None
    loader = (summary.get("environment") or {}).get("loader")
    kind = storage(dataset)
    remedies = []
    if isinstance(loader, dict) and len(loader["trials"]) > 1:
        tried = ", ".join(f"{t['num_workers']}: {t['samples_per_s'] or 0:,.0f}"
                          for t in loader["trials"] if t["prefetch_factor"] ==
                          loader["trials"][0]["prefetch_factor"])
        remedies.append(f"more workers will not do it here: the probe measured (workers: "
                        f"samples/s) {tried} on {loader['cores']} cores and chose {workers}")
    elif kind == MEMORY and workers:  # more workers copy more: fewer may do it
        remedies.append(FEWER_WORKERS)
    elif per_process:
        needed = math.ceil(model / per_process) if model else None
        remedies.append(
            (f"workers: loading in the training process ran at {per_process:,.0f} samples/s, "
             "between the steps" if workers == 0 else
             f"more workers: {workers} delivered {per_process:,.0f} samples/s each")
            + (f"; about {needed} would keep up with the model" if needed else "")
            + '; num_workers = "auto" measures the settings at the start of the run '
            "(`gridrun tune-loader FILE RUN` measures them now)")
    if kind == "files":
        remedies.append("packing: it reads one file per sample; `gridrun pack DIR -o DIR.lmdb` "
                        "puts the same bytes in one file (data = \"DIR.lmdb\")")
    elif kind == MEMORY:  # packing helps only what reads files
        remedies.append(IN_MEMORY)
    elif kind is None:
        remedies.append("packing, if it reads one file per sample (`gridrun pack`)")
    text = (f"input-bound: {share:.0%} of the training time waited for data ({delivered:,.0f} "
            "samples/s" + (f"; the model alone would take {model:,.0f}" if model else "")
            + "): " + "; ".join(remedies))
    return {"data_wait": share, "samples_per_s": delivered, "model_samples_per_s": model,
            "loader_samples_per_s": per_process, "num_workers": workers, "storage": kind,
            "remedies": remedies, "text": text}
