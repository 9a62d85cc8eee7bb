"""Analysis at scale: `gridrun compare` and the compare screen on a 10,000-run root,
runs_frame + ablation_table over 10,000 run folders, and exporting 10 million
metric rows, with time and peak memory.

    python benchmarks/bench_analysis.py [--runs 10000] [--lines 250] [--repeat 3] [--dir DIR]
                                        [--only compare|frame|export]

Generates 10 experiments x 1,000 runs (20 lr x 10 hidden x 5 seeds: 2,000
cells in all) and a 4-run experiment `small` (2 lr x 2 seeds), each with
config.toml, summary.json and a metrics.jsonl of `--lines` lines (90% train
and val lines of 4 metrics each): 250 lines give 1,000 metric rows a run, 10
million in all; and the store (gridrun.db) the engine would have left: every
run completed, its summary in its row. Each measurement runs in a fresh
process and reports that process's peak RSS (getrusage) and its RSS after
imports.

compare (issue 13):
- `gridrun compare small` (4 runs) and `gridrun compare` (2,000 cells), in
  process through Typer's CliRunner: the first call pays the lazy imports and
  is left out, the median of the others is the command's own cost; beside it
  the whole command in a fresh interpreter (`python -m gridrun compare ...`),
  interpreter and imports included.
- the compare screen's refresh (`StoreSource.compare`, what the screen calls
  every 2 s) on `small`: the first call, then with nothing changed (median,
  p95), after a change to another experiment's run, after a change to one of
  its own runs.

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

EXPERIMENTS, LRS, HIDDENS = 10, [round(1e-4 * 1.5**i, 9) for i in range(20)], [16 * (i + 1) for i in range(10)]
SMALL = "small"


def generate(root: Path, runs: int, lines: int) -> None:
    from gridrun.runs import layout
    from gridrun.runs.store import Store
    from gridrun.spec import TRAINER_KEYS, RunSpec, run_id, write_run_config

    per_exp = runs // EXPERIMENTS
    cells = [(lr, hidden, seed) for seed in range(5) for hidden in HIDDENS for lr in LRS]
    made: list[tuple[RunSpec, dict]] = []
    base = {k: key.default for k, key in TRAINER_KEYS.items()}
    train = ('{{"t":{t},"step":{s},"epoch":{e},"split":"train","loss":{l:.6f},"lr":0.001,'
             '"samples_per_s":{v:.1f},"step_time":0.0123}}\n')
    val = ('{{"t":{t},"step":{s},"epoch":{e},"split":"val","loss":{l:.6f},"accuracy":{a:.6f},'
           '"top5":{a:.6f},"error":{l:.6f}}}\n')
    plan = [(f"exp{e}", cells[i % len(cells)]) for e in range(EXPERIMENTS) for i in range(per_exp)]
    plan += [(SMALL, (lr, 64, seed)) for seed in range(2) for lr in LRS[:2]]
    for exp, (lr, hidden, seed) in plan:
        trainer, task_args = {**base, "lr": lr}, {"hidden": hidden}
        rid = run_id(exp, "spirals", trainer, task_args, seed)
        spec = RunSpec(id=rid, experiment=exp, variant=f"lr={lr} hidden={hidden}",
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
        summary = {
            "run_id": rid, "experiment": spec.experiment, "status": "completed",
            "metrics": {"loss": "lower", "accuracy": "higher"}, "early_stop_metric": "loss",
            "final": {"loss": loss, "accuracy": 1 - loss}, "best": {"loss": loss, "accuracy": 1 - loss},
            "best_step": lines, "train_loss": loss, "samples_per_s": 1000.0, "tokens_per_s": None,
            "peak_memory_bytes": 1 << 20, "started_at": 0.0, "ended_at": 10.0, "wall_time_s": 10.0,
        }
        (folder / layout.SUMMARY).write_text(json.dumps(summary))
        made.append((spec, summary))
    with Store(root) as store:  # what the engine leaves: every run completed, its summary in its row
        store.enqueue([spec for spec, _ in made])
        for spec, summary in made:
            store.transition(spec.id, "queued", "completed", started_at=0.0, ended_at=10.0,
                             summary=summary)


# ---------------------------------------------------------------- phases (child processes)

def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def cli_phase(root: Path, args: list[str], repeat: int) -> dict:
    """`gridrun compare ARGS` in this process: the first call pays the lazy imports."""
    from typer.testing import CliRunner

    from gridrun.cli import app

    runner, times, cpu, out = CliRunner(), [], [], None
    for _ in range(repeat + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        out = runner.invoke(app, ["compare", *args, "--root", str(root)])
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if out.exit_code != 0:
            raise SystemExit(f"gridrun compare {args} failed: {out.output}")
    rows = sum(1 for line in out.stdout.splitlines() if line and line[0].isdigit())
    return {"first_s": times[0], "seconds": statistics.median(times[1:]),
            "cpu_s": statistics.median(cpu[1:]), "table_lines": rows}


def screen_phase(root: Path, repeat: int) -> dict:
    """What the compare screen pays each 2 s: `StoreSource.compare(small)`."""
    from gridrun.runs.store import Store
    from gridrun.tui.store_source import StoreSource

    src = StoreSource(root)
    t0 = time.perf_counter()
    first = src.compare(SMALL)
    result = {"first_s": time.perf_counter() - t0, "rows": len(first.rows)}

    def timed(n: int, before=lambda: None) -> list[float]:
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < n and (len(times) < 3 or time.perf_counter() - start < 30):
            before()
            t = time.perf_counter()
            table = src.compare(SMALL)
            times.append(time.perf_counter() - t)
            assert table == first, "the table changed"
        return sorted(times)

    def p95(times: list[float]) -> float:
        return times[min(len(times) - 1, int(0.95 * len(times)))]

    idle = timed(max(20, repeat * 20))
    with Store(root) as store:
        own = [r.id for r in store.list_runs(experiment=SMALL)][:1]
        other = [r.id for r in store.list_runs(experiment="exp0")][:1]
        elsewhere = timed(repeat * 3, lambda: store.set_priority(other, 0))
        changed = timed(repeat * 3, lambda: store.set_priority(own, 0))
    result.update(idle_p50=statistics.median(idle), idle_p95=p95(idle), idle_n=len(idle),
                  elsewhere_p50=statistics.median(elsewhere),
                  changed_p50=statistics.median(changed), seconds=statistics.median(idle))
    return result


def phase(name: str, root: Path, out: Path, repeat: int = 3) -> dict:
    import pandas as pd

    from gridrun.analysis import ablation as analysis
    from gridrun.analysis import export, frames
    from gridrun.runs import layout

    analysis.ablation_table  # noqa: B018 - imports done before the baseline RSS
    import scipy.stats  # noqa: F401
    after_imports = rss_mib()
    t0 = time.perf_counter()
    if name == "cli_small":
        result = cli_phase(root, [SMALL], repeat)
    elif name == "cli_all":
        result = cli_phase(root, [], repeat)
    elif name == "screen":
        result = screen_phase(root, repeat)
    elif name == "frame":
        frame = frames.runs_frame(root)
        t1 = time.perf_counter()
        table = analysis.ablation_table(frame)
        result = {"runs": len(frame), "table_rows": len(table), "frame_s": t1 - t0,
                  "table_s": time.perf_counter() - t1}
    elif name == "frame_baseline":
        import tomllib

        rows = []
        for exp in sorted(p for p in root.iterdir() if p.is_dir() and p.name != SMALL):
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
        from gridrun.runs.runlog import read_all

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
    result.setdefault("seconds", time.perf_counter() - t0)
    result.update(peak_rss_mib=rss_mib(), rss_after_imports_mib=after_imports)
    return result


def run_phase(name: str, root: Path, out: Path, repeat: int = 3) -> dict:
    cmd = [sys.executable, __file__, "--phase", name, "--dir", str(root), "--out", str(out),
           "--repeat", str(repeat)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def whole_command(root: Path, args: list[str], repeat: int) -> float:
    """`python -m gridrun compare ARGS` in a fresh interpreter, imports included: median seconds."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gridrun", "compare", *args, "--root", str(root)],
                       capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compare_report(root: Path, out: Path, repeat: int) -> None:
    ms = lambda s: f"{s * 1000:,.1f} ms" if s >= 0.01 else f"{s * 1000:.3f} ms"  # noqa: E731
    for label, name, args in (("gridrun compare small (4 runs)", "cli_small", [SMALL]),
                              ("gridrun compare (all)", "cli_all", [])):
        r = run_phase(name, root, out, repeat)
        print(f"{label + ', ' + str(r['table_lines']) + ' table rows':<44} {ms(r['seconds']):>10} "
              f"in process (median of {repeat}, CPU {ms(r['cpu_s'])}; first call {ms(r['first_s'])}); "
              f"whole command {ms(whole_command(root, args, repeat))}")
    r = run_phase("screen", root, out, repeat)
    print(f"{'compare screen refresh, small':<44} first {ms(r['first_s'])}; nothing changed "
          f"p50 {ms(r['idle_p50'])}, p95 {ms(r['idle_p95'])} (n={r['idle_n']}); a run of another "
          f"experiment changed p50 {ms(r['elsewhere_p50'])}; one of its runs changed p50 "
          f"{ms(r['changed_p50'])}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--lines", type=int, default=250)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", type=Path, default=None, help="reuse generated runs here")
    p.add_argument("--only", choices=("compare", "frame", "export"), default=None)
    p.add_argument("--phase", default=None)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.phase:
        print(json.dumps(phase(args.phase, args.dir, args.out, args.repeat)))
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

    if args.only in (None, "compare"):
        compare_report(root, out, args.repeat)
    if args.only in (None, "frame"):
        frame_report(root, out, args.repeat, report)
    if args.only in (None, "export"):
        export_report(root, out, args.repeat, report)
    tmp.cleanup()


