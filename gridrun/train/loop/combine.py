"""A step's micro-batches made one step, on one device or several.

Used when a run has several devices, or one under `reduce = "invariant"` (one
device trains the plain way: `step.forward_backward` alone). Each micro-batch of a
step draws the model's randomness (dropout) from a stream of its own, seeded by
(the model source's seed, step, micro-batch index), never from a rank's sequence,
so which rank trains it does not matter. Rank r trains the step's micro-batches
r*k/n .. (r+1)*k/n - 1 (k = accumulate, n = devices).

`invariant`: each micro-batch's gradient is kept apart (one row of a buffer), the
rows of every rank are gathered in micro-batch order, and every rank sums them in
that order, left to right: the same additions whatever the number of ranks, so the
same bits for devices = 1, 2, 4 ... BatchNorm's running statistics follow the same
rule: each micro-batch's batch statistics are taken as the kernel computes them
(momentum 1 for that forward: the running value becomes exactly the batch's), put
back, gathered, and applied in micro-batch order on every rank. Cost: one gradient
row per micro-batch in memory (k rows after the gather) and an all-gather of k
gradients a step instead of an all-reduce of one.

`ddp`: DistributedDataParallel sums over ranks in its own order (fast, the same
bits between repeats at the same device count, other bits at another); here only
the losses and the stop request are gathered. Either way the step's losses reach
every rank in micro-batch order, so the train lines are the one-device run's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from gridrun.train.seeding import model_seed, stream_seed
from gridrun.train.world import World, collective_failed


class BatchNormTap:
    """Each training BatchNorm's batch statistics of one forward, the running ones untouched."""

    def __init__(self, model: torch.nn.Module):
        self.modules = [m for m in model.modules()
                        if isinstance(m, _BatchNorm) and m.track_running_stats]
        self.saved: list[tuple[_BatchNorm, Any, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    @property
    def width(self) -> int:
        return sum(2 * m.num_features for m in self.modules)

    def before(self) -> None:
        self.saved = []
        for m in self.modules:
            if m.training:
                # the forward gets buffers of its own (autograd keeps them for the backward:
                # they are swapped, never written in place)
                self.saved.append((m, m.momentum, m.running_mean, m.running_var,
                                   m.num_batches_tracked))
                m.momentum = 1.0  # running = 1 * batch + 0 * 0: the batch's, exactly
                m.running_mean = torch.zeros_like(m.running_mean)
                m.running_var = torch.zeros_like(m.running_var)
                m.num_batches_tracked = torch.zeros_like(m.num_batches_tracked)

    def after(self, dtype: torch.dtype) -> list[torch.Tensor]:
        """The batch statistics (mean, unbiased variance) of every module, zeros for one in
        eval mode; the running statistics and momentum put back."""
        taken = {id(m): (m.running_mean.to(dtype, copy=True), m.running_var.to(dtype, copy=True))
                 for m, *_ in self.saved}
        for m, momentum, mean, var, count in self.saved:
            m.momentum, m.running_mean, m.running_var, m.num_batches_tracked = (
                momentum, mean, var, count)
        out = []
        for m in self.modules:
            mean, var = taken.get(id(m), (None, None))
            if mean is None:
                mean = var = torch.zeros(m.num_features, dtype=dtype, device=m.running_mean.device)
            out += [mean.reshape(-1), var.reshape(-1)]
        return out

    def replay(self, stats: torch.Tensor, trained: list[bool]) -> None:
        """Apply each micro-batch's statistics (rows, in order) as BatchNorm would have."""
        for row in stats:
            at = 0
            for m, on in zip(self.modules, trained, strict=True):
                c = m.num_features
                mean, var = row[at:at + c], row[at + c:at + 2 * c]
                at += 2 * c
                if not on:
                    continue
                m.num_batches_tracked.add_(1)
                f = m.momentum if m.momentum is not None else 1.0 / float(m.num_batches_tracked)
                m.running_mean.copy_(m.running_mean * (1 - f) + mean.to(m.running_mean.dtype) * f)
                m.running_var.copy_(m.running_var * (1 - f) + var.to(m.running_var.dtype) * f)


class Combiner:
    """One step's micro-batches on this rank: `before` and `after_forward` around each
    forward, `after_backward` after its backward, then `finish` makes them the step."""

    def __init__(self, model: torch.nn.Module, world: World, accumulate: int, seed: int,
                 device: torch.device):
        self.model, self.world, self.device = model, world, device
        self.local = accumulate // world.size  # this rank's micro-batches per step
        self.stream_seed = model_seed(seed)
        self.params = [p for p in model.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in self.params} | {torch.float32}
        self.dtype = torch.float64 if torch.float64 in dtypes else torch.float32
        self.tap = BatchNormTap(model) if world.invariant else None
        self.rows: list[torch.Tensor] = []
        self.trained: list[bool] = []  # which tapped BatchNorms trained (the same every rank)
        self.stats: list[torch.Tensor] = []

    @classmethod
    def of(cls, setup: Any) -> Combiner | None:
        """The combiner a run's steps need (several devices, or the invariant sum on one);
        None for the plain loop. `setup`: the loop's build.Setup."""
        world = setup.world
        if world.size == 1 and not world.invariant:
            return None
        return cls(setup.model, world, setup.accumulate, setup.seeds["model"], setup.device)

    def end_step(self, state: Any, stop: bool) -> bool:
        """The step's losses appended to `state.pending` (a TrainState) on every rank, in
        micro-batch order; returns whether any rank asked to stop."""
        losses, asked = self.finish(stop)
        state.pending.extend(losses)
        return asked

    @property
    def last_local(self) -> bool:
        """Whether the micro-batch about to train is this rank's last of the step (DDP
        reduces after that one's backward only)."""
        return len(self.rows) == self.local - 1

    def before(self, step: int) -> None:
        index = self.world.rank * self.local + len(self.rows)  # in the step's micro-batches
        torch.manual_seed(stream_seed(self.stream_seed, step, index))  # CPU and every GPU
        if self.tap is not None:
            self.tap.before()

    def after_forward(self) -> None:
        if self.tap is not None:
            self.trained = [m.training for m in self.tap.modules]
            self.stats = self.tap.after(self.dtype)

    def after_backward(self, loss: torch.Tensor) -> None:
        parts: list[torch.Tensor] = []
        if self.world.invariant:
            for p in self.params:
                g = p.grad
                parts.append(g.reshape(-1).to(self.dtype) if g is not None else
                             torch.zeros(p.numel(), dtype=self.dtype, device=self.device))
            parts.append(torch.tensor([float(p.grad is not None) for p in self.params],
                                      dtype=self.dtype, device=self.device))
            parts += self.stats
            for p in self.params:
                p.grad = None  # the next micro-batch's gradient starts apart
        parts.append(loss.detach().reshape(1).to(self.dtype))
        self.rows.append(torch.cat(parts))

    def finish(self, stop: bool) -> tuple[list[torch.Tensor], bool]:
        """The step's gradient in the parameters' .grad (invariant; DDP has reduced them),
        BatchNorm's running statistics, and (every micro-batch's loss in order, whether
        any rank asked to stop)."""
        local = torch.stack(self.rows)
        self.rows = []
        flag = torch.full((local.shape[0], 1), float(stop), dtype=self.dtype, device=self.device)
        rows = self._gather(torch.cat([local, flag], dim=1))
        losses = list(rows[:, -2].unbind())
        if not self.world.invariant:
            return losses, bool(rows[:, -1].max().item())
        n, width = len(self.params), sum(p.numel() for p in self.params)
        total = rows[0, :width].clone()
        for row in rows[1:]:  # left to right, in micro-batch order: the invariant sum
            total += row[:width]
        present = rows[:, width:width + n].amax(0)
        flags = torch.cat([present, rows[:, -1].amax(0, keepdim=True)]).tolist()  # one read
        at = 0
        for p, has in zip(self.params, flags[:n], strict=True):
            size = p.numel()
            p.grad = total[at:at + size].view_as(p).to(p.dtype) if has else None
            at += size
        if self.tap is not None and self.tap.modules:
            self.tap.replay(rows[:, width + n:width + n + self.tap.width], self.trained)
        return losses, bool(flags[-1])

    def _gather(self, local: torch.Tensor) -> torch.Tensor:
        if self.world.size == 1:
            return local
        import torch.distributed as dist

        out = [torch.empty_like(local) for _ in range(self.world.size)]
        try:
            dist.all_gather(out, local.contiguous(), group=self.world.group)
        except Exception as exc:  # a peer is gone: the run stops as a died process
            collective_failed(self.world, exc)
        return torch.cat(out)


def gather_rows(world: World, local: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's `local` rows (the same width on every rank, any count), rank by rank."""
    import torch.distributed as dist

    count = torch.tensor([local.shape[0]], device=local.device)
    counts = [torch.empty_like(count) for _ in range(world.size)]
    try:
        dist.all_gather(counts, count, group=world.group)
        most = max(int(c.item()) for c in counts)
        padded = torch.zeros((most, *local.shape[1:]), dtype=local.dtype, device=local.device)
        padded[:local.shape[0]] = local
        out = [torch.empty_like(padded) for _ in range(world.size)]
        dist.all_gather(out, padded, group=world.group)
    except Exception as exc:
        collective_failed(world, exc)
    return [o[:int(c.item())] for o, c in zip(out, counts, strict=True)]


def agree(world: World, value: int, what: str, device: torch.device) -> None:
    """Every rank holds the same `value` (the step they resumed from): else a rank read
    another checkpoint than the others, and training on would mix them."""
    if world.size == 1:
        return
    rows = gather_rows(world, torch.tensor([[value]], dtype=torch.int64, device=device))
    values = [int(r[0, 0]) for r in rows]
    if len(set(values)) > 1:
        raise RuntimeError(f"the ranks disagree on {what}: {values}")


def in_rank_order(world: World, device: torch.device, first: Any) -> Any:
    """`first()` on rank 0, then on the others: rank 0 sets damaged checkpoints aside
    and removes killed writes before any other rank reads."""
    if not world.leader:
        agree(world, 0, "the start", device)
    out = first()
    if world.leader:
        agree(world, 0, "the start", device)
    return out
