"""The sources of a run's randomness, their seeds and their switches (no torch).

A run draws random numbers from four sources:

    init     what the task's factory draws: the model's initial weights
    order    the order of the training data (a permutation per epoch)
    augment  what the data code draws while a batch is fetched (the per-batch streams)
    model    what the model draws in training: dropout masks and other draws
             in the forward and backward (the main stream)

By default every source follows the run's `seed`, as before the sources had
names: one stream after the factory carries on into training, and ids and
bits are what they were. A source can be pinned (`seed_init = 3`), or an
experiment can vary some sources over its `seeds` while the others stay at
the first seed of the list, its base (`vary = "order"`); then each source
draws from its own stream, so changing one changes nothing the others draw.

Three switches turn randomness off: `shuffle = false`, `augmentation = false`
(the task asks `gridrun.randomness.enabled("augment")`) and
`dropout_layers = false`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gridrun.spec.errors import nearest

SOURCES = ("init", "order", "augment", "model")
ALL = "all"  # vary's default: every source follows the seed
FOLLOW = "seed"  # a pin's default: the source follows the run's seed
PINS = {source: f"seed_{source}" for source in SOURCES}  # trainer key per source
VARY = "vary"
# trainer key -> the switch gridrun.randomness names
SWITCHES = {"shuffle": "shuffle", "augmentation": "augment", "dropout_layers": "dropout"}
KEYS = (VARY, *PINS.values(), *SWITCHES)  # the trainer keys of this module, in the run id
# only when they differ from their defaults


def check_vary(value: Any) -> tuple[Any, str | None]:
    """(vary's canonical value, None) or (None, what was expected): "all", one source,
    or a list of sources in SOURCES' order (one source alone is its name; all four, "all")."""
    names = value if isinstance(value, list) else [value]
    if not names or not all(isinstance(n, str) for n in names):
        return None, (f"expected a source name or an array of them ({', '.join(SOURCES)}, "
                      f"or {ALL!r}), got {value!r}")
    for name in names:
        if name not in (*SOURCES, ALL):
            guess = nearest(name, (*SOURCES, ALL))
            hint = f" (did you mean {guess!r}?)" if guess else ""
            return None, (f"unknown source {name!r}{hint}: the sources are "
                          f"{', '.join(SOURCES)} (or {ALL!r} for every one)")
    if ALL in names:
        if len(names) > 1:
            return None, f"{ALL!r} already names every source: give it alone, got {value!r}"
        return ALL, None
    chosen = [s for s in SOURCES if s in names]
    if len(chosen) == len(SOURCES):
        return ALL, None
    return (chosen[0] if len(chosen) == 1 else chosen), None


def varied(vary: Any) -> tuple[str, ...]:
    """The sources a (checked) `vary` value varies."""
    if vary == ALL or vary is None:
        return SOURCES
    return (vary,) if isinstance(vary, str) else tuple(vary)


def check_pin(value: Any) -> tuple[Any, str | None]:
    if value == FOLLOW or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value, None
    return None, f'expected an integer >= 0, or "{FOLLOW}" (the run\'s seed), got {value!r}'


def apply_vary(trainer: Mapping[str, Any], seed: int, base: int) -> dict[str, Any]:
    """The trainer keys of the run at `seed` of a cell: with `vary` set, every source
    pinned, the varied ones to `seed` and the others to `base`."""
    out = dict(trainer)
    vary = trainer.get(VARY, ALL)
    if vary != ALL:
        chosen = varied(vary)
        for source in SOURCES:
            out[PINS[source]] = seed if source in chosen else base
    return out


def with_seed(trainer: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """The trainer keys of the same cell at another seed (a clone's `seed=N`): the
    varied sources follow it, the others keep their pins."""
    out = dict(trainer)
    if trainer.get(VARY, ALL) != ALL:
        for source in varied(trainer[VARY]):
            out[PINS[source]] = seed
    return out


def seeds_of(trainer: Mapping[str, Any], seed: int) -> dict[str, int]:
    """Each source's seed: its pin, or the run's seed."""
    out = {}
    for source in SOURCES:
        pin = trainer.get(PINS[source], FOLLOW)
        out[source] = seed if pin == FOLLOW else int(pin)
    return out


def separated(trainer: Mapping[str, Any]) -> bool:
    """Whether the sources draw from streams of their own (any source is pinned);
    else the run draws as runs did before the sources had names."""
    return any(trainer.get(key, FOLLOW) != FOLLOW for key in PINS.values())


def switched_off(trainer: Mapping[str, Any]) -> list[str]:
    """The gridrun.randomness switches this run turns off (e.g. ["augment"])."""
    return [name for key, name in SWITCHES.items() if trainer.get(key, True) is False]


def label(trainer: Mapping[str, Any], axes: Mapping[str, Any], base: int | None) -> list[str]:
    """What a variant's name says about its randomness beyond its axes: the sources it
    varies and the base seed of the others, pins, and switches that are off."""
    words = []
    vary = trainer.get(VARY, ALL)
    if vary != ALL:
        if VARY not in axes:
            words.append(f"vary={vary if isinstance(vary, str) else '[' + ','.join(vary) + ']'}")
        if base is not None and len(varied(vary)) < len(SOURCES):
            words.append(f"fixed={base}")
    else:
        words += [f"{key}={trainer[key]}" for key in PINS.values()
                  if trainer.get(key, FOLLOW) != FOLLOW and key not in axes]
    words += [f"{key}=false" for key in SWITCHES if trainer.get(key, True) is False
              and key not in axes]
    return words


def conflict(tables: list[Mapping[str, Any]]) -> str | None:
    """A problem when one experiment both varies sources and pins one: `vary` pins
    every source itself (tables: its keys, grid, zip and each ablation)."""
    vary = any(VARY in t and t[VARY] not in (ALL, (ALL,)) for t in tables)
    pins = sorted({k for t in tables for k in t if k in PINS.values()})
    if vary and pins:
        return (f"vary pins every source itself (the varied ones to each seed, the others to the "
                f"first seed); remove {', '.join(pins)} or vary")
    return None
