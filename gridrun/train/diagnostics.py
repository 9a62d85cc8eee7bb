"""What a careful engineer checks by hand, measured by the loop at no extra host sync.

Per log point: the global gradient norm before clipping (and the share of
steps where clipping bit), the share of the interval spent waiting for the
DataLoader, and memory (CUDA allocated / reserved / peak since the last log
point, or the process's RSS on the CPU). Device values are handed to the
loop's one read at the log point (`device_values`), host values are read on
the host (`line`). Once per run: parameter counts, dtype, and the trainable
parameters that got no gradient from the first backward.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from gridrun.runs import records


def model_facts(model: torch.nn.Module) -> tuple[dict[str, int], str]:
    """({"total": n, "trainable": n}, the parameters' dtype(s)) of `model`."""
    total = trainable = 0
    dtypes: dict[str, None] = {}
    for p in model.parameters():
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
        dtypes[str(p.dtype).removeprefix("torch.")] = None
    return {"total": total, "trainable": trainable}, ",".join(dtypes) or "none"


def unused_warning(names: list[str]) -> str:
    return (f"{len(names)} trainable parameter(s) got no gradient from the first backward (the "
            f"loss does not use them, so they never train): {', '.join(names[:8])}"
            + (" ..." if len(names) > 8 else ""))


def peak_reserved(device: torch.device, seen: int = 0) -> int | None:
    """CUDA's peak reserved memory over the run (None on the CPU); `seen`: the peaks of
    the intervals whose counters were reset."""
    if device.type != "cuda":
        return None
    return max(seen, int(torch.cuda.max_memory_reserved(device)))


class Diagnostics:
    def __init__(self, model: torch.nn.Module, device: torch.device, clip: float):
        self.model, self.device, self.clip = model, device, clip
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.waited = self.total_waited = 0.0
        self.norm: torch.Tensor | None = None  # of the latest step measured
        self.norms: list[torch.Tensor] = []  # with clipping: each step's norm since the log point
        self.peak = 0  # the largest peak of any interval (CUDA resets it at each log point)
        self.peak_reserved = 0  # the same for CUDA's reserved memory
        self.checked_unused = False
        self._process: Any = None
        if device.type != "cuda":
            import psutil

            self._process = psutil.Process()

    # ---- the step path: host-side timing, device-side values
    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """`loader`'s batches; the time spent getting each one (iter() too: workers
        start there) is the interval's data wait."""
        clock = time.perf_counter
        t0 = clock()
        it = iter(loader)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                self.waited += clock() - t0
                return
            self.waited += clock() - t0
            yield batch
            t0 = clock()

    def clip_grads(self) -> None:
        """Clip to `clip` and keep the norm clipping computes anyway (it was thrown away)."""
        self.norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.norms.append(self.norm)  # compared at the log point: no device op per step

    def measure_norm(self) -> None:
        """The norm on a log step without clipping: one foreach norm, every log_every steps."""
        grads = [p.grad for p in self.params if p.grad is not None]
        self.norm = torch.nn.utils.get_total_norm(grads) if grads else None

    def unused(self) -> list[str] | None:
        """Once, after the first backward: the trainable parameters without a gradient."""
        if self.checked_unused:
            return None
        self.checked_unused = True
        return [name for name, p in self.model.named_parameters() if p.requires_grad and p.grad is None]

    # ---- the log point
    def device_values(self) -> list[torch.Tensor]:
        """Values for the log point's one read: [grad norm, share clipped] (what applies)."""
        out = []
        if self.norm is not None:
            out.append(self.norm.detach().float().reshape(()))
        if self.norms:
            out.append((torch.stack(self.norms) > self.clip).float().mean())
        return out

    def line(self, read: list[float], elapsed: float) -> dict[str, float | int | None]:
        """The train line's diagnostics from `read` (device_values, as read) and the host."""
        fields: dict[str, float | int | None] = {}
        read = list(read)
        if self.norm is not None:
            fields[records.GRAD_NORM] = read.pop(0)
        if self.norms:
            fields[records.CLIPPED] = read.pop(0)
        fields[records.DATA_WAIT] = min(1.0, self.waited / elapsed) if elapsed > 0 else None
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
            fields[records.MEM_ALLOCATED] = torch.cuda.memory_allocated(self.device)
            fields[records.MEM_RESERVED] = torch.cuda.memory_reserved(self.device)
            fields[records.MEM_PEAK] = peak
            self.peak_reserved = max(self.peak_reserved,
                                     int(torch.cuda.max_memory_reserved(self.device)))
            torch.cuda.reset_peak_memory_stats(self.device)
            self.peak = max(self.peak, peak)
        else:
            fields[records.RSS] = self._process.memory_info().rss
        self.total_waited += self.waited
        self.waited, self.norm, self.norms = 0.0, None, []
        return fields
