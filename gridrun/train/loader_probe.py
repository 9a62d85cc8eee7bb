"""`num_workers = "auto"`: the run's own loader, timed, picks its settings (what an
input-bound run should change, with the numbers, is remedies.py's).

The probe builds the real training loader (the task's dataset and
augmentation, its collate_fn, the per-batch streams, the copy to the device)
for candidate settings: 0 workers, then 1, 2, 4, ... up to the cores the run
may use (on the CPU one core is left to the model), then, for the best count,
twice the prefetch_factor and, on CUDA with pin_memory "auto", pinned memory.
Each trial is timed past its first round of batches (worker start-up and the
prefetch burst are left out) and the workers' memory is read as USS and PSS (what they
hold alone, and their share of what they share), never RSS, which counts every
page the workers share with the parent once per worker. The fastest setting
whose workers stay within MEMORY_SHARE of the available memory wins; a setting
within TIE of the fastest with fewer workers (or less prefetch) wins over it.

Its cost is bounded: the 0-worker trial (FIRST_S) sizes the run (its samples
at that pace), and the whole probe gets FRACTION of that, at least FLOOR_S and
at most CAP_S; a run whose data takes less than that to load gets 0 workers
without more trials. It can overrun by one batch and a worker shut-down, never by more
than its budget again (at least HANG_S), whatever the dataset does: the 0-worker trial
runs in a forked process, killed if it hangs (on CUDA, timed without the copy to the
device, which it cannot make); trials with workers wait for a batch until then, and kill
the workers that hang. A probe that timed out says so and chooses 0 workers.

It never changes results: num_workers, prefetch_factor and pin_memory never do
(data.py), the probe reads batches of an epoch no run trains (PROBE_EPOCH),
and every RNG state is saved before and put back after, so the run draws the
same numbers in the same order as a run with its settings fixed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from gridrun.train.data import count_samples, to_device, train_loader
from gridrun.train.seeding import rng_state, set_rng_state

PROBE_EPOCH = -2  # data.VALIDATION is -1; training epochs count from 0
FRACTION, FLOOR_S, CAP_S = 0.05, 1.0, 5.0
FIRST_S = 0.25  # the 0-worker trial
MIN_TRIAL_S = 0.15  # less time than this left: no more trials
MEMORY_SHARE = 0.25  # of the memory available when the probe starts, for all workers together
TIE = 0.95
HANG_S = 2.0  # at least this long past the budget, a batch that has not come is a hang


@dataclass
class Trial:
    num_workers: int
    prefetch_factor: int
    pin_memory: bool
    samples_per_s: float | None = None  # past the warm-up batches
    first_batch_s: float | None = None  # from iter() to the first batch: start-up
    batches: int = 0
    seconds: float = 0.0  # the whole trial, start-up and shut-down included
    workers_uss_bytes: int | None = None  # all workers together (None: not measured)
    workers_pss_bytes: int | None = None
    error: str | None = None
    timed_out: bool = False  # no batch by the probe's deadline: stopped there

    @property
    def settings(self) -> dict[str, Any]:
        return {"num_workers": self.num_workers, "prefetch_factor": self.prefetch_factor,
                "pin_memory": self.pin_memory}


def cores() -> int:
    """The cores this process may run on (its affinity; a SLURM or cgroup limit shows there)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_counts(n_cores: int, device_type: str) -> list[int]:
    """1, 2, 4, ... up to the cores (one fewer on the CPU, where the model needs one)."""
    top = n_cores if device_type == "cuda" else max(1, n_cores - 1)
    counts = [1]
    while counts[-1] * 2 <= top:
        counts.append(counts[-1] * 2)
    return counts if counts[-1] == top else [*counts, top]


def budget_for(estimate_s: float | None) -> float:
    """The probe's time: FRACTION of the run's estimated data time, within [FLOOR_S, CAP_S]."""
    if estimate_s is None:
        return FLOOR_S
    return min(CAP_S, max(FLOOR_S, FRACTION * estimate_s))


