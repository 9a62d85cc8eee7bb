"""Runs packed on a GPU by measured memory (`[engine] runs_per_gpu = "auto"`),
through the real engine and its CLI, against one run at a time.

    python benchmarks/gpu_pack.py [--quick] [--runs 12] [--epochs 40] [--gpu 0]

1. One queue of N small runs of ONE shape (`spirals`, N seeds, threads = 1),
   run twice, each time in its own temporary runs root and GRIDRUN_LEDGER
   folder, queued with
   `gridrun queue`, run by `gridrun engine start`, followed by polling
   `gridrun ls --json`, ended by `gridrun engine stop`: once with
   `runs_per_gpu = 1` (alone), once with `"auto"` (packed: the first run of the
   shape alone, then the others by its measured need + 10%).
   Figures for each: runs per hour (completed runs over the store's first
   started_at to last ended_at), the most runs at once, mean GPU utilisation
   and peak GPU memory used (NVML, sampled every 0.5 s while the queue runs),
   runs ended `oom`; then the ratio auto / 1 of runs per hour.
   Checks: ratio >= 3x, 0 OOM, one run at a time under 1 and more under
   "auto", and every run's `weights_sha256` (its summary.json) equal in both
   queues, run id by run id.
2. Another process (this script's child) holding --hog of the GPU's memory:
   with `foreign = "avoid"` (the default) nothing starts within --wait s (the
   runs stay queued; `gridrun engine status` names the GPU); with
   `foreign = "share"` the runs start beside it and complete, packed into the
   rest (the most at once is printed). The child is killed whatever happens.

How to read it: the ratio is what packing buys on this card for runs this
small (each alone leaves the GPU mostly idle: compare the utilisation); equal
hashes say that sharing a GPU never changed a run's bits; "adjusted" counts
runs the engine retried (an OOM, or a run that outgrew its budget).

Without CUDA it is a dry run of both steps on a stand-in GPU: a fake NVML
(benchmarks/fake_nvml.py, copied as pynvml.py first on every gridrun command's
PYTHONPATH: one GPU of --fake-gib GiB whose processes are the live runs, each
using its resident memory, and step 2's other process, a `sleep` said to hold
--hog of it), `gpus = "auto"` as on a GPU machine, and GRIDRUN_FAKE_GPUS=1 (a
run given the GPU trains on the CPU, where its GPU memory is its resident
memory). Checks: hashes equal, 0 OOM, one at a time under 1 and more than one
at once under "auto" (the ratio is printed, not checked: on a few cores it
means little), and step 2 as above; it says that the GPU figures were not
taken. Exit 1 on a FAIL. Every engine it started is stopped and its temporary
folder removed (--keep keeps it).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

EXPERIMENT = "pack"
FINISHED = {"completed", "failed", "diverged", "oom", "cancelled", "stopped"}
FAILED: list[str] = []
HOG = """\
import ctypes, sys, time, torch
ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: dies with the script
free, total = torch.cuda.mem_get_info()
x = torch.empty(min(int(total * float(sys.argv[1])), free - (256 << 20)),
                dtype=torch.uint8, device="cuda")
