"""Sobol points in pure Python: Joe and Kuo's direction numbers (new-joe-kuo-6.21201,
the ones torch.quasirandom.SobolEngine uses), 30 bits, Gray-code order, for up to
MAX_DIMENSIONS parameters, optionally scrambled with a seed.

gridrun/spec never imports torch (`gridrun plan` stays fast), hence this copy;
tests/test_search_spec.py checks its unscrambled points against torch's.

Scrambling is a random linear matrix scramble of each dimension's direction
numbers followed by a random digital shift, both drawn from `random.Random(seed)`:
it keeps the points a (t, m, s)-net (the uniformity a grid lacks) while no two
seeds share the corner point 0.
"""

from __future__ import annotations

import random

BITS = 30  # torch's MAXBIT: the points are integers / 2**30
# (s, a, m_1..m_s) of dimensions 2.. (dimension 1 is the van der Corput sequence)
_JOE_KUO = (
    (1, 0, (1,)),
    (2, 1, (1, 3)),
    (3, 1, (1, 3, 1)),
    (3, 2, (1, 1, 1)),
    (4, 1, (1, 1, 3, 3)),
    (4, 4, (1, 3, 5, 13)),
    (5, 2, (1, 1, 5, 5, 17)),
    (5, 4, (1, 1, 5, 5, 5)),
    (5, 7, (1, 1, 7, 11, 19)),
    (5, 11, (1, 1, 5, 1, 1)),
    (5, 13, (1, 1, 1, 3, 11)),
    (5, 14, (1, 3, 5, 5, 31)),
    (6, 1, (1, 3, 3, 9, 7, 49)),
    (6, 13, (1, 1, 1, 15, 21, 21)),
    (6, 16, (1, 3, 1, 13, 27, 49)),
    (6, 19, (1, 1, 1, 15, 7, 5)),
    (6, 22, (1, 3, 1, 15, 13, 25)),
    (6, 25, (1, 1, 5, 5, 19, 61)),
    (7, 1, (1, 3, 7, 11, 23, 15, 103)),
    (7, 4, (1, 3, 7, 13, 13, 15, 69)),
)
MAX_DIMENSIONS = 1 + len(_JOE_KUO)


def _directions(dim: int) -> list[int]:
    """The BITS direction integers of dimension `dim` (0-based), scaled to BITS bits."""
    if dim == 0:
        return [1 << (BITS - 1 - k) for k in range(BITS)]
    s, a, m = _JOE_KUO[dim - 1]
    v = [m[k] << (BITS - 1 - k) for k in range(s)]
    for k in range(s, BITS):
        x = v[k - s] ^ (v[k - s] >> s)
        for j in range(1, s):
            if (a >> (s - 1 - j)) & 1:
                x ^= v[k - j]
        v.append(x)
    return v


def _scrambled(v: list[int], rng: random.Random) -> list[int]:
    """`v` through a random lower-triangular binary matrix with a unit diagonal (each
    output bit is itself plus a random mix of the bits above it)."""
    rows = [(1 << (BITS - 1 - i)) | (rng.getrandbits(i) << (BITS - i) if i else 0)
            for i in range(BITS)]
    out = []
    for x in v:
        y = 0
        for i, row in enumerate(rows):
            if bin(row & x).count("1") & 1:
                y |= 1 << (BITS - 1 - i)
        out.append(y)
    return out


def sobol(n: int, dims: int, *, seed: int | None = None) -> list[list[float]]:
    """The first `n` points of the `dims`-dimensional Sobol sequence in [0, 1);
    scrambled with `seed` unless it is None (then point 0 is the origin, as torch's)."""
    if not 1 <= dims <= MAX_DIMENSIONS:
        raise ValueError(f"Sobol points have 1 to {MAX_DIMENSIONS} dimensions, not {dims}")
    directions = [_directions(d) for d in range(dims)]
    shift = [0] * dims
    if seed is not None:
        rng = random.Random(seed)
        directions = [_scrambled(v, rng) for v in directions]
        shift = [rng.getrandbits(BITS) for _ in range(dims)]
    x = list(shift)
    points = [[xi / (1 << BITS) for xi in x]] if n > 0 else []
    for i in range(1, n):
        c = ((i - 1) ^ ((i - 1) + 1)).bit_length() - 1  # the lowest zero bit of i - 1
        x = [xi ^ v[c] for xi, v in zip(x, directions, strict=True)]
        points.append([xi / (1 << BITS) for xi in x])
    return points
