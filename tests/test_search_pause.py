"""A search's trial paused at a rung and promoted goes on from its own checkpoint:
its numbers are those of a straight run of the same length (same weights, same
later metrics), and the schedule is the full budget's from the first step."""

from __future__ import annotations

from pathlib import Path

from gridrun.runs import layout, records, runlog, states
from gridrun.spec import TRAINER_KEYS, RunSpec, write_run_config
from gridrun.train.loop.trainer import train

TIMING = records.TIMING


def trial(tmp_path: Path, name: str, pause_at: int | None) -> tuple[RunSpec, Path]:
    cfg = {k: key.default for k, key in TRAINER_KEYS.items()}
    cfg.update(epochs=6, batch_size=64, lr=3e-3, log_every=4, warmup=0.1, threads=1)
    run = RunSpec(id=name, experiment="search", variant="t0", seed=1, task="spirals",
                  trainer=cfg, task_args={"train_size": 512, "val_size": 128}, axes={},
                  trial=0, search={"id": "s", "scheduler": "asha"}, pause_at=pause_at)
    run_dir = layout.make_private_dir(tmp_path / name)
    write_run_config(run_dir / layout.CONFIG, run)
    return run, run_dir


def metrics(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING}
            for r in runlog.read_all(run_dir / layout.METRICS)]


def test_a_trial_paused_at_rungs_then_promoted_equals_a_straight_run(tmp_path):
    straight, straight_dir = trial(tmp_path, "straight", None)
    want = train(straight, straight_dir, log=lambda s: None)
    assert want["status"] == states.COMPLETED

    run, run_dir = trial(tmp_path, "paused", 2)
    first = train(run, run_dir, log=lambda s: None)
    assert first["status"] == states.WAITING and first["epoch"] == 2
    assert set(first["final"]) == set(want["final"])  # the rung's evaluation is in the summary
    again = train(run, run_dir, log=lambda s: None)  # resumed where it waits: it waits still
    assert again["status"] == states.WAITING and again["epoch"] == 2
    second = train(run.paused_at(4), run_dir, log=lambda s: None)
    assert second["status"] == states.WAITING and second["epoch"] == 4
    last = train(run.paused_at(None), run_dir, log=lambda s: None)
    assert last["status"] == states.COMPLETED
    assert last["weights_sha256"] == want["weights_sha256"]
    assert last["final"] == want["final"]
    assert metrics(run_dir) == metrics(straight_dir)


def test_pause_fields_stay_out_of_ids_and_configs_when_unset():
    run = RunSpec(id="x", experiment="e", variant="", seed=0, task="spirals", trainer={},
                  task_args={}, axes={})
    d = run.to_dict()
    assert not {"trial", "search", "pause_at"} & set(d)
    back = RunSpec.from_dict({**d, "trial": 3, "search": {"id": "s"}, "pause_at": 2})
    assert (back.trial, back.search, back.pause_at) == (3, {"id": "s"}, 2)
    assert RunSpec.from_dict(back.to_dict()) == back
