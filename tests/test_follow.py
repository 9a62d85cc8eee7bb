"""`gridrun run`'s follower: a bar per running run that keeps loss, best and ETA at
80 columns, labels that keep every value, the queue's ETA, the plain lines of a
pipe; and the variant labels every view shortens the same way."""

from __future__ import annotations

import io
import os
import shutil
import sys
import time
from types import SimpleNamespace

import patience
import pytest
from rich.console import Console

from gridrun.commands.follow import Labels, RunLine, ended_line, plan, queue_eta, table
from gridrun.runs import progress, states
from gridrun.runs.records import start_line, train_line, val_line
from gridrun.spec.variants import Variants, forms, shorten


def example_runs():
    """The example file's 18 runs, as the follower sees them (id, experiment, variant, seed)."""
    runs = [SimpleNamespace(id=f"{i:010x}", experiment="width-lr", variant=f"hidden={h} lr={lr}",
                            seed=s)
            for i, (h, lr, s) in enumerate((h, lr, s) for h in (32, 128) for lr in ("0.003", "0.01")
                                           for s in range(3))]
    runs += [SimpleNamespace(id=f"b{i:09x}", experiment="tricks", variant=v, seed=s)
             for i, (v, s) in enumerate((v, s) for v in ("baseline", "no-warmup", "sgd")
                                        for s in range(2))]
    return runs


def lines_of(runs):
    return [RunLine(r.id, r.experiment, r.variant, r.seed, step=155, total=186, epoch=5, epochs=6,
                    loss=0.6050123, metric="accuracy", arrow="↑", best=0.5267, eta=65.0,
                    speed=12345.0) for r in runs]


def rendered(lines, width, labels) -> list[str]:
    console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    console.print(table(lines, width, labels))
    return console.file.getvalue().splitlines()


@pytest.mark.parametrize("width", [40, 60, 80, 100, 120, 200])
def test_every_run_is_one_line_that_fits(width):
    runs = example_runs()
    shown = rendered(lines_of(runs), width, Labels.of(runs))
    assert len(shown) == len(runs) and all(len(line) <= width for line in shown), shown
    assert all("loss 0.605" in line for line in shown)  # the most important after the run
    if width >= 60:
        assert all("best↑ 0.5267" in line or "best accuracy↑ 0.5267" in line for line in shown)
        assert all("eta 1:05" in line for line in shown)
    if width >= 80:
        assert all("155/186" in line and "━" in line for line in shown)  # steps and the bar
    if width >= 100:
        assert all("best accuracy↑" in line for line in shown)  # the metric by name
    if width >= 200:
        assert all(r.id in line for r, line in zip(runs, shown, strict=True))


@pytest.mark.parametrize("width", [60, 80])
def test_labels_tell_every_run_apart_and_keep_every_value(width):
    runs = example_runs()
    labels = Labels.of(runs)
    widths, _ = plan(width, lines_of(runs), labels)
    texts = [labels.text(line, widths["label"]) for line in lines_of(runs)]
    assert len(set(texts)) == len(runs), texts
    for r, text in zip(runs, texts, strict=True):
        for word in r.variant.split():
            assert word.partition("=")[2] in text  # the value, whatever the key became
        assert "…" not in text


def test_narrow_fields_go_least_important_first():
    runs = example_runs()
    lines, labels = lines_of(runs), Labels.of(runs)
    shown = {w: set(plan(w, lines, labels)[0]) for w in (25, 40, 60, 80, 200)}
    assert shown[25] == {"label", "steps"}
    assert shown[40] == {"label", "steps", "loss"}
    assert shown[60] == {"label", "steps", "loss", "best", "eta"}
    assert shown[80] == {"label", "steps", "loss", "best", "eta", "bar"}
    assert shown[200] >= {"id", "speed", "epoch"} | shown[80]


def test_shorten_keeps_values_and_drops_what_every_row_shares():
    assert shorten("hidden=32 lr=0.003", 18) == "hidden=32 lr=0.003"
    assert shorten("hidden=32 lr=0.003", 15) == "hid=32 lr=0.003"
    assert shorten("hidden=32 lr=0.003", 14) == "hi=32 lr=0.003"
    assert shorten("hidden=32 lr=0.003", 12) == "h=32 l=0.003"
    assert shorten("hidden=32 lr=0.003", 9) == "32 0.003"
    assert shorten("hidden=32 lr=0.003", 6) == "32 0.…"  # the last resort only
    assert shorten("layers=2 lr=0.01", 12) == "la=2 lr=0.01"  # never two keys alike
    assert forms("sgd") == ["sgd"]
    assert forms("no-warmup hidden=32") == ["no-warmup hidden=32", "no-warmup hid=32",
                                            "no-warmup hi=32", "no-warmup h=32", "no-warmup 32"]
    shared = Variants.of(["hidden=32 lr=0.003", "hidden=32 lr=0.01"])
    assert shared.shared == {"hidden=32"}
    assert shared.shorten("hidden=32 lr=0.003", 40) == "lr=0.003"
    assert Variants.of(["hidden=32 lr=0.003"]).shared == frozenset()  # one row: all of it
    assert Variants.of(["hidden=32", "sgd"]).shared == frozenset()  # not every row has it


