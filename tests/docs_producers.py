"""What makes the pages' blocks that no single `gridrun` command prints: the end of
`gridrun run`, the interface in tmux, a check of a file written for the purpose, ...
Each takes the module's trained Example and returns the text its block shows
(tests/docs_kit.py reads the pages; tests/test_readme_output.py compares).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path

import pytest
from docs_kit import ROOT, Example, gridrun


def run_end(example: Example, capsys) -> str:
    """What `gridrun run experiments.toml` prints once its runs have ended."""
    from gridrun.commands.engine import _results
    from gridrun.commands.follow import follow
    from gridrun.spec import load_runs

    runs = load_runs(Path("experiments.toml"))
    capsys.readouterr()
    assert follow(Path("runs"), [r.id for r in runs], live=False)
    _results(Path("runs"), Path("experiments.toml"), runs)
    return capsys.readouterr().out


@contextlib.contextmanager
def folder(example: Example, name: str, files: dict[str, str]):
    """A fresh folder `name` in the work folder holding `files`, the current one meanwhile
    (the module's runs/ stay as the other blocks show them)."""
    path = example.work / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    for file, text in files.items():
        (path / file).write_text(text)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(path)
        yield path


def shown(file: str, page: str | None = None) -> str:
    """The file a page shows in its `<!-- file: FILE -->` block (one page shows it, or
    `page`'s)."""
    from docs_kit import blocks, pages

    (text,) = [t for p in ([page] if page else pages()) for kind, name, t in blocks(p)
               if kind == "file" and name == file]
    return text


def checked(example: Example, file: str) -> str:
    """`gridrun plan --check FILE` on the file a page shows: its lines about the file (the
    pages show those, not the plan's table)."""
    with folder(example, file.removesuffix(".toml"), {file: shown(file)}):
        out = gridrun("plan", "--check", file)
    return "\n".join(line for line in out.splitlines() if line.startswith(f"{file}:"))


def preprocess_check(example: Example, capsys) -> str:
    """The task check on a data path that skips the task's preprocess (tests/bad_tasks.py)."""
    return checked(example, "forgot.toml")


def switch_note(example: Example, capsys) -> str:
    return checked(example, "switch.toml")


def unknown_source(example: Example, capsys) -> str:
    return checked(example, "vary.toml")


SHOWN = 4  # the search's leaderboard: search.md shows its best 4 rows, then "..."


def search_leaderboard(example: Example, capsys) -> str:
    """The end of `gridrun run examples/search.toml`: its 27 trials queued, run by an engine
    in this process (2 slots, the local backend's fork server: 5-8 s on 2 cores), and
    `gridrun compare spirals-search`, cut to the best SHOWN rows as search.md shows it."""
    from test_engine_kit import drain, engine_for

    from gridrun.engine.backends.local import LocalBackend

    search = (ROOT / "examples" / "search.toml").read_text()
    with folder(example, "search", {"search.toml": search}) as work:
        assert "queued 27 runs" in gridrun("queue", "search.toml")
        local = LocalBackend()
        try:
            engine = engine_for(work / "runs", local, slots=2)
            engine.start()
            drain(engine, timeout=120)  # quiet seconds (tests/patience.py): 10 s of work
        finally:
            local.close()
        out = gridrun("compare", "spirals-search").splitlines()
    header = next(i for i, line in enumerate(out) if line.startswith("RANK"))
    rows = next(i for i, line in enumerate(out[header + 1:]) if not line[:1].isdigit())
    assert rows > SHOWN, out
    return "\n".join([*out[:header + 1 + SHOWN], "...", *out[header + 1 + rows:]])


EXPORT = "runs/shapes-cnn/1e358ca3c3/export/best"  # deploy.md's shapes run's export folder


def predict_refusal(example: Example, capsys) -> str:
    """`gridrun predict` given 0-1 floats for a shapes export's uint8 input. The refusal reads
    model.json alone, so the folder holds a 1-epoch shapes run's export (pt2: no extra
    needed) where deploy.md's run exported: a second or two, not that run's 15 epochs."""
    import numpy as np

    from gridrun.spec import load_runs
    from gridrun.tasks.shapes import shapes

    exp = ('[experiments.shapes-cnn]\ntask = "shapes"\nepochs = 1\nbatch_size = 32\n'
           "train_size = 64\nval_size = 32\nseeds = 1\nthreads = 1\n")
    with folder(example, "deploy", {"exp.toml": exp}):
        run = load_runs(Path("exp.toml"))[0].id
        assert "completed" in gridrun("train", "exp.toml", run)
        assert "parity ok" in gridrun("export-model", run, "--format", "pt2",
                                      "-o", f"{EXPORT}/model.pt2")
        raw, _ = shapes(train_size=64, val_size=32).raw_val_data[1]
        np.save("val1-floats.npy", raw.numpy().astype(np.float32) / 255)
        command = f"predict {EXPORT} val1-floats.npy"
        return f"$ gridrun {command}\n" + gridrun(*command.split())


def task_check(example: Example, capsys) -> str:
    """The task check on own-task.md's task with a mistake: `hit` for `hit_rate`."""
    from test_readme import example_code

    pkg = example.work / "mypkg"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    code = example_code("docs/own-task.md")
    assert '"hit_rate": (' in code
    (pkg / "tasks.py").write_text(code.replace('"hit_rate": (', '"hit": (', 1))
    sys.modules.pop("mypkg", None)
    sys.modules.pop("mypkg.tasks", None)
    sys.path.insert(0, str(example.work))
    try:
        return "$ gridrun queue exp.toml\n" + gridrun("queue", "exp.toml")
    finally:
        sys.path.remove(str(example.work))
        sys.modules.pop("mypkg", None)
        sys.modules.pop("mypkg.tasks", None)


def shared_root(example: Example, capsys) -> str:
    """`gridrun ls` on a runs root that group members could write to (mode 0775)."""
    with folder(example, "shared", {}) as path:
        (path / "shared-runs").mkdir()
        (path / "shared-runs").chmod(0o775)
        return "$ gridrun ls --root shared-runs\n" + gridrun("ls", "--root", "shared-runs")


def ray_lab_status(example: Example, capsys) -> str:
    """`engine status`'s line for another user's process on a Ray node's GPU: the store
    state a Ray engine writes (tests/test_ray_lab.py checks the engine writes it, node
    and all, on a real two-node cluster), shown as `engine status` shows it."""
    from test_foreign_gpus import pretend_daemon

    from gridrun.engine.foreign import STATE
    from gridrun.runs.store import Store

    taken = {"policy": "avoid", "waits": None, "gpus": [{"gpu": 0, "uuid": "GPU-5f1c",
             "node": "node2", "processes": [{"pid": 4242, "user": "alice", "mem_bytes": 70 << 30}]}]}
    with folder(example, "lab", {}) as path:
        root = path / "lab-runs"
        root.mkdir(mode=0o700)
        with Store(root) as store:
            store.set_state(STATE, taken)
        pretend_daemon(root)  # this process stands for the engine: `status` reads a live one
        out = gridrun("engine", "status", "--root", str(root))
    return "\n".join(line for line in out.splitlines() if line.startswith("node2:"))


def task_plan(example: Example, page: str) -> str:
    """`gridrun plan --check exp.toml` in a folder holding the page's task package
    (mypkg/tasks.py) and its exp.toml, as the page tells you to lay them out."""
    from test_readme import example_code

    slug = Path(page).stem.lower()
    with folder(example, f"task-{slug}", {"exp.toml": shown("exp.toml", page)}) as path:
        (path / "mypkg").mkdir()
        (path / "mypkg" / "__init__.py").write_text("")
        (path / "mypkg" / "tasks.py").write_text(example_code(page))
        for module in ("mypkg", "mypkg.tasks"):
            sys.modules.pop(module, None)
        try:
            return "$ gridrun plan --check exp.toml\n" + gridrun("plan", "--check", "exp.toml")
        finally:
            for module in ("mypkg", "mypkg.tasks"):
                sys.modules.pop(module, None)


def readme_task_plan(example: Example, capsys) -> str:
    return task_plan(example, "README.md")


def own_task_plan(example: Example, capsys) -> str:
    return task_plan(example, "docs/own-task.md")


def interface(example: Example, capsys) -> str:
    if example.interface is None:
        pytest.skip("needs tmux")
    return example.interface


def compare_screen(example: Example, capsys) -> str:
    if example.compare_screen is None:
        pytest.skip("needs tmux")
    return example.compare_screen


PRODUCERS = {"run-end": run_end, "task-check": task_check, "interface": interface,
             "compare-screen": compare_screen, "preprocess-check": preprocess_check,
             "switch-note": switch_note, "unknown-source": unknown_source,
             "search-leaderboard": search_leaderboard, "predict-refusal": predict_refusal,
             "shared-root": shared_root, "readme-task-plan": readme_task_plan,
             "own-task-plan": own_task_plan, "ray-lab-status": ray_lab_status}
