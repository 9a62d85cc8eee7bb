"""The switches on a run's randomness, as a task sees them.

An experiment file can switch three kinds of randomness off for a run
(README, "Sources of randomness"): `shuffle = false` (the data in index
order), `dropout_layers = false` (dropout modules run as the identity) and
`augmentation = false`. gridrun applies the first two itself; augmentation is
the task's own code, so the task asks, in one line:

    import gridrun.randomness
    ...
    if gridrun.randomness.enabled("augment"):
        image = random_shift(image)

`enabled` answers for the run being trained, in the trainer's process and in
its DataLoader workers, at any time: in the factory or in `__getitem__`.
Outside a run every switch is on. Imports nothing: a task pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Iterable

SWITCHES = ("augment", "dropout", "shuffle")

_off: frozenset[str] = frozenset()


def enabled(name: str) -> bool:
    """Whether the run lets `name` ("augment", "dropout" or "shuffle") draw."""
    if name not in SWITCHES:
        raise ValueError(f"unknown switch {name!r}: the switches are {', '.join(SWITCHES)}")
    return name not in _off


def switched_off() -> frozenset[str]:
    """The switches that are off in this process."""
    return _off


def configure(off: Iterable[str] = ()) -> frozenset[str]:
    """Turn the switches named in `off` off and every other one on, for this
    process; returns the switches that were off before, to put them back.

    The trainer calls it before the task's factory (and in each DataLoader
    worker); a script that runs a task outside gridrun (`gridrun repro`'s) calls
    it to run the task as the run did. Tasks only read: `enabled`."""
    global _off
    wanted = frozenset(off)
    unknown = sorted(wanted - set(SWITCHES))
    if unknown:
        raise ValueError(f"unknown switch {unknown[0]!r}: the switches are {', '.join(SWITCHES)}")
    previous, _off = _off, wanted
    return previous