def _children() -> set[int]:
    import psutil

    try:
        return {p.pid for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return set()


def workers_memory(pids: set[int]) -> tuple[int | None, int | None]:
    """(USS, PSS) summed over `pids`; None where it cannot be read."""
    import psutil

    uss = pss = 0
    seen = False
    for pid in pids:
        try:
            info = psutil.Process(pid).memory_full_info()
        except psutil.Error:
            continue
        seen = True
        uss += info.uss
        pss += getattr(info, "pss", 0)
    return (uss, pss or None) if seen else (None, None)


def die_with_parent(inner: Callable[[int], None] | None = None, worker_id: int = 0) -> None:
    """Killed when the process that made this one ends (Linux): a probe's process or worker
    blocked for good never outlives a probe killed outright; then `inner(worker_id)`."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if inner is not None:  # the loader's own worker_init_fn
        inner(worker_id)


def _timed_out(trial: Trial, waited: float) -> Trial:
    where = "in DataLoader workers" if trial.num_workers else "in the training process"
    trial.timed_out, trial.error = True, (f"gave no batch within {waited:.1f} s: timed out (the "
                                          f"dataset hangs {where}, or a batch takes longer)")
    return trial


def _abandon(it: Any) -> None:
    """Kill a loader's workers, out of torch's watch first (its shut-down would wait 5 s for
    each, then send SIGTERM, which a worker that hangs may not answer)."""
    from torch.utils.data._utils.signal_handling import _remove_worker_pids

    if getattr(it, "_worker_pids_set", False):
        _remove_worker_pids(id(it))  # else torch's SIGCHLD handler raises: "killed by signal"
        it._worker_pids_set = False
    for w in getattr(it, "_workers", ()):
        w.kill()
        w.join(1.0)


def run_trial(dataset: Any, cfg: Mapping[str, Any], settings: Mapping[str, Any], *, seed: int,
              collate_fn: Any, device: torch.device, count: Callable[[Any], int],
              seconds: float, deadline: float | None = None) -> Trial:
    """Time the training loader with `settings` for about `seconds`; with workers, waiting
    for a batch only until `deadline` (a perf_counter time)."""
    trial = Trial(**settings)
    clock = time.perf_counter
    loader = train_loader(dataset, {**cfg, **settings, "persistent_workers": False}, seed=seed,
                          collate_fn=collate_fn, cuda=device.type == "cuda")
    loader.sampler.set_epoch(PROBE_EPOCH)
    if trial.num_workers:
        loader.worker_init_fn = functools.partial(die_with_parent, loader.worker_init_fn)
    before = _children()
    # start-up, then the burst of batches prefetched meanwhile: left out of the pace
    warm = max(1, trial.num_workers * trial.prefetch_factor)
    started = clock()
    mark = it = None
    measured = total = 0
    if trial.num_workers and deadline is not None:  # DataLoader's wait for a batch
        loader.timeout = max(0.01, deadline - clock())
    try:
        for batch in (it := iter(loader)):
            to_device(batch, device, non_blocking=trial.pin_memory)
            n = count(batch)
            total += n
            trial.batches += 1
            now = clock()
            if trial.batches == 1:
                trial.first_batch_s = now - started
            if trial.batches == warm:
                mark = now
            elif trial.batches > warm:
                measured += n
            last = now - started >= seconds or trial.batches == len(loader)
            if last and trial.num_workers:  # read while the workers live (idle, holding it all)
                trial.workers_uss_bytes, trial.workers_pss_bytes = workers_memory(
                    _children() - before)
            if last:
                break
            if loader.timeout:  # the next batch's wait: only until the deadline
                it._timeout = max(0.01, deadline - clock())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        end = clock()
        if mark is not None and measured and end > mark:
            trial.samples_per_s = measured / (end - mark)
        elif total and end > started:
            trial.samples_per_s = total / (end - started)
    except Exception as e:  # the run itself will meet it again, with its traceback
        if loader.timeout and clock() >= deadline - 0.1:  # the wait for a batch ran out
            _timed_out(trial, clock() - started)
        else:
            trial.error = f"{type(e).__name__}: {e}"
    finally:
        if trial.timed_out and it is not None:
            _abandon(it)
        del it  # shuts the workers down
    trial.seconds = clock() - started
    return trial


def forked_trial(dataset: Any, cfg: Mapping[str, Any], settings: Mapping[str, Any], *,
                 deadline: float, device: torch.device, **kwargs: Any) -> Trial:
    """`run_trial` with 0 workers in a forked process, abandoned (killed, with what it
    started) if it has not answered by `deadline`: a dataset that hangs in the training
    process hangs there. A forked process cannot use CUDA: there, timed on the CPU."""
    cuda = device.type == "cuda"
    here, on = ({**settings, "pin_memory": False}, torch.device("cpu")) if cuda else (settings, device)
    started = time.perf_counter()
    context = multiprocessing.get_context("fork")  # a fork: nothing is pickled
    reader, writer = context.Pipe(duplex=False)
    proc = context.Process(name="gridrun-probe", target=lambda: (die_with_parent(), writer.send(
        asdict(run_trial(dataset, cfg, here, device=on, **kwargs)))))
    proc.start()
    writer.close()
    try:
        if reader.poll(max(0.0, deadline - time.perf_counter())):
            return Trial(**{**reader.recv(), "pin_memory": settings["pin_memory"]})
        return _timed_out(Trial(**settings, seconds=time.perf_counter() - started),
                          time.perf_counter() - started)
    except EOFError:
        return Trial(**settings, error="the trial's process ended without a result")
    finally:
        proc.kill()  # if it hung: a trial with 0 workers starts no process of its own
        proc.join()
        reader.close()


def pick(trials: list[Trial], memory_budget: int) -> Trial | None:
    """The fastest trial with workers within the memory budget (a near tie goes to
    fewer workers), unless loading in the training process is faster still."""
    fine = [t for t in trials if t.samples_per_s and not t.error
            and (t.workers_uss_bytes or 0) <= memory_budget]
    zero = next((t for t in fine if t.num_workers == 0), None)
    workers = [t for t in fine if t.num_workers]
    if workers:
        best = max(t.samples_per_s or 0.0 for t in workers)
        if zero is None or best >= TIE * (zero.samples_per_s or 0.0):
            return min((t for t in workers if (t.samples_per_s or 0.0) >= TIE * best),
                       key=lambda t: (t.num_workers, t.prefetch_factor, t.pin_memory))
    return zero


def probe(dataset: Any, cfg: Mapping[str, Any], *, seed: int, collate_fn: Any,
          device: torch.device, total_samples: int, count: Callable[[Any], int] = count_samples,
          budget_s: float | None = None) -> dict[str, Any]:
    """Measure loader settings for `dataset` and choose one; the record for the summary.

    `budget_s` replaces the run-sized budget (`gridrun tune-loader --seconds`)."""
    import psutil

    clock = time.perf_counter
    started = clock()
    n_cores = cores()
    counts = worker_counts(n_cores, device.type)
    memory_budget = int(MEMORY_SHARE * psutil.virtual_memory().available)
    pin = cfg["pin_memory"] if cfg["pin_memory"] != "auto" else device.type == "cuda"
    prefetch = cfg["prefetch_factor"]
    run: dict[str, Any] = dict(seed=seed, collate_fn=collate_fn, device=device, count=count)
    saved = rng_state()
    trials: list[Trial] = []

    def deadline(budget: float) -> float:  # no batch by then: the dataset hangs
        return started + budget + max(HANG_S, budget)
    try:
        trials.append(first := forked_trial(
            dataset, cfg, dict(num_workers=0, prefetch_factor=prefetch, pin_memory=pin),
            seconds=min(FIRST_S, budget_s or FIRST_S),
            deadline=deadline(CAP_S if budget_s is None else budget_s), **run))
        estimate = (total_samples / first.samples_per_s) if first.samples_per_s else None
        budget = budget_s if budget_s is not None else budget_for(estimate)
        if first.error:
            reason = "the loader failed with 0 workers: nothing else was tried"
        elif budget_s is None and estimate is not None and estimate <= budget:
            reason = (f"the run's data loads in {estimate:.1f} s with no workers: probing "
                      "could not win back its cost")
        else:
            reason = "the fastest within the memory budget"
            variants = 1 + (device.type == "cuda" and cfg["pin_memory"] == "auto")
            for i, workers in enumerate(counts):
                left = budget - (clock() - started)
                if left < MIN_TRIAL_S:
                    reason += " (the time ran out before every count was tried)"
                    break
                trial = run_trial(dataset, cfg, dict(num_workers=workers, prefetch_factor=prefetch,
                                                     pin_memory=pin),
                                  seconds=left / (len(counts) - i + variants),
                                  deadline=deadline(budget), **run)
                trials.append(trial)
                before = trials[-2].samples_per_s or 0.0 if i else 0.0
                if trial.error or (trial.samples_per_s or 0.0) < TIE * before:
                    break  # more workers stopped helping (or failed): larger counts will not help
            best = pick(trials, memory_budget)
            extra = []
            if best is not None and best.num_workers:
                extra.append(dict(best.settings, prefetch_factor=2 * prefetch))
                if variants > 1:
                    extra.append(dict(best.settings, pin_memory=not best.pin_memory))
            for i, settings in enumerate(extra):
                left = budget - (clock() - started)
                if left < MIN_TRIAL_S:
                    break
                trials.append(run_trial(dataset, cfg, settings, seconds=left / (len(extra) - i),
                                        deadline=deadline(budget), **run))
    finally:
        set_rng_state(saved)
    hung = next((t for t in trials if t.timed_out), None)
    chosen = trials[0] if hung else pick(trials, memory_budget) or trials[0]
    if hung:  # the safe choice: 0 workers
        reason = (f"with {hung.num_workers} worker{'s' * (hung.num_workers != 1)} the loader "
                  f"{hung.error}; probing stopped at its budget and chose 0 workers")
    elif chosen.num_workers == 0 and len(trials) > 1:
        reason = ("no setting with workers loaded as fast as the training process itself (handing "
                  "batches between processes cost more than making them)")
    return {"num_workers": "auto", "chosen": chosen.settings, "samples_per_s": chosen.samples_per_s,
            "reason": reason, "timed_out": hung is not None, "trials": [asdict(t) for t in trials],
            "cores": n_cores, "worker_counts": counts, "estimate_s": estimate, "budget_s": budget,
            "spent_s": clock() - started, "memory_budget_bytes": memory_budget}


def settle(cfg: Mapping[str, Any], task: Any, seed: int, device: torch.device, total_steps: int,
           summary: dict[str, Any], warn: Callable[[str], None] | None = None) -> Mapping[str, Any]:
    """The trainer keys the run's loader uses: `cfg` itself, or with num_workers = "auto"
    the measured choice (recorded in the summary's environment, as `loader`). A probe that
    timed out says so in one line (`warn`; by default printed)."""
    if cfg["num_workers"] != "auto":
        return cfg
    record = probe(task.train_data, cfg, seed=seed, collate_fn=task.collate_fn, device=device,
                   total_samples=total_steps * cfg["batch_size"] * cfg["accumulate"],
                   count=task.count_samples or count_samples)
    if isinstance(summary.get("environment"), dict):
        summary["environment"]["loader"] = record
    if record["timed_out"]:  # the trainer's `warn` also keeps it with the run's warnings
        (warn or functools.partial(print, "warning:", flush=True))(
            f'num_workers = "auto": {record["reason"]}')
    return {**cfg, **record["chosen"]}


def tune(run: Any, seconds: float) -> dict[str, Any]:
    """`gridrun tune-loader`: the probe for one run of a file, outside training (its task
    built as the run builds it), with `seconds` to spend."""
    from gridrun.tasks import resolve
    from gridrun.train import environment
    from gridrun.train.seeding import seed_everything

    device = environment.pick_device()
    seed_everything(run.seed)
    task = resolve(run.task)(**run.task_args)
    cfg = run.trainer
    steps = len(task.train_data) // cfg["batch_size"] // cfg["accumulate"] * cfg["epochs"]
    if cfg["max_steps"]:
        steps = min(steps, cfg["max_steps"])
    record = probe(task.train_data, cfg, seed=run.seed, collate_fn=task.collate_fn, device=device,
                   total_samples=steps * cfg["batch_size"] * cfg["accumulate"],
                   count=task.count_samples or count_samples, budget_s=seconds)
    return {**record, "device": str(device), "train_samples": len(task.train_data)}