x.fill_(1); torch.cuda.synchronize()
open(sys.argv[2], "w").write(str(x.numel())); time.sleep(float(sys.argv[3]))
"""


def check(ok: bool, what: str) -> bool:
    print(f"  {'PASS' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        FAILED.append(what)
    return ok


class Nvml:
    """GPU utilisation and memory used, sampled every 0.5 s in a thread; a no-op
    (`error` says why) without pynvml or a driver. `pynvml`: the stand-in's module."""

    def __init__(self, index: int, pynvml: Any = None):
        self.samples: list[tuple[float, float | None, int]] = []  # (t, util % or None, used)
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            if pynvml is None:
                import pynvml
            pynvml.nvmlInit()
            self.nv, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
            self.total = pynvml.nvmlDeviceGetMemoryInfo(self.handle).total
        except Exception as e:  # no pynvml, no driver, no such GPU
            self.nv, self.error = None, f"NVML not available ({type(e).__name__}: {e})"

    def start(self) -> None:
        if self.nv is None:
            return
        self.samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            util = None
            with contextlib.suppress(Exception):  # the stand-in does not say
                util = float(self.nv.nvmlDeviceGetUtilizationRates(self.handle).gpu)
            with contextlib.suppress(Exception):
                used = self.nv.nvmlDeviceGetMemoryInfo(self.handle).used
                self.samples.append((time.time(), util, int(used)))
            self._stop.wait(0.5)

    def stop(self) -> list[tuple[float, float | None, int]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        return list(self.samples)


class Bench:
    def __init__(self, args: argparse.Namespace, gpu: bool):
        self.args, self.gpu = args, gpu
        self.tmp = Path(tempfile.mkdtemp(prefix="gpu-pack-"))
        self.started: list[Path] = []  # roots whose engine was started
        self.hog: subprocess.Popen | None = None
        self.nvml = Nvml(args.gpu) if gpu else Nvml(0, self.stand_in())
        self.t0 = time.monotonic()
        self.status = ""  # `engine status` while runs were packed (wait)

    def stand_in(self) -> Any:
        """The dry run's GPU: fake_nvml.py as pynvml.py in tmp/nvml, which every gridrun
        command finds first (env); the fake lists the runs under tmp and tmp/hog's process."""
        (self.tmp / "nvml").mkdir()
        shutil.copy(Path(__file__).with_name("fake_nvml.py"), self.tmp / "nvml" / "pynvml.py")
        os.environ.update(GRIDRUN_BENCH_FAKE_DIR=str(self.tmp),
                          GRIDRUN_BENCH_FAKE_GIB=str(self.args.fake_gib))
        spec = importlib.util.spec_from_file_location("fake_pynvml", self.tmp / "nvml" / "pynvml.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def env(self, name: str) -> dict[str, str]:
        drop = {"GRIDRUN_ROOT"} | (set() if self.gpu else {"CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS"})
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env["GRIDRUN_LEDGER"] = str(self.tmp / f"{name}-ledger")  # made 1777 by the engine
        if not self.gpu:  # the stand-in GPU: a fake NVML, runs on the CPU
            env["PYTHONPATH"] = os.pathsep.join(
                [str(self.tmp / "nvml"), *filter(None, [env.get("PYTHONPATH")])])
            env["GRIDRUN_FAKE_GPUS"] = "1"
        return env

    def gridrun(self, name: str, *argv: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gridrun", *argv, "--root",
                               str(self.tmp / name)], env=self.env(name), capture_output=True,
                              text=True, timeout=timeout)

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f} s] {text}", flush=True)

    # ---- one queue ------------------------------------------------------------------

    def task(self) -> dict[str, int]:
        return dict(hidden=64, depth=3, train_size=4096, val_size=512)

    def toml(self, runs: int, runs_per_gpu: object, foreign: str) -> str:
        a = self.args
        engine = (f"gpus = {f'[{a.gpu}]' if self.gpu else json.dumps('auto')}\n"
                  f'runs_per_gpu = {json.dumps(runs_per_gpu)}\nforeign = "{foreign}"\n')
        keys = "".join(f"{k} = {v}\n" for k, v in self.task().items())
        return (f'[experiments.{EXPERIMENT}]\ntask = "spirals"\n{keys}epochs = {a.epochs}\n'
                f"batch_size = 64\nthreads = 1\nseeds = {runs}\n\n[engine]\n{engine}")

    def begin(self, name: str, runs: int, runs_per_gpu: object, foreign: str = "avoid") -> None:
        """Queue the file in root `name` and start its engine."""
        file = self.tmp / f"{name}.toml"
        file.write_text(self.toml(runs, runs_per_gpu, foreign))
        for argv in (("queue", str(file)), ("engine", "start")):
            done = self.gridrun(name, *argv)
            if argv[0] == "engine":
                self.started.append(self.tmp / name)
            if done.returncode:
                raise RuntimeError(f"gridrun {' '.join(argv)} exited {done.returncode}:\n"
                                   f"{done.stdout}{done.stderr}{self.log_tail(name)}")
        self.say(f"{name}: {runs} runs queued, runs_per_gpu = {json.dumps(runs_per_gpu)}"
                 + f", foreign = {foreign!r}; engine started")

    def log_tail(self, name: str) -> str:
        log = self.tmp / name / "engine.log"
        return "".join(log.read_text(errors="replace").splitlines(True)[-15:]) if log.exists() else ""

    def ls(self, name: str) -> list[dict]:
        done = self.gridrun(name, "ls", "--json", timeout=60)
        if done.returncode:
            raise RuntimeError(f"gridrun ls --json exited {done.returncode}: {done.stderr}")
        return json.loads(done.stdout)

    def wait(self, name: str, timeout: float) -> list[dict]:
        """Poll `gridrun ls --json` until every run ended (or `timeout` s); keep
        `gridrun engine status` as it was the first time 2 runs were running."""
        end, self.status = time.monotonic() + timeout, ""
        while True:
            runs = self.ls(name)
            if not self.status and sum(r["status"] == "running" for r in runs) >= 2:
                self.status = self.gridrun(name, "engine", "status").stdout
            if all(r["status"] in FINISHED for r in runs) or time.monotonic() > end:
                return runs
            time.sleep(0.5)

    def stop(self, root: Path) -> None:
        """`gridrun engine stop` (then --force), then any run still running killed."""
        name = root.name
        for force in ((), ("--force",)):
            try:
                if self.gridrun(name, "engine", "stop", *force, timeout=120).returncode == 0:
                    break
            except subprocess.TimeoutExpired:
                pass
        if root in self.started:
            self.started.remove(root)
        try:
            for r in self.ls(name):  # after a forced stop a run may still live: ours, by pid
                if r["status"] == "running" and r.get("pid"):
                    with contextlib.suppress(OSError):
                        os.kill(r["pid"], signal.SIGKILL)
        except Exception:
            pass

    def queue(self, name: str, runs: int, runs_per_gpu: object, foreign: str = "avoid") -> dict:
        """One queue from start to end: its figures."""
        self.begin(name, runs, runs_per_gpu, foreign)
        if self.nvml:
            self.nvml.start()
        rows = self.wait(name, self.args.timeout)
        samples = self.nvml.stop() if self.nvml else []
        self.stop(self.tmp / name)
        return figures(self.tmp / name, rows, samples) | {"status": self.status}

    # ---- the other process ------------------------------------------------------------

    def start_hog(self) -> int:
        if not self.gpu:  # the stand-in's other process: a `sleep` the fake says holds --hog
            self.hog = subprocess.Popen(["sleep", "1800"])
            held = int(self.nvml.total * self.args.hog)
            (self.tmp / "hog").write_text(f"{self.hog.pid} {held}")
            return held
        ready = self.tmp / "hog.ready"
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(self.args.gpu),
                   CUDA_DEVICE_ORDER="PCI_BUS_ID")
        self.hog = subprocess.Popen([sys.executable, "-c", HOG, str(self.args.hog), str(ready),
                                     "1800"], env=env)
        end = time.monotonic() + 120
        while not ready.exists():
            if self.hog.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"the memory-holding process did not start (exit {self.hog.poll()})")
            time.sleep(0.2)
        return int(ready.read_text())

    def kill_hog(self) -> None:
        if self.hog is not None and self.hog.poll() is None:
            self.hog.kill()
            self.hog.wait(30)
        self.hog = None

    def cleanup(self) -> None:
        for root in list(self.started):
            self.stop(root)
        self.kill_hog()
        if self.args.keep:
            print(f"kept: {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def figures(root: Path, rows: list[dict], samples: list[tuple[float, float, int]]) -> dict:
    ended = [r for r in rows if r["started_at"] and r["ended_at"]]
    first = min((r["started_at"] for r in ended), default=0.0)
    last = max((r["ended_at"] for r in ended), default=0.0)
    done = [r for r in rows if r["status"] == "completed"]
    wall = last - first
    events = sorted([(r["started_at"], 1) for r in ended] + [(r["ended_at"], -1) for r in ended],
                    key=lambda e: (e[0], e[1]))
    at_once = most = 0
    for _, step in events:
        at_once += step
        most = max(most, at_once)
    hashes = {}
    for r in rows:
        summary = root / r["experiment"] / r["id"] / "summary.json"
        hashes[r["id"]] = (json.loads(summary.read_text()).get("weights_sha256")
                           if summary.exists() else None)
    util = [s for s in samples if s[1] is not None]  # the stand-in has none
    inside = [s for s in util if first <= s[0] <= last] or util
    return {"runs": len(rows), "completed": len(done), "wall": wall,
            "per_hour": len(done) / wall * 3600 if wall > 0 else 0.0, "at_once": most,
            "oom": sum(r["status"] == "oom" for r in rows),
            "not_completed": {r["id"]: r["status"] for r in rows if r["status"] != "completed"},
            "retried": sum(bool(r.get("adjustments")) for r in rows),
            "run_s": sum(r["ended_at"] - r["started_at"] for r in ended) / max(1, len(ended)),
            "util": sum(s[1] for s in inside) / len(inside) if inside else None,
            "peak": max((s[2] for s in samples), default=None), "hashes": hashes}


def show(label: str, f: dict) -> None:
    gpu = ("" if f["util"] is None else f", GPU {f['util']:.0f}% busy on average") + (
        "" if f["peak"] is None else f", peak {f['peak'] / 2**30:.2f} GiB used")
    print(f"  {label:<22} {f['completed']}/{f['runs']} completed in {f['wall']:.1f} s: "
          f"{f['per_hour']:,.0f} runs/h; {f['at_once']} at once at most, "
          f"{f['run_s']:.1f} s a run; {f['oom']} oom, {f['retried']} adjusted{gpu}", flush=True)
    if f["not_completed"]:
        print(f"    not completed: {f['not_completed']}")
    if f["status"] and label != "runs_per_gpu = 1":
        print("    `gridrun engine status` with 2 or more running:\n"
              + "".join(f"      {line}\n" for line in f["status"].splitlines()), end="")


def compare(bench: Bench, runs: int) -> None:
    print(f"\n1. {runs} runs of one shape, one at a time vs packed")
    alone = bench.queue("alone", runs, 1)
    show("runs_per_gpu = 1", alone)
    packed = bench.queue("packed", runs, "auto")
    show('runs_per_gpu = "auto"', packed)
    ratio = packed["per_hour"] / alone["per_hour"] if alone["per_hour"] else 0.0
    print(f"  ratio auto / 1: {ratio:.2f}x runs per hour")
    same = [i for i in alone["hashes"] if alone["hashes"][i] and
            alone["hashes"][i] == packed["hashes"].get(i)]
    if bench.gpu:
        check(ratio >= 3, f"packed queue >= 3x the runs per hour of one at a time ({ratio:.2f}x)")
    else:
        print("  (not checked on a stand-in GPU: these runs share the CPU's few cores)")
    check(alone["at_once"] == 1 < packed["at_once"], "one at a time under 1, more under "
          f'"auto" (most at once: {alone["at_once"]} and {packed["at_once"]})')
    check(alone["completed"] == packed["completed"] == runs,
          f"every run completed ({alone['completed']} and {packed['completed']} of {runs})")
    check(alone["oom"] + packed["oom"] == 0, f"0 OOM ({alone['oom']} + {packed['oom']})")
    check(len(same) == runs and set(alone["hashes"]) == set(packed["hashes"]),
          f"weights_sha256 identical run by run, packed vs alone ({len(same)} of {runs})")


def foreign(bench: Bench, runs: int) -> None:
    a = bench.args
    print(f"\n2. another process holding {a.hog:.0%} of GPU {a.gpu}'s memory")
    held = bench.start_hog()
    bench.say(f"the other process (pid {bench.hog.pid}) holds {held / 2**30:.1f} GiB")
    try:
        bench.begin("avoid", runs, "auto", "avoid")
        time.sleep(a.wait)
        rows = bench.ls("avoid")
        status = bench.gridrun("avoid", "engine", "status").stdout
        print("  engine status:\n" + "".join(f"    {line}\n" for line in status.splitlines()))
        bench.stop(bench.tmp / "avoid")
        started = [r["id"] for r in rows if r["started_at"] or r["status"] != "queued"]
        check(not started and len(rows) == runs,
              f'foreign = "avoid": nothing started within {a.wait:.0f} s '
              f"({len(rows) - len(started)} of {runs} still queued)")
        check(f"gpu{a.gpu}: taken" in status, f"`gridrun engine status` names gpu{a.gpu} as taken")
        shared = bench.queue("share", runs, "auto", "share")
        show('foreign = "share"', shared)
        print("    (its peak GPU memory includes the other process's)")
        check(shared["completed"] == runs and shared["oom"] == 0,
              f'foreign = "share": {shared["completed"]} of {runs} completed beside it, '
              f"{shared['oom']} oom, {shared['at_once']} at once at most")
    finally:
        bench.kill_hog()
        bench.say("the other process was killed")


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Runs packed on a GPU by measured memory vs one at a time, through "
        "the real engine (a dry run on a stand-in GPU without CUDA).")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter runs")
    parser.add_argument("--runs", type=int, help="runs in each queue (12; quick 8; no CUDA 6, 3)")
    parser.add_argument("--epochs", type=int, help="epochs a run (40; quick 20; no CUDA 20, 10)")
    parser.add_argument("--foreign-runs", type=int,
                        help="runs beside the other process (6; quick 4; no CUDA 4, 3)")
    parser.add_argument("--gpu", type=int, default=0, help="the GPU (NVML index; 0)")
    parser.add_argument("--hog", type=float, default=0.85,
                        help="share of the GPU's memory the other process holds (0.85)")
    parser.add_argument("--wait", type=float, help="seconds nothing may start (20; quick 12)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a queue may take")
    parser.add_argument("--keep", action="store_true", help="keep the temporary roots")
    parser.add_argument("--fake-gib", type=float, default=8.0,
                        help="the stand-in GPU's memory in GiB, without CUDA (8)")
    args = parser.parse_args()
    import torch

    gpu = torch.cuda.is_available()
    q = args.quick
    args.runs = args.runs or ((3 if q else 6) if not gpu else 8 if q else 12)
    args.epochs = args.epochs or ((10 if q else 20) if not gpu else 20 if q else 40)
    args.foreign_runs = args.foreign_runs or ((3 if q else 4) if not gpu else 4 if q else 6)
    args.wait = args.wait or (12.0 if q else 20.0)
    args.gpu = args.gpu if gpu else 0
    where = (f"{torch.cuda.get_device_name(args.gpu)} (GPU {args.gpu})" if gpu else
             f"no CUDA device: a dry run on a stand-in GPU of {args.fake_gib:g} GiB (a fake "
             "NVML; runs train on the CPU, their GPU memory is their resident memory)")
    bench = Bench(args, gpu)
    keys = " ".join(f"{k}={v}" for k, v in bench.task().items())
    print(f"{platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"torch {torch.__version__}, load {os.getloadavg()[0]:.1f}; {where}; spirals "
          f"{keys}, {args.epochs} epochs, batch 64, threads = 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below still runs
    try:
        if bench.nvml and bench.nvml.error:
            print(f"  {bench.nvml.error}: no utilisation or memory figures")
            bench.nvml = None
        compare(bench, args.runs)
        foreign(bench, args.foreign_runs)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        check(False, f"the benchmark could not go on: {e}")
    finally:
        bench.cleanup()
    if not gpu:
        print("\nGPU figures not taken: no CUDA device here (dry run on stand-in GPUs: a "
              "fake NVML, runs on the CPU)")
    print(f"\n{'FAIL: ' + '; '.join(FAILED) if FAILED else 'all checks passed'} "
          f"({time.monotonic() - bench.t0:.0f} s)")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
