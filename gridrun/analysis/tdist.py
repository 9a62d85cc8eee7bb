"""Student's t distribution: the two numbers an ablation table needs (the 95%
quantile for a confidence interval, the tail for Welch's p-value).

Written out rather than imported: `scipy.special` takes about 160 ms to import
(with NumPy's f2py and the array API layer), more than the rest of `gridrun
compare`. The tail is the regularized incomplete beta function by its continued
fraction (modified Lentz), the textbook method; the tests hold it to scipy's
`stdtr`/`stdtrit` to a relative 1e-9 (measured: 2.5e-11 at worst).
"""

from __future__ import annotations

import functools
import math

_TINY = 1e-300
_EPS = 1e-16


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), which converges fast for x < (a+1)/(a+b+2)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 10_000):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def betainc(a: float, b: float, x: float, y: float | None = None) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1;
    `y` is 1 - x when the caller has it more exactly than 1 - x rounds to."""
    y = 1.0 - x if y is None else y
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    log_front = (a * math.log(x) + b * math.log(y)
                 + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, y) / b


def t_sf(t: float, dof: float) -> float:
    """P(T > t) for Student's t with `dof` degrees of freedom (scipy's stdtr(dof, -t))."""
    if math.isnan(t) or math.isnan(dof):
        return math.nan
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * betainc(dof / 2.0, 0.5, dof / (dof + t * t), t * t / (dof + t * t))
    return tail if t >= 0 else 1.0 - tail


@functools.lru_cache(maxsize=1024)
def t_ppf(q: float, dof: float) -> float:
    """The q-quantile (scipy's stdtrit(dof, q)), by bisection on the tail: monotone,
    so it cannot miss, and cached per degrees of freedom."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile {q} is not between 0 and 1")
    if q < 0.5:
        return -t_ppf(1.0 - q, dof)
    lo, hi = 0.0, 1.0
    while t_sf(hi, dof) > 1.0 - q:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if t_sf(mid, dof) > 1.0 - q else (lo, mid)
    return 0.5 * (lo + hi)
