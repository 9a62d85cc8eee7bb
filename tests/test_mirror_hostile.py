"""`gridrun mirror mlflow` attacked as a hostile user would (issue 45, finding 8): a server
that trickles, fails with HTTP 500 or sends a huge answer (a fake on 127.0.0.1,
mlflow_fake.py); credentials in the tracking URI; a local store aimed at a system folder or
through a link; a damaged cursor; a server that refuses every run (the real MLflow server
where what it does matters). Each case ends in one line that says what happened, never a
hang, a traceback or a secret."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from pathlib import Path

import patience
import pytest

pytest.importorskip("mlflow", reason="needs the mlflow package (pip install 'gridrun[mlflow]')")

from mlflow_fake import FakeServer, mlflow_error
from mlflow_kit import difference, points_held, record_run
from test_engine_kit import make_run
from typer.testing import CliRunner

from gridrun.analysis.mlflow.cursor import CURSOR
from gridrun.cli import app
from gridrun.runs import layout
from gridrun.runs.store import Store

pytestmark = pytest.mark.slow  # a real server for some, an MLflow client started for each

PASSWORD, TOKEN = "pa55-w0rd-Zq", "t0ken-Xy7w"
MIRROR_QUIET_S = 120  # a one-shot mirror's bound, in quiet seconds: only a hang comes near it


def rooted(folder: Path, experiment: str = "hostile", count: int = 2) -> tuple[Path, list]:
    """A root holding `count` ended runs of `experiment`, recorded without training."""
    root = folder / "runs"
    runs = [make_run(seed=seed, experiment=experiment, threads=1) for seed in range(count)]
    with Store(root) as store:
        store.enqueue(runs)
    for i, spec in enumerate(runs):
        record_run(root, spec, [0.9, 0.7, 0.5], f"{i}" * 64)
    return root, runs


def mirror_process(root: Path, uri: str, **env: str):
    """`gridrun mirror mlflow` once, as its own process (what hangs must not hang the test)."""
    return patience.run([sys.executable, "-m", "gridrun", "mirror", "mlflow", "--root", str(root),
                         "--tracking-uri", uri], capture_output=True, text=True,
                        timeout=MIRROR_QUIET_S, env={**os.environ, **env})


def mirror_here(root: Path, uri: str):
    """`gridrun mirror mlflow` once, in this process."""
    return CliRunner().invoke(app, ["mirror", "mlflow", "--root", str(root), "--tracking-uri", uri])


def store_rows(root: Path) -> list:
    with Store(root, create=False) as store:
        return store.list_runs()


def cursor_text(root: Path) -> str:
    path = root / CURSOR
    return path.read_text() if path.exists() else ""


# ---- a server that trickles, fails or floods ----------------------------------------------


@pytest.mark.parametrize("mode", ["trickle_headers", "trickle_body"])
def test_a_trickling_server_is_cut_off_at_the_deadline_in_one_line(tmp_path, mode):
    root, _ = rooted(tmp_path)
    # a byte every 0.2 s: each read comes well within any per-read timeout, so only a
    # deadline on the whole request ends it (the server itself trickles for 10 minutes)
    with FakeServer(mode, every=0.2) as fake:
        done = mirror_process(root, fake.uri, MLFLOW_HTTP_REQUEST_TIMEOUT="2")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"could not send to {fake.uri}: no whole answer within 2 s"), lines
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("body, content_type, said", [
    (b"upstream database is locked\n<html><body>details</body></html>", "text/plain",
     "HTTP 500 (Internal Server Error): upstream database is locked"),
    (mlflow_error("INTERNAL_ERROR", "the backend store is read-only"), "application/json",
     "HTTP 500 (Internal Server Error): INTERNAL_ERROR: the backend store is read-only"),
])
def test_http_500_is_reported_as_what_it_is_with_the_servers_reason(tmp_path, body,
                                                                    content_type, said):
    root, _ = rooted(tmp_path)
    with FakeServer("error", status=500, body=body, content_type=content_type) as fake:
        result = mirror_here(root, fake.uri)
    assert result.exit_code == 1, result.output
    assert f"could not send to {fake.uri}: {said};" in result.output, result.output
    assert "no answer" not in result.output


@pytest.mark.parametrize("declared", [2_000_000_000, None], ids=["content-length", "until-close"])
def test_an_answer_larger_than_the_cap_is_refused_never_read_whole(tmp_path, declared):
    root, _ = rooted(tmp_path)
    # 256 MB of zeros, announced as 2 GB or not at all: the mirror hangs up before the end
    with FakeServer("flood", declared=declared, flood_bytes=256 << 20) as fake:
        result = mirror_here(root, fake.uri)
        sent_whole = fake.finished.is_set()
    assert result.exit_code == 1, result.output
    said = "2.0 GB, more than the 64 MB the mirror reads" if declared else \
        "more than the 64 MB the mirror reads"
    assert f"could not send to {fake.uri}: the server's answer is {said}" in result.output, \
        result.output
    assert not sent_whole, "the mirror read the whole answer"


# ---- credentials ---------------------------------------------------------------------------


def test_credentials_in_the_uri_are_never_printed_nor_kept(tmp_path, server, client):
    root, _ = rooted(tmp_path, "credentials")
    hostile = FakeServer("error", status=500, body=b"no")
    try:
        bare = hostile.uri.removeprefix("http://")
        failed = mirror_here(root, f"http://alice:{PASSWORD}@{bare}/?token={TOKEN}")
    finally:
        hostile.close()
    assert failed.exit_code == 1, failed.output
    assert f"could not send to http://***@{bare}/?token=***: HTTP 500" in failed.output, \
        failed.output
    # a server that answers: the mirror works with the credentials and shows none of them
    port = server.uri.removeprefix("http://")
    sent = mirror_here(root, f"http://alice:{PASSWORD}@{port}")
    assert sent.exit_code == 0, sent.output
    assert f"mirrored 2 runs to http://***@{port}: 2 new" in sent.output, sent.output
    assert difference(client, root, store_rows(root)) is None
    for text in (failed.output, sent.output, cursor_text(root)):
        assert PASSWORD not in text and TOKEN not in text and "alice" not in text, text
    assert set(json.loads(cursor_text(root))) == {f"http://***@{bare}/?token=***",
                                                  f"http://***@{port}"}


def test_a_cursor_that_kept_a_password_keeps_it_no_more(tmp_path):
    root, _ = rooted(tmp_path)
    (root / CURSOR).write_text(json.dumps({f"http://bob:{PASSWORD}@10.0.0.1:5000": {
        "runs": {}, "parents": {}, "roots": []}}))
    with FakeServer("error", status=503, body=b"down for maintenance") as fake:
        result = mirror_here(root, fake.uri)
    assert result.exit_code == 1, result.output
    assert PASSWORD not in cursor_text(root)
    assert "http://***@10.0.0.1:5000" in json.loads(cursor_text(root))


# ---- local stores --------------------------------------------------------------------------


def test_a_local_store_in_a_system_folder_is_refused_and_nothing_made(tmp_path):
    root, _ = rooted(tmp_path)
    name = f"gridrun-mirror-test-{secrets.token_hex(4)}"
    targets = [Path("/etc") / f"{name}.db", Path("/etc") / name]
    try:
        for uri, target in ((f"sqlite:///{targets[0]}", targets[0]), (f"file://{targets[1]}",
                                                                       targets[1])):
            result = mirror_here(root, uri)
            assert result.exit_code == 2, result.output
            assert result.output.startswith(f"tracking store {uri}: refusing to write {target}: "
                                            "it is in the system folder /etc"), result.output
            assert len(result.output.strip().splitlines()) == 1, result.output
            assert not os.path.lexists(target)
    finally:  # today's code made them: never leave them in /etc
        for target in targets:
            for path in (target, Path(f"{target}-journal")):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif os.path.lexists(path):
                    path.unlink()


def test_a_local_store_behind_a_link_is_refused(tmp_path):
    root, _ = rooted(tmp_path)
    elsewhere = tmp_path / "elsewhere.db"
    (tmp_path / "store.db").symlink_to(elsewhere)
    result = mirror_here(root, f"sqlite:///{tmp_path / 'store.db'}")
    assert result.exit_code == 2, result.output
    assert "it is a symbolic link" in result.output, result.output
    assert not elsewhere.exists()
    (tmp_path / "mlruns-link").symlink_to(tmp_path / "real-mlruns", target_is_directory=True)
    result = mirror_here(root, f"file://{tmp_path / 'mlruns-link'}")
    assert result.exit_code == 2 and "it is a symbolic link" in result.output, result.output
    assert not (tmp_path / "real-mlruns").exists()


# MLflow's own SQL store warns of a SQLAlchemy option it uses: not the mirror's to fix
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")
def test_a_local_sqlite_store_of_ones_own_is_written(tmp_path, monkeypatch):
    root, _ = rooted(tmp_path, "local")
    monkeypatch.chdir(tmp_path)  # a sqlite store keeps its files in ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = mirror_here(root, uri)
    assert first.exit_code == 0 and "2 new" in first.output, first.output
    again = mirror_here(root, uri)
    assert again.exit_code == 0 and "0 new, 0 metric points" in again.output, again.output


# ---- a damaged cursor ----------------------------------------------------------------------


def test_a_damaged_cursor_reads_as_empty_and_nothing_is_sent_twice(tmp_path, server, client):
    root, runs = rooted(tmp_path, "damaged")
    assert mirror_here(root, server.uri).exit_code == 0
    held = points_held(client, "damaged")
    data = json.loads(cursor_text(root))
    entries = data[server.uri]["runs"]
    first, second = (entries[r.id] for r in runs)
    first.update(offset=float("inf"), seq=float("nan"), last={"train/loss": float("inf")})
    second.update(offset=10 ** 12, tail="")  # past the log's end: no new line would ever be read
    (root / CURSOR).write_text(json.dumps(data))  # Infinity and NaN, as JSON writers spell them
    # one more line in the second run's log: it is sent, and nothing else
    log = layout.run_dir(root, runs[1].experiment, runs[1].id) / layout.METRICS
    with open(log, "a") as f:
        f.write(json.dumps({"t": 1.0, "step": 100, "epoch": 9, "split": "train", "loss": 0.1,
                            "lr": 0.001}) + "\n")
    again = mirror_here(root, server.uri)
    assert again.exit_code == 0, again.output
    assert "0 new, 2 metric points" in again.output, again.output  # train/loss and train/lr at 100
    assert points_held(client, "damaged") == (held[0], held[1] + 2)
    entries[runs[0].id]["offset"] = -7  # a negative offset: read from the start, not a failure
    (root / CURSOR).write_text(json.dumps(data))
    third = mirror_here(root, server.uri)
    assert third.exit_code == 0 and "0 new, 0 metric points" in third.output, third.output
    assert points_held(client, "damaged") == (held[0], held[1] + 2)


# ---- a server that refuses every run -------------------------------------------------------


def test_a_mirror_whose_every_run_is_refused_says_so_and_fails(tmp_path, server, client):
    root, runs = rooted(tmp_path, "gone")
    client.delete_experiment(client.create_experiment("gone"))
    result = mirror_here(root, server.uri)
    assert result.exit_code == 1, result.output
    assert f"mirrored 0 runs to {server.uri}: 0 new, 0 metric points, 0 files sent; " \
           "2 refused (said above)" in result.output, result.output
    # one run sent, one refused: both counted, and the mirror succeeds (something was sent)
    mixed = tmp_path / "mixed"
    kept = make_run(seed=0, experiment="kept", threads=1)
    with Store(mixed) as store:
        store.enqueue([kept, runs[0]])
    for spec in (kept, runs[0]):
        record_run(mixed, spec, [0.9, 0.7], "c" * 64)
    sent = mirror_here(mixed, server.uri)
    assert sent.exit_code == 0, sent.output
    assert f"mirrored 1 run to {server.uri}: 1 new" in sent.output and \
        "; 1 refused (said above)" in sent.output, sent.output
