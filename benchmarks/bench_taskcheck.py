"""The task check (`gridrun plan --check`): seconds per task configuration.

    python benchmarks/bench_taskcheck.py [--repeat 5] [--threads N]

Measures, in one fresh process: importing torch and gridrun's task check
(paid once by `gridrun plan --check`, `run` and `queue`); then the check of
the example experiments.toml and of each built-in task at its default keys,
first cold (the first check in the process, as a user's command pays it) and
then the median of `--repeat` warm repetitions. Baseline, measured beside it:
calling the task's factory alone (building the model and the data), the part
no check can avoid; each check is printed as a ratio to it. The target: under a
second per task configuration, cold, for the example and each built-in task (a
test asserted it until it failed beside other work, issue 44: a time is measured
here, with the load average beside it, never asserted in tests/).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 1.0  # a task configuration's check, cold


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()

    t0 = time.perf_counter()
    import torch

    from gridrun.checks.taskcheck import check_runs
    from gridrun.spec import load_runs
    from gridrun.tasks import resolve
    imports = time.perf_counter() - t0
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# {platform.node()} {platform.processor() or platform.machine()} {os.cpu_count()} cores, "
          f"Python {sys.version.split()[0]}, torch {torch.__version__} ({torch.get_num_threads()} "
          f"threads), load average {os.getloadavg()[0]:.1f}")
    print(f"import torch + gridrun.checks.taskcheck: {imports:.2f} s (once per command)")

    files = {"experiments.toml": ROOT / "experiments.toml"}
    tmp = Path(tempfile.mkdtemp())
    for name in ("spirals", "shapes", "sort"):
        files[name] = tmp / f"{name}.toml"
        files[name].write_text(f'[experiments.{name}]\ntask = "{name}"\n')

    for label, path in files.items():
        runs = load_runs(path)
        cold = check_runs(runs, path)
        assert cold.ok, [str(p) for p in cold.problems]
        warm = [check_runs(runs, path) for _ in range(args.repeat)]
        for i, config in enumerate(cold.configs):
            builds = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                resolve(config.task)(**config.task_args)
                builds.append(time.perf_counter() - start)
            keys = " ".join(f"{k}={v}" for k, v in config.task_args.items()
                            if k in ("hidden", "channels", "dim"))
            factory = statistics.median(builds)
            warm_s = statistics.median(w.configs[i].seconds for w in warm)
            print(f"{label:<17} {config.task:<8} {keys:<12} cold {config.seconds * 1e3:7.1f} ms "
                  f"= {config.seconds / factory:5.1f}x   warm {warm_s * 1e3:7.1f} ms "
                  f"= {warm_s / factory:5.1f}x   the factory alone ({factory * 1e3:6.1f} ms)")
        slowest = max(c.seconds for c in cold.configs)
        print(f"{label:<17} total, {len(cold.configs)} configuration(s): cold {cold.seconds:.3f} s, "
              f"warm {statistics.median(w.seconds for w in warm):.3f} s (torch import excluded); "
              f"slowest cold {slowest * 1e3:.0f} ms: {'under' if slowest < TARGET_S else 'OVER'} "
              f"the {TARGET_S:g} s target")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
