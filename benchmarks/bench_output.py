"""What the output.log cap costs the run, and what `gridrun logs` costs on a big log.

1. A process prints N lines of ~100 bytes (block-buffered, as a run's print()
   is when its stdout is not a terminal) into output.log directly, as before,
   and through the pipe to the keeper (engine/outputlog.py), as now. Reported:
   the printing process's own wall time (the keeper works in its own process).
2. `gridrun logs RUN` on a run whose output.log is 100 MB (written before the
   cap existed, or by an older gridrun): peak RSS of the command.

    python benchmarks/bench_output.py [--lines 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gridrun.runs import layout, outputlog

PRINTER = """
import sys, time
n = int(sys.argv[1])
t = time.perf_counter()
for i in range(n):
    print(f"step {i:>9} loss 0.123456 " + "x" * 70)
sys.stdout.flush()
sys.stderr.write(f"{time.perf_counter() - t}\\n")
"""


def printing(tmp: Path, n: int, through_keeper: bool) -> tuple[float, int]:
    log = tmp / "output.log"
    log.unlink(missing_ok=True)
    if through_keeper:  # as backends/child.py sets it up
        r, out = os.pipe()
        fcntl.fcntl(out, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        keeper = subprocess.Popen([sys.executable, "-I", "-S", outputlog.__file__, str(log)],
                                  stdin=r, start_new_session=True)
        os.close(r)
    else:
        keeper, out = None, os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    done = subprocess.run([sys.executable, "-c", PRINTER, str(n)], stdout=out,
                          stderr=subprocess.PIPE, text=True, check=True)
    os.close(out)
    if keeper is not None:
        keeper.wait()
    return float(done.stderr), log.stat().st_size


def logs_rss(tmp: Path, size_mb: int) -> tuple[int, int]:
    from gridrun.runs.store import Store
    from gridrun.spec import RunSpec

    root = tmp / "runs"
    spec = RunSpec("abcdef0123", "e", "", 0, "spirals", {"epochs": 1}, {}, {})
    with Store(root) as store:
        store.enqueue([spec])
    folder = layout.make_private_dir(layout.run_dir(root, "e", spec.id))
    line = b"x" * 99 + b"\n"
    with open(folder / layout.OUTPUT, "wb") as f:
        for _ in range(size_mb):
            f.write(line * ((1 << 20) // 100))
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    done = subprocess.run([sys.executable, "-m", "gridrun", "logs", spec.id, "--root", str(root)],
                          stdout=subprocess.PIPE, check=True)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(rss, before) // 1024, done.stdout.count(b"\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--log-mb", type=int, default=100)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for keeper in [False, True] * args.repeat:
            t0 = time.perf_counter()
            secs, size = printing(tmp, args.lines, keeper)
            print(f"{'pipe + keeper' if keeper else 'file (before)':<14} printer {secs:6.3f} s  "
                  f"until the log is complete {time.perf_counter() - t0:6.3f} s  "
                  f"output.log {size / 1e6:7.1f} MB", flush=True)
        rss, lines = logs_rss(tmp, args.log_mb)
        print(f"gridrun logs on a {args.log_mb} MB output.log: peak RSS {rss} MB, {lines} lines printed")


if __name__ == "__main__":
    main()
