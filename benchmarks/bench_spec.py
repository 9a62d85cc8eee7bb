"""Expanding and validating a 10,000-run matrix, against parsing + enumerating it.

    python benchmarks/bench_spec.py [--repeat 7]

Baseline (measured in the same process, same file): `tomllib.loads` of the
file plus `itertools.product` over the same axes and seeds: the work no
expansion can avoid. The figure is load_runs time / baseline time, median of
the repetitions; absolute times are printed alongside.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import tempfile
import time
import tomllib
from pathlib import Path

from gridrun.spec import load_runs

# 25 lr x 20 hidden x 5 depth x 4 seeds = 10,000 runs
MATRIX = """
[defaults]
task = "spirals"
epochs = 5
batch_size = 128

[experiments.big]
seeds = 4
grid = {{ lr = [{lrs}], hidden = [{hiddens}], depth = [1, 2, 3, 4, 5] }}
"""


def matrix_text() -> str:
    lrs = ", ".join(repr(round(1e-4 * (i + 1), 6)) for i in range(25))
    hiddens = ", ".join(str(8 * (i + 1)) for i in range(20))
    return MATRIX.format(lrs=lrs, hiddens=hiddens)


def baseline(text: str) -> int:
    data = tomllib.loads(text)
    exp = data["experiments"]["big"]
    grid = exp["grid"]
    cells = itertools.product(*grid.values(), range(exp["seeds"]))
    return sum(1 for _ in cells)


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    text = matrix_text()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.toml"
        path.write_text(text)
        load_runs(path)  # warm: the task factory's module (and torch) imported once
        base_times, spec_times = [], []
        for _ in range(args.repeat):
            t, n_base = timed(lambda: baseline(text))
            base_times.append(t)
            t, runs = timed(lambda: load_runs(path))
            spec_times.append(t)
    assert n_base == len(runs) == 10_000, (n_base, len(runs))
    base, spec = statistics.median(base_times), statistics.median(spec_times)
    print(f"machine: {platform.node()} {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"runs: {len(runs):,}, repetitions: {args.repeat} (median)")
    print(f"baseline tomllib.loads + itertools.product: {base * 1e3:.2f} ms")
    print(f"load_runs (parse, validate, expand, hash ids): {spec * 1e3:.1f} ms "
          f"({spec / len(runs) * 1e6:.1f} us per run)")
    print(f"ratio load_runs / baseline: {spec / base:.0f}x")


if __name__ == "__main__":
    main()
