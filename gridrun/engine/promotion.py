"""Successive halving whose decisions depend on trial indices and rung results only.

Pure functions, no I/O: engine/search.py feeds them what the store holds.

The rule, for each rung k of a bracket but its last (max_epochs):

- A rung's members are in a fixed order: trial-index order at the first rung, the
  order of promotion at the next ones. Its full size is known in advance: n at the
  first rung, floor(n_k / eta) at rung k + 1.
- The rung is read as a prefix: the first m members that all have a result (a
  result that comes early, after a member before it still training, waits). With
  the prefix at m, floor(m / eta) members may have been promoted: each new place
  goes to the best member of the prefix not yet promoted (ties: the lower trial
  index). Promotions are final and numbered in the order they are given.
- A member is stopped once it can no longer be promoted: as many unpromoted members
  of the prefix are better than it as places are left in the full rung (each later
  place goes to one of them or to a newcomer better still), or its result is
  missing (it failed), or the rung is complete.

So completion order never matters: the same results give the same promotions, in
the same order, and the same stops, on one slot or a hundred. The price is that a
result that arrives before the prefix reaches it decides nothing yet: its trial
waits (idle slots, when nothing else is queued) until the members before it are in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PROMOTE, STOP = "promote", "stop"


@dataclass(frozen=True)
class Decision:
    trial: int
    epoch: int  # the rung's epoch: where the trial waits
    kind: str  # PROMOTE | STOP
    order: int  # promotions: their place in the rung's order (0 first); stops: -1
    reason: str = ""


Results = Mapping[tuple[int, int], float | None]  # (trial, epoch) -> result (None: failed)


def _key(value: float, trial: int, mode: str) -> tuple[float, int]:
    return (value if mode == "min" else -value, trial)


def decide_rung(members: Sequence[int], size: int, epoch: int, results: Results, mode: str,
                eta: int) -> list[Decision]:
    """The decisions at one rung of `size` places whose members so far are `members`
    (in rung order; a later member may still join while size > len(members))."""
    prefix: list[int] = []
    for trial in members:
        if (trial, epoch) not in results:
            break
        prefix.append(trial)
    quota = size // eta
    promoted: list[int] = []
    for m in range(1, len(prefix) + 1):
        while len(promoted) < m // eta:
            candidates = [t for t in prefix[:m] if t not in promoted
                          and _finite(results[(t, epoch)])]
            if not candidates:
                break
            promoted.append(min(candidates, key=lambda t: _key(results[(t, epoch)], t, mode)))
    out = [Decision(t, epoch, PROMOTE, i, f"#{i + 1} of {quota} at epoch {epoch}")
           for i, t in enumerate(promoted)]
    left = quota - len(promoted)
    complete = len(prefix) == size
    for trial in prefix:
        if trial in promoted:
            continue
        value = results[(trial, epoch)]
        if not _finite(value):
            out.append(Decision(trial, epoch, STOP, -1, f"no result at epoch {epoch}"))
            continue
        better = sum(1 for t in prefix if t not in promoted and t != trial
                     and _finite(results[(t, epoch)])
                     and _key(results[(t, epoch)], t, mode) < _key(value, trial, mode))
        if complete or better >= left:
            out.append(Decision(trial, epoch, STOP, -1,
                                f"not in the top {quota} of {size} at epoch {epoch}"))
    return out


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def decide(trials: Sequence[int], rungs: Sequence[int], results: Results, mode: str,
           eta: int) -> list[Decision]:
    """Every decision of one bracket: `trials` in index order, `rungs` its epochs (the
    last is max_epochs, where trials end), `results` what the trials scored."""
    out: list[Decision] = []
    members, size = sorted(trials), len(trials)
    for epoch in rungs[:-1]:
        found = decide_rung(members, size, epoch, results, mode, eta)
        out += found
        members = [d.trial for d in found if d.kind == PROMOTE]
        size //= eta
        if not members:
            break
    return out


def winner(trials: Sequence[int], rungs: Sequence[int], results: Results,
           mode: str) -> int | None:
    """The best trial at the highest rung any trial finished (ties: the lower index)."""
    for epoch in reversed(rungs):
        done = [t for t in trials if _finite(results.get((t, epoch)))]
        if done:
            return min(done, key=lambda t: _key(results[(t, epoch)], t, mode))  # type: ignore[arg-type]
    return None