def frame_report(root: Path, out: Path, repeat: int, report) -> None:
    frame = [run_phase("frame", root, out) for _ in range(repeat)]
    base = [run_phase("frame_baseline", root, out) for _ in range(repeat)]
    f = report(f"runs_frame + ablation_table ({frame[0]['runs']:,} runs)", frame,
               f"  [frame {statistics.median(r['frame_s'] for r in frame):.2f} s, table "
               f"{statistics.median(r['table_s'] for r in frame):.2f} s, {frame[0]['table_rows']} rows]")
    b = report("baseline: tomllib + json.load + DataFrame", base)
    print(f"{'':44} ratio {f['s'] / b['s']:.2f}x the baseline")


def export_report(root: Path, out: Path, repeat: int, report) -> None:
    exp0 = [run_phase("export_exp0", root, out) for _ in range(repeat)]
    naive = [run_phase("naive_exp0", root, out) for _ in range(repeat)]
    s = report(f"export_metrics, 1 experiment ({exp0[0]['rows']:,} rows)", exp0)
    n = report("baseline: naive in-memory export, same rows", naive)
    print(f"{'':44} time {s['s'] / n['s']:.2f}x, memory over imports "
          f"{s['delta'] / max(n['delta'], 1):.2f}x the naive one")
    full = [run_phase("export", root, out)]
    report(f"export_metrics, all ({full[0]['rows']:,} rows)", full,
           f"  [{full[0]['rows'] / full[0]['seconds']:,.0f} rows/s, "
           f"CSV {out.stat().st_size / 2**20:,.0f} MiB]")


if __name__ == "__main__":
    main()
