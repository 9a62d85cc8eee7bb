"""The promotion rule decides on trial indices and rung results only: results that
arrive in any order give the same promotions, in the same order, and the same stops;
a decision once given is never taken back."""

from __future__ import annotations

import itertools
import random

from gridrun.engine.promotion import PROMOTE, STOP, decide, decide_rung, winner
from gridrun.spec.search import rungs


def scores(n: int, seed: int) -> dict[int, float]:
    rng = random.Random(seed)
    return {t: round(rng.random(), 2) for t in range(n)}  # rounded: ties happen


def play(n: int, eta: int, order: list[int], value: dict[int, float]) -> tuple[list, list]:
    """Results arrive one trial at a time in `order` (every trial's rungs at once, as if
    it had trained through them); the decisions seen after each arrival."""
    steps = rungs(1, 9, eta)
    results: dict[tuple[int, int], float | None] = {}
    history = []
    for t in order:
        for e in steps:
            results[(t, e)] = value[t] + e  # a trial's rank is the same at every rung
        history.append(decide(range(n), steps, results, "max", eta))
    return history, steps


def test_completion_order_never_changes_the_decisions():
    value = scores(27, 1)
    reference, _ = play(27, 3, list(range(27)), value)
    rng = random.Random(0)
    for _ in range(30):
        order = list(range(27))
        rng.shuffle(order)
        history, _ = play(27, 3, order, value)
        assert history[-1] == reference[-1]
        for before, after in itertools.pairwise(history):
            assert set(before) <= set(after)  # final: nothing given is taken back


def test_the_rung_sizes_and_the_ends():
    value = scores(27, 2)
    history, steps = play(27, 3, list(range(27)), value)
    final = history[-1]
    promoted = {e: [d.trial for d in final if d.kind == PROMOTE and d.epoch == e] for e in steps}
    assert steps == [1, 3, 9]
    assert [len(promoted[e]) for e in steps] == [9, 3, 0]  # 27 -> 9 -> 3 train to the end
    stopped = [d for d in final if d.kind == STOP]
    assert len(stopped) == 27 - 3
    assert len({d.trial for d in stopped}) == len(stopped)
    results = {(t, e): value[t] + e for t in range(27) for e in steps}
    results = {k: v for k, v in results.items() if k[1] < 9 or k[0] in promoted[3]}
    top = winner(range(27), steps, results, "max")
    assert top in promoted[3]
    assert top == max(range(27), key=lambda t: (value[t], -t))


def test_a_prefix_decides_and_waits_for_the_trials_before_it():
    results = {(0, 1): 0.5, (1, 1): 0.9, (2, 1): 0.1}
    got = decide_rung([0, 1, 2, 3, 4, 5], 6, 1, results, "max", 3)
    assert [(d.trial, d.kind, d.order) for d in got if d.kind == PROMOTE] == [(1, PROMOTE, 0)]
    # trial 2 is behind trial 0, which is not promoted, with one place left: it is out
    assert [d.trial for d in got if d.kind == STOP] == [2]
    later = {**results, (5, 1): 1.0}  # trial 5 is in, but 3 and 4 are not: nothing more
    assert decide_rung([0, 1, 2, 3, 4, 5], 6, 1, later, "max", 3) == got


def test_ties_go_to_the_lower_trial_index_and_a_failed_trial_is_stopped():
    results = {(0, 1): 0.5, (1, 1): None, (2, 1): 0.5}
    got = decide_rung([0, 1, 2], 3, 1, results, "min", 3)
    assert [(d.trial, d.kind) for d in got] == [(0, PROMOTE), (1, STOP), (2, STOP)]
    assert "no result" in got[1].reason


def test_min_mode_promotes_the_lowest():
    results = {(t, 1): v for t, v in enumerate([0.3, 0.1, 0.2])}
    got = decide_rung([0, 1, 2], 3, 1, results, "min", 3)
    assert [d.trial for d in got if d.kind == PROMOTE] == [1]
