"""Analysis at scale: runs_frame + ablation_table over 10,000 run folders, and
exporting 10 million metric rows, with time and peak memory.

    python benchmarks/bench_analysis.py [--runs 10000] [--lines 250] [--repeat 3] [--dir DIR]

Generates 10 experiments x 1,000 runs (10 lr x 10 hidden x 10 seeds), each
with config.toml, summary.json and a metrics.jsonl of `--lines` lines (90%
train and val lines of 4 metrics each): 250 lines give 1,000 metric
rows a run, 10 million in all. Each measurement runs in a fresh process and
reports that process's peak RSS (getrusage) and its RSS after imports.

Baselines, measured in the same run on the same files:
- frame: `tomllib.load` + `json.load` of every config.toml and summary.json
  into a list and one `pd.DataFrame` (the reading no table can avoid);
- export: a naive all-in-memory export (read every log whole, build one dict
  per metric row, one DataFrame, one `to_csv`) on one experiment (1,000 runs,
  1 million rows), beside the streamed export of the same experiment.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXPERIMENTS, LRS, HIDDENS = 10, [round(1e-4 * 2**i, 7) for i in range(10)], [16 * (i + 1) for i in range(10)]


def generate(root: Path, runs: int, lines: int) -> None:
    from gridrun.engine import layout
    from gridrun.engine.spec import TRAINER_KEYS, RunSpec, run_id, write_run_config

    per_exp = runs // EXPERIMENTS
    base = {k: key.default for k, key in TRAINER_KEYS.items()}
    train = ('{{"t":{t},"step":{s},"epoch":{e},"split":"train","loss":{l:.6f},"lr":0.001,'
             '"samples_per_s":{v:.1f},"step_time":0.0123}}\n')
    val = ('{{"t":{t},"step":{s},"epoch":{e},"split":"val","loss":{l:.6f},"accuracy":{a:.6f},'
           '"top5":{a:.6f},"error":{l:.6f}}}\n')
    for e in range(EXPERIMENTS):
        for i in range(per_exp):
            lr, hidden, seed = LRS[i % 10], HIDDENS[(i // 10) % 10], i // 100
            trainer, task_args = {**base, "lr": lr}, {"hidden": hidden}
            rid = run_id(f"exp{e}", "spirals", trainer, task_args, seed)
            spec = RunSpec(id=rid, experiment=f"exp{e}", variant=f"lr={lr} hidden={hidden}",
                           seed=seed, task="spirals", trainer=trainer, task_args=task_args,
                           axes={"lr": lr, "hidden": hidden})
            folder = layout.make_private_dir(layout.run_dir(root, spec.experiment, rid))
            write_run_config(folder / layout.CONFIG, spec)
            loss = 1.0 / (1 + lr * 1000 + hidden / 100) + seed * 0.001
            parts = []
            for k in range(1, lines + 1):
                if k % 10:
                    parts.append(train.format(t=k, s=k, e=k // 50, l=loss * (1 + 1 / k), v=1000.0 + k))
                else:
                    parts.append(val.format(t=k, s=k, e=k // 50, l=loss, a=1 - loss))
            (folder / layout.METRICS).write_text("".join(parts))
            (folder / layout.SUMMARY).write_text(json.dumps({
                "run_id": rid, "experiment": spec.experiment, "status": "completed",
                "metrics": {"loss": "lower", "accuracy": "higher"}, "early_stop_metric": "loss",
                "final": {"loss": loss, "accuracy": 1 - loss}, "best": {"loss": loss, "accuracy": 1 - loss},
                "best_step": lines, "train_loss": loss, "samples_per_s": 1000.0, "tokens_per_s": None,
                "peak_memory_bytes": 1 << 20, "started_at": 0.0, "ended_at": 10.0, "wall_time_s": 10.0,
            }))


# ---------------------------------------------------------------- phases (child processes)

def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def phase(name: str, root: Path, out: Path) -> dict:
    import pandas as pd

    from gridrun.engine import analysis, export, layout

    analysis.ablation_table  # noqa: B018 - imports done before the baseline RSS
    import scipy.stats  # noqa: F401
    after_imports = rss_mib()
    t0 = time.perf_counter()
    if name == "frame":
        frame = analysis.runs_frame(root)
        t1 = time.perf_counter()
        table = analysis.ablation_table(frame)
        result = {"runs": len(frame), "table_rows": len(table), "frame_s": t1 - t0,
                  "table_s": time.perf_counter() - t1}
    elif name == "frame_baseline":
        import tomllib

        rows = []
        for exp in sorted(root.iterdir()):
            for folder in sorted(exp.iterdir()):
                with open(folder / layout.CONFIG, "rb") as f:
                    row = tomllib.load(f)
                with open(folder / layout.SUMMARY) as f:
                    row.update(json.load(f))
                rows.append(row)
        result = {"runs": len(pd.DataFrame(rows))}
    elif name in ("export", "export_exp0"):
        exp = "exp0" if name == "export_exp0" else None
        result = {"rows": export.export_metrics(root, out, experiment=exp, force=True)}
    elif name == "naive_exp0":
        from gridrun.engine.runlog import read_all

        rows = []
        for folder in sorted((root / "exp0").iterdir()):
            for r in read_all(folder / layout.METRICS):
                for k, v in r.items():
                    if k not in ("t", "step", "epoch", "split"):
                        rows.append({"run_id": folder.name, "step": r["step"], "epoch": r["epoch"],
                                     "split": r["split"], "metric": k, "value": v})
        pd.DataFrame(rows).to_csv(out, index=False)
        result = {"rows": len(rows)}
    else:
        raise SystemExit(f"unknown phase {name}")
    result.update(seconds=time.perf_counter() - t0, peak_rss_mib=rss_mib(),
                  rss_after_imports_mib=after_imports)
    return result


def run_phase(name: str, root: Path, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--phase", name, "--dir", str(root), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--lines", type=int, default=250)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", type=Path, default=None, help="reuse generated runs here")
    p.add_argument("--phase", default=None)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.phase:
        print(json.dumps(phase(args.phase, args.dir, args.out)))
        return
    tmp = tempfile.TemporaryDirectory(prefix="gridrun-bench-")
    root = args.dir or Path(tmp.name) / "runs"
    out = Path(tmp.name) / "export.csv"
    print(f"host {platform.node()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    if not root.exists():
        t0 = time.perf_counter()
        generate(root, args.runs, args.lines)
        size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        print(f"generated {args.runs:,} runs ({size / 2**20:,.0f} MiB) in {time.perf_counter() - t0:.0f} s")

    def report(label: str, results: list[dict], extra: str = "") -> dict:
        med = statistics.median(r["seconds"] for r in results)
        peak = max(r["peak_rss_mib"] for r in results)
        base = min(r["rss_after_imports_mib"] for r in results)
        print(f"{label:<44} {med:8.2f} s  peak RSS {peak:7.0f} MiB "
              f"(+{peak - base:.0f} over imports){extra}")
        return {"s": med, "peak": peak, "delta": peak - base}

    frame = [run_phase("frame", root, out) for _ in range(args.repeat)]
    base = [run_phase("frame_baseline", root, out) for _ in range(args.repeat)]
    f = report(f"runs_frame + ablation_table ({frame[0]['runs']:,} runs)", frame,
               f"  [frame {statistics.median(r['frame_s'] for r in frame):.2f} s, table "
               f"{statistics.median(r['table_s'] for r in frame):.2f} s, {frame[0]['table_rows']} rows]")
    b = report("baseline: tomllib + json.load + DataFrame", base)
    print(f"{'':44} ratio {f['s'] / b['s']:.2f}x the baseline")
    exp0 = [run_phase("export_exp0", root, out) for _ in range(args.repeat)]
    naive = [run_phase("naive_exp0", root, out) for _ in range(args.repeat)]
    s = report(f"export_metrics, 1 experiment ({exp0[0]['rows']:,} rows)", exp0)
    n = report("baseline: naive in-memory export, same rows", naive)
    print(f"{'':44} time {s['s'] / n['s']:.2f}x, memory over imports "
          f"{s['delta'] / max(n['delta'], 1):.2f}x the naive one")
    full = [run_phase("export", root, out)]
    report(f"export_metrics, all ({full[0]['rows']:,} rows)", full,
           f"  [{full[0]['rows'] / full[0]['seconds']:,.0f} rows/s, "
           f"CSV {out.stat().st_size / 2**20:,.0f} MiB]")
    tmp.cleanup()


if __name__ == "__main__":
    main()
