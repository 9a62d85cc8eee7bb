"""`gridrun rm ID...`: queued and ended runs leave the store (readers see it through
`removed_since`); a running run is refused; folders are kept or deleted as asked;
bad input is one line and exit 2, removing nothing."""

from __future__ import annotations

from test_engine_kit import make_run
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.runs.store import Store


def three(root):
    runs = [make_run(seed=s) for s in range(3)]
    with Store(root) as store:
        store.enqueue(runs)
        store.transition(runs[1].id, "queued", "running")
        store.transition(runs[2].id, "queued", "running")
        store.transition(runs[2].id, "running", "completed")
    for r in runs:
        folder = root / r.experiment / r.id
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text("{}\n")
    return runs


def test_rm_keeps_folders_refuses_running_and_readers_see_it(tmp_path):
    root = tmp_path / "runs"
    queued, running, done = three(root)
    with Store(root) as store:
        _, seq = store.removed_since(0)
    result = CliRunner().invoke(app, ["rm", queued.id[:6], done.id, running.id, "--root", str(root)])
    assert result.exit_code == 2
    assert f"{queued.id}: removed; folder" in result.output and "kept" in result.output
    assert f"{running.id}: not removed: it is running; cancel it first" in result.output
    with Store(root) as store:
        assert [r.id for r in store.list_runs()] == [running.id]
        gone, _ = store.removed_since(seq)
        assert gone == [queued.id, done.id]
    assert (root / queued.experiment / queued.id / "metrics.jsonl").exists()


def test_rm_delete_folders(tmp_path):
    root = tmp_path / "runs"
    queued, _, done = three(root)
    result = CliRunner().invoke(app, ["rm", queued.id, done.id, "--delete-folders",
                                      "--root", str(root)])
    assert result.exit_code == 0, result.output
    assert "deleted" in result.output
    assert not (root / queued.experiment / queued.id).exists()
    assert not (root / done.experiment / done.id).exists()


def test_rm_bad_id_is_one_line_and_removes_nothing(tmp_path):
    root = tmp_path / "runs"
    queued, *_ = three(root)
    result = CliRunner().invoke(app, ["rm", queued.id, "nosuchrun", "--root", str(root)])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0
    assert "no run matches 'nosuchrun'" in result.output and "nothing was removed" in result.output
    with Store(root) as store:
        assert len(store.list_runs()) == 3


def test_removing_every_run_keeping_folders_is_no_lost_queue(tmp_path):
    from gridrun.runs.rundirs import lost_queue_warning

    root = tmp_path / "runs"
    queued, running, done = three(root)
    with Store(root) as store:
        store.transition(running.id, "running", "completed")
        store.remove([queued.id, running.id, done.id])
        assert not store.has_runs()
        assert lost_queue_warning(root, store) is None