def test_queue_eta_fills_the_first_free_slot():
    assert queue_eta([10.0, 30.0], 0, None) == 30.0
    assert queue_eta([10.0, 30.0], 2, 25.0) == 55.0  # the first at 10 (ends 35), the next at 30
    assert queue_eta([10.0, None], 2, 25.0) is None  # a run with no pace yet: no estimate
    assert queue_eta([10.0], 3, None) is None


def test_a_line_comes_from_the_one_fold():
    records = [start_line(100.0, 200, {"accuracy": "higher"}, "accuracy"),
               train_line(101.0, 10, 0, 0.9, 1e-3, 640.0, 0.1),
               val_line(101.5, 20, 0, {"accuracy": 0.5, "loss": 0.7}),
               train_line(102.0, 20, 0, 0.7, 1e-3, 640.0, 0.1)]
    p = progress.fold(records)
    run = SimpleNamespace(id="abc", experiment="e", variant="lr=0.1", seed=1,
                          config={"trainer": {"epochs": 2}})
    line = RunLine.of(run, p, now=102.0)
    assert (line.step, line.total, line.loss, line.best, line.arrow) == (20, 200, 0.7, 0.5, "↑")
    assert line.eta == p.eta(102.0) and line.eta == pytest.approx(180 * 0.1)
    ended = SimpleNamespace(**vars(run), status="completed", started_at=100.0, ended_at=112.5,
                            error=None, note=None)
    assert ended_line(ended, line) == ("completed  abc  e lr=0.1 seed 1  loss 0.7  "
                                       "best accuracy↑ 0.5  (12.5 s)")
    assert len(ended_line(ended, line, Labels.of([run]), 40)) <= 40


