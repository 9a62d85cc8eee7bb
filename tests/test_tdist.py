"""Student's t written out (gridrun.analysis.tdist) against scipy's, which it replaces
on the path of `gridrun compare` (scipy.special alone costs ~160 ms to import)."""

import math
import random
import sys

import patience
import pytest
from scipy import special

from gridrun.analysis import tdist

DOFS = [0.5, 1, 1.5, 2, 3, 4.7, 9, 30, 100, 1000, 1e5]
TS = [0.0, 1e-6, 0.1, 0.5, 1.0, 2.0, 3.5, 8.0, 20.0, 100.0, 1e4]


@pytest.mark.parametrize("dof", DOFS)
def test_tail_matches_scipy(dof):
    rng = random.Random(dof)
    for t in [*TS, *(-t for t in TS), *(rng.uniform(-40, 40) for _ in range(50))]:
        assert tdist.t_sf(t, dof) == pytest.approx(float(special.stdtr(dof, -t)), rel=1e-9, abs=1e-300)


def test_quantile_matches_scipy():
    for dof in [*range(1, 60), 2.5, 7.3, 250, 1e4]:
        for q in (0.975, 0.5, 0.9, 0.025):
            assert tdist.t_ppf(q, dof) == pytest.approx(float(special.stdtrit(dof, q)), rel=1e-9, abs=1e-12)


def test_edges():
    assert tdist.t_sf(math.inf, 3) == 0.0 and tdist.t_sf(-math.inf, 3) == 1.0
    assert math.isnan(tdist.t_sf(math.nan, 3)) and math.isnan(tdist.t_sf(1.0, math.nan))
    with pytest.raises(ValueError):
        tdist.t_ppf(1.0, 3)


def test_compare_imports_no_pandas_numpy_or_scipy(tmp_path):
    code = ("import sys\nfrom gridrun.cli import main\n"
            f"sys.argv = ['gridrun', '--root', {str(tmp_path)!r}, 'compare']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('pandas', 'numpy', 'scipy') if m in sys.modules))")
    out = patience.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
