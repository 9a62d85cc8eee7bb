"""Export time against training time: one run of the example file, exported three ways.

    python benchmarks/bench_export.py [--run ID] [--repeat 3] [--dir DIR]

Trains one cell of experiments.toml in the foreground (default: width-lr,
hidden=128 lr=0.01, seed 0), then times `export_model` (export, load, parity
on 3 validation batches and one of an unseen batch size) for onnx, pt2 and
torchscript, each in a fresh process. The baseline is the run's own training
wall time (summary.json). Figures go into benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ONE = """
import json, sys, time
from gridrun.deploy.model import export_model, load_run
run = load_run(sys.argv[1], root=sys.argv[2])
t = time.perf_counter()
report = export_model(run, fmt=sys.argv[3], out=sys.argv[4])
print(json.dumps({"total_s": time.perf_counter() - t, "export_s": report["export_s"],
                  "ok": report["ok"], "max_abs": max(o["max_abs"] for o in report["outputs"].values())}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", default="6d3645619a", help="a run id of experiments.toml")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="gridrun-bench-export-"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "gridrun", "train", str(REPO / "experiments.toml"), args.run,
                    "--root", str(root)], check=True, env=env, capture_output=True)
    folder = next(root.glob(f"*/{args.run}*"))
    summary = json.loads((folder / "summary.json").read_text())
    print(f"{platform.node()} {platform.processor() or platform.machine()} {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, load {os.getloadavg()[0]:.1f}")
    print(f"run {summary['run_id']}: {summary['step']} steps trained in {summary['wall_time_s']:.2f} s")
    for fmt, name in (("onnx", "m.onnx"), ("pt2", "m.pt2"), ("torchscript", "m.ts.pt")):
        got = []
        for i in range(args.repeat):
            out = root / f"{fmt}{i}" / name
            done = subprocess.run([sys.executable, "-c", ONE, str(folder), str(root), fmt, str(out)],
                                  env=env, capture_output=True, text=True)
            if done.returncode:
                print(f"{fmt}: failed: {done.stderr.strip().splitlines()[-1:]}")
                break
            got.append(json.loads(done.stdout.strip().splitlines()[-1]))
        if got:
            export = statistics.median(g["export_s"] for g in got)
            total = statistics.median(g["total_s"] for g in got)
            print(f"{fmt:<12} export {export:6.2f} s, with load + parity {total:6.2f} s "
                  f"= {total / summary['wall_time_s']:.2f}x the training; parity "
                  f"{'ok' if all(g['ok'] for g in got) else 'FAILED'} (max abs diff {got[0]['max_abs']:.2g})")


if __name__ == "__main__":
    main()