TINY = """
[defaults]
task = "spirals"
epochs = {epochs}
batch_size = 32
train_size = 512
val_size = 64
hidden = 8
seeds = 2

[experiments.tiny]
grid = {{ lr = [1e-3, 3e-3] }}

[engine]
cpu_slots = 2
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_gridrun_run_at_80_columns_shows_loss_best_and_eta(tmp_path):
    """The acceptance check in a real terminal: tmux at 80x24 while the runs train."""
    from gridrun.engine import daemon

    spec, root = tmp_path / "tiny.toml", tmp_path / "runs"
    spec.write_text(TINY.format(epochs=30))
    sock = tmp_path / "tmux.sock"
    env = "env -u COLUMNS -u LINES -u NO_COLOR"
    command = f"{env} {sys.executable} -m gridrun run {spec} --root {root}; sleep 30"
    tmux = ["tmux", "-f", "/dev/null", "-S", str(sock)]
    patience.run([*tmux, "new-session", "-d", "-s", "g", "-x", "80", "-y", "24", command],
                 check=True, timeout=30)
    try:
        deadline, screen = patience.Deadline(120), ""
        while not deadline.passed():
            screen = patience.run([*tmux, "capture-pane", "-p", "-t", "g"], capture_output=True,
                                  text=True, timeout=30).stdout
            bars = [line for line in screen.splitlines() if "━" in line]
            if bars and all("eta" in line and "0:" in line.split("eta")[1] for line in bars):
                break
            time.sleep(0.3)
        else:
            raise AssertionError(f"no bar with its ETA at 80 columns:\n{screen}")
        for line in bars:
            assert "loss" in line and "best" in line and "eta" in line, screen
            assert len(line.rstrip()) <= 80
        assert "ended ·" in screen and "running" in screen
    finally:
        patience.run([*tmux, "kill-server"], timeout=30)
        daemon.stop(root, force=True)


@pytest.mark.slow
def test_piped_it_writes_one_plain_line_per_event(tmp_path):
    from gridrun.engine import daemon

    spec, root = tmp_path / "tiny.toml", tmp_path / "runs"
    spec.write_text(TINY.format(epochs=1))
    try:
        done = patience.run([sys.executable, "-m", "gridrun", "run", str(spec), "--root", str(root)],
                            capture_output=True, text=True, timeout=240,
                            env={**os.environ, "COLUMNS": "80"})
    finally:
        daemon.stop(root, force=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "\x1b" not in done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith("started ") for line in lines) == 4
    ended = [line for line in lines if line.startswith("completed ")]
    assert len(ended) == 4 and all("loss" in x and "best loss↓" in x for x in ended), lines
    assert "4/4 ended · 0 running · 0 queued" in lines


# ---- issue 35: the follower folds over the store's change feed ---------------------------


def follow_scripted(tmp_path, monkeypatch, steps, n=2):
    """`follow` piped over a real store, `steps[i]` (store -> None) applied in its i-th
    wait between two reads; (its result, its plain lines, the store's calls)."""
    from test_engine_kit import make_run

    from gridrun.commands import follow as follower
    from gridrun.engine import daemon
    from gridrun.runs.store import Store

    root = tmp_path / "runs"
    runs = [make_run(seed=i) for i in range(n)]
    with Store(root) as store:
        store.enqueue(runs)
    calls: list[str] = []
    for name in ("list_runs", "changes_since", "get_run"):
        real = getattr(Store, name)
        monkeypatch.setattr(Store, name, lambda self, *a, _real=real, _name=name, **k: (
            calls.append(_name), _real(self, *a, **k))[1])
    monkeypatch.setattr(daemon, "status", lambda root, **_: SimpleNamespace(running=True))
    waits = iter(steps)

    def wait(_seconds):
        with Store(root) as store:
            next(waits)(store, [r.id for r in runs])

    monkeypatch.setattr(follower.time, "sleep", wait)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    ok = follower.follow(root, [r.id for r in runs], live=False, interval=0)
    return ok, out.getvalue().splitlines(), calls


def start(store, run_id):
    assert store.transition(run_id, states.QUEUED, states.RUNNING, started_at=time.time())


def end(store, run_id, status=None):
    assert store.transition(run_id, states.RUNNING, status or states.COMPLETED,
                            ended_at=time.time())


def test_a_run_started_and_ended_between_two_reads_still_gets_its_started_line(
        tmp_path, monkeypatch):
    a, b = 0, 1

    def first(store, ids):
        start(store, ids[a])

    def second(store, ids):  # a ends; b starts and ends before the next read
        end(store, ids[a])
        start(store, ids[b])
        end(store, ids[b])

    ok, lines, _ = follow_scripted(tmp_path, monkeypatch, [first, second])
    assert ok, lines
    said = [line.split()[:2] for line in lines if line.split()[0] in ("started", "completed")]
    ids = [line.split()[1] for line in lines if line.startswith("started")]
    assert len(ids) == 2 and said == [["started", ids[0]], ["completed", ids[0]],
                                      ["started", ids[1]], ["completed", ids[1]]], lines
    assert "2/2 ended · 0 running · 0 queued" in lines


def test_it_reads_the_change_feed_not_every_run_each_time(tmp_path, monkeypatch):
    def first(store, ids):
        start(store, ids[0])

    def nothing(store, ids):
        pass

    def second(store, ids):
        end(store, ids[0])
        start(store, ids[1])

    def third(store, ids):
        end(store, ids[1])

    ok, lines, calls = follow_scripted(tmp_path, monkeypatch, [first, nothing, nothing, second,
                                                               third])
    assert ok, lines
    assert "list_runs" not in calls and "get_run" not in calls, calls
    assert calls.count("changes_since") == 6  # one read each time: what changed since the last


def test_a_run_retried_and_ended_between_two_reads_is_said_to_start_again(tmp_path, monkeypatch):
    def first(store, ids):
        start(store, ids[0])
        start(store, ids[1])

    def second(store, ids):
        end(store, ids[0], states.FAILED)

    def third(store, ids):  # retried, started and failed again before the next read
        store.transition(ids[0], states.FAILED, states.QUEUED)
        start(store, ids[0])
        end(store, ids[0], states.FAILED)
        end(store, ids[1])

    ok, lines, _ = follow_scripted(tmp_path, monkeypatch, [first, second, third])
    assert not ok
    events = [line.split()[0] for line in lines if line.split()[0] in
              ("started", "failed", "completed")]
    assert events.count("started") == 3 and events.count("failed") == 2, lines


class _Changes:
    """A store's change feed as Feed reads it: the rows that changed since a read."""

    def __init__(self, rows):
        self.rows = rows

    def removed_since(self, seq):
        return [], seq

    def changes_since(self, seq):
        return (self.rows, 1) if seq == 0 else ([], seq)


def test_a_run_that_ended_before_the_first_read_is_told_started_and_ended_once():
    """An engine already up can start and end a tiny run before `gridrun run`'s follower
    first reads the store (a busy machine printed no line for 4 runs so): it is told, in
    order; a run that ended before the command queued anything is not told again."""
    from gridrun.commands.follow import Feed

    def row(run_id, started):
        return SimpleNamespace(id=run_id, status=states.COMPLETED, started_at=started,
                               ended_at=started + 1)

    since = 1000.0
    feed = Feed(["new", "old"], since)
    _, events = feed.read(_Changes([row("old", since - 50), row("new", since + 1)]))
    assert [(e, r.id) for e, r in events] == [("started", "new"), ("ended", "new")]
    assert feed.read(_Changes([]))[1] == []
