"""The proofs that need a GPU, in one script (issue 14). On a machine with CUDA:

1. bitwise repeat and exact mid-epoch resume for fp32, bf16 and fp16 with
   `deterministic = true` (metrics without timings, and the weights' hash);
2. the trainer's time per step against a bare loop and a `.item()`-per-step
   loop, same model and data, in this process;
3. diagnostics on CUDA: memory fields on the train lines, and
   `checkpoint_modules` lowering peak memory on `sort`;
4. a real out-of-memory (a task that allocates past the card) that the
   engine retries with half the micro-batch, to completion;
5. telemetry: NVML names the run's process on the GPU it trains on;
6. a tmux capture of the interface's GPU panel while two runs train.

On a machine without CUDA it says so and exits 0. Exit 1 when a check fails.

    python benchmarks/gpu_check.py [--skip-tmux]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"  {'ok  ' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        FAILED.append(what)


def spec(task="spirals", args=None, **trainer):
    from gridrun.spec import TRAINER_KEYS, RunSpec

    cfg = {k: key.default for k, key in TRAINER_KEYS.items()}
    cfg.update({"epochs": 2, "batch_size": 64, "log_every": 4, **trainer})
    args = {"train_size": 2048, "val_size": 256} if args is None else args
    return RunSpec(id="gpu", experiment="gpu", variant="", seed=0, task=task, trainer=cfg,
                   task_args=args, axes={})


def metrics(run_dir: Path) -> list[dict]:
    from gridrun.runs import layout, records, runlog

    return [{k: v for k, v in r.items() if k not in records.TIMING}
            for r in runlog.read_all(run_dir / layout.METRICS)]


def repeat_and_resume(tmp: Path) -> None:
    from gridrun.train.loop.trainer import train

    print("1. bitwise repeat and exact mid-epoch resume, deterministic = true")
    for precision in ("fp32", "bf16", "fp16"):
        run = spec(precision=precision, checkpoint_every=5)
        a, b, c = (tmp / f"{precision}-{x}" for x in "abc")
        sa = train(run, a, log=lambda s: None)
        sb = train(run, b, log=lambda s: None)
        check(sa["status"] == sb["status"] == "completed" and metrics(a) == metrics(b)
              and sa["weights_sha256"] == sb["weights_sha256"], f"{precision}: two runs identical")
        calls = iter(range(1, 10**9))  # should_stop is asked once a step
        first = train(run, c, should_stop=lambda calls=calls: next(calls) == 13,  # mid-epoch (31 steps an epoch)
                      log=lambda s: None)
        resumed = train(run, c, log=lambda s: None)
        check(first["status"] == "interrupted" and resumed.get("resumed_from_step") == 13
              and metrics(c) == metrics(a) and resumed["weights_sha256"] == sa["weights_sha256"],
              f"{precision}: stopped at step 13 and resumed = never stopped")


def step_times() -> None:
    from gridrun.tasks import resolve
    from gridrun.train.loop.trainer import train

    print("2. time per step: bare loop, .item() per step, gridrun's trainer (spirals, hidden 1024)")
    args, batch = {"hidden": 1024, "train_size": 65536, "val_size": 256}, 256
    device = torch.device("cuda")

    def bare(item: bool) -> float:
        torch.manual_seed(0)
        task = resolve("spirals")(**args)
        model = task.model.to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loader = torch.utils.data.DataLoader(task.train_data, batch_size=batch, shuffle=True,
                                             drop_last=True, pin_memory=True)
        torch.cuda.synchronize()
        start, steps = time.perf_counter(), 0
        for x, y in loader:
            loss = task.loss(model, (x.to(device, non_blocking=True), y.to(device, non_blocking=True)))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if item:
                loss.item()
            steps += 1
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / steps

    def trainer() -> float:
        from gridrun.runs import layout, runlog

        with tempfile.TemporaryDirectory() as d:
            train(spec("spirals", args, epochs=1, batch_size=batch, log_every=32, precision="fp32",
                       schedule="constant", warmup=0), d, log=lambda s: None)
            lines = [r for r in runlog.read_all(f"{d}/{layout.METRICS}") if r["split"] == "train"]
        total = sum(r["step_time"] * (r["step"] - p) for r, p in
                    zip(lines, [0] + [r["step"] for r in lines[:-1]], strict=True))
        return total / lines[-1]["step"]

    times: dict[str, list[float]] = {"bare": [], "bare + item()": [], "gridrun": []}
    for rep in range(5):
        for name in list(times)[rep % 3:] + list(times)[:rep % 3]:
            times[name].append(trainer() if name == "gridrun" else bare(name != "bare"))
    base = statistics.median(times["bare"])
    for name, values in times.items():
        print(f"  {name:<14} {statistics.median(values) * 1e3:8.3f} ms/step  "
              f"{statistics.median(values) / base:.3f}x")


def diagnostics_on_cuda(tmp: Path) -> None:
    from gridrun.runs import records, runlog
    from gridrun.train.loop.trainer import train

    print("3. diagnostics on CUDA, and checkpoint_modules")
    s = train(spec(clip_grad=1.0), tmp / "diag", log=lambda s: None)
    lines = [r for r in runlog.read_all(tmp / "diag" / "metrics.jsonl") if r["split"] == "train"]
    check(all(r.get(records.MEM_ALLOCATED, 0) > 0 and r.get(records.MEM_PEAK, 0) >= r[records.MEM_ALLOCATED]
              and records.GRAD_NORM in r for r in lines),
          f"every train line has CUDA memory and the grad norm ({s['environment'].get('gpu')}, "
          f"driver {s['environment'].get('driver')})")
    args = {"train_size": 1024, "val_size": 64, "dim": 512, "layers": 6, "max_len": 64}
    plain = train(spec("sort", args, epochs=1, batch_size=256), tmp / "sort-a", log=lambda s: None)
    ckpt = train(spec("sort", args, epochs=1, batch_size=256,
                      checkpoint_modules=["TransformerEncoderLayer"]), tmp / "sort-b", log=lambda s: None)
    check(ckpt["peak_memory_bytes"] < plain["peak_memory_bytes"],
          f"checkpoint_modules: peak {ckpt['peak_memory_bytes'] / 2**20:.0f} MiB vs "
          f"{plain['peak_memory_bytes'] / 2**20:.0f} MiB without; train loss "
          f"{ckpt['train_loss']:.6f} vs {plain['train_loss']:.6f}")


def hog(batch_fraction: float = 0.6, train_size: int = 512):
    """A task for the OOM check: each micro-batch of 64 samples or more allocates
    `batch_fraction` x (batch/32) of the card, so 64 overflows it and 32 fits."""
    from gridrun.tasks.spirals import spirals

    task = spirals(train_size=train_size, val_size=64)
    inner = task.loss
    card = torch.cuda.get_device_properties(0).total_memory

    def loss(model, batch):
        n = int(card * batch_fraction * batch[0].shape[0] / 32) // 4
        block = torch.empty(n, dtype=torch.float32, device=batch[0].device)
        # zero what is read: fresh memory may hold NaN bit patterns, and 0 * NaN is NaN
        return inner(model, batch) + 0 * block[:1].zero_().sum()

    task.loss = loss
    return task


def gridrun(*args: str, root: Path, check_rc: bool = True, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "gridrun", *args, "--root", str(root)], env=env,
                          capture_output=True, text=True, check=check_rc, **kw)


def real_oom(tmp: Path) -> None:
    print("4. a real out-of-memory, retried by the engine with half the micro-batch")
    (tmp / "oom.toml").write_text('[defaults]\ntask = "gpu_check:hog"\nepochs = 1\nbatch_size = 64\n'
                                  'seeds = [0]\n[experiments.oom]\n[engine]\nruns_per_gpu = 1\n')
    root = tmp / "oom-root"
    torch.cuda.empty_cache()  # this process's cached blocks would otherwise count against the run
    free, total = torch.cuda.mem_get_info()
    print(f"  free before the run: {free / 2**30:.1f} of {total / 2**30:.1f} GiB")
    out = gridrun("run", str(tmp / "oom.toml"), root=root, check_rc=False, timeout=600)
    from gridrun.runs.store import Store

    with Store(root) as store:
        run = store.list_runs()[0]
    check(run.status == "completed" and run.config["trainer"]["batch_size"] == 32
          and any(a.get("kind") == "oom" for a in run.adjustments),
          f"ended {run.status} with batch_size {run.config['trainer']['batch_size']}, accumulate "
          f"{run.config['trainer']['accumulate']} ({len(run.adjustments)} adjustment(s))")
    gridrun("engine", "stop", root=root, check_rc=False)
    if run.status != "completed":
        print(out.stdout[-1500:], out.stderr[-1500:])
        print("  run error:", (run.error or "")[-3000:])
        print("  adjustments:", run.adjustments)
        log = root / "engine.log"
        print("  engine.log tail:", log.read_text()[-3000:] if log.exists() else "(none)")


SLOW = """[defaults]
task = "helper_tasks:slow_spirals"
step_sleep = 0.02
epochs = 30
train_size = 2048
seeds = [0, 1]
[experiments.two]
[engine]
runs_per_gpu = 2
"""


def telemetry_and_tmux(tmp: Path, tmux: bool) -> None:
    from gridrun.engine.telemetry import Telemetry
    from gridrun.runs.store import Store

    print("5. telemetry names the run's process on its GPU; 6. the interface's GPU panel")
    (tmp / "two.toml").write_text(SLOW)
    root = tmp / "two-root"
    env_tests = str(HERE.parent / "tests")
    os.environ["PYTHONPATH"] = os.pathsep.join([env_tests, os.environ.get("PYTHONPATH", "")])
    gridrun("queue", str(tmp / "two.toml"), root=root)
    gridrun("engine", "start", root=root)
    try:
        telemetry, seen = Telemetry(), {}
        deadline = time.time() + 120
        while time.time() < deadline and len(seen) < 2:
            time.sleep(2)
            with Store(root) as store:
                pids = {r.pid: r.slot for r in store.list_runs() if r.status == "running" and r.pid}
            gpu_of = telemetry.processes()
            seen = {pid: (slot, gpu_of.get(pid)) for pid, slot in pids.items() if pid in gpu_of}
        check(len(seen) == 2 and all(str(gpu) in str(slot) for slot, gpu in seen.values()),
              f"NVML sees the runs' processes on their slots' GPUs: {seen}")
        if tmux and shutil.which("tmux"):
            sock = tmp / "tmux.sock"
            t = ["tmux", "-f", "/dev/null", "-S", str(sock)]
            subprocess.run([*t, "new-session", "-d", "-s", "g", "-x", "140", "-y", "40",
                            f"{sys.executable} -m gridrun --root {root}"], check=True)
            time.sleep(8)
            screen = subprocess.run([*t, "capture-pane", "-p", "-t", "g"], capture_output=True,
                                    text=True).stdout
            print("  tmux capture of `gridrun` while two runs train:\n" + screen)
            subprocess.run([*t, "kill-server"], check=False)
        elif tmux:
            print("  (no tmux here: no capture)")
    finally:
        with Store(root) as store:
            ids = [r.id for r in store.list_runs() if r.status in ("queued", "running")]
        if ids:
            gridrun("cancel", *ids, root=root, check_rc=False)
        gridrun("engine", "stop", root=root, check_rc=False)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-tmux", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA on this machine (torch {torch.__version__}, CUDA build "
              f"{torch.version.cuda or 'none'}): nothing to check here; run it where a GPU is")
        return 0
    print(f"gpu_check on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}")
    sys.path.insert(0, str(HERE.parent / "tests"))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for part in (repeat_and_resume, lambda t: step_times(), diagnostics_on_cuda, real_oom,
                     lambda t: telemetry_and_tmux(t, not args.skip_tmux)):
            try:
                part(tmp)
            except Exception as exc:  # one broken part must not hide the others' results
                check(False, f"{getattr(part, '__name__', 'part')} raised {type(exc).__name__}: {exc}")
    print("gpu_check: " + ("all checks passed" if not FAILED else f"{len(FAILED)} failed"))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
