"""The pages' task of your own runs: every python block that starts `# mypkg/tasks.py`
(the README's short one, docs/own-task.md's whole one) is a package that imports, builds a
Task that trains and evaluates, and the page's experiment file for it passes `gridrun
plan --check`. (The table of every key is
docs/reference/experiment-keys.md, generated from the spec's own table.)"""

from __future__ import annotations

import re
import sys

import pytest
from docs_kit import page_text, pages
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.spec import load_runs

TASK = re.compile(r"```python\n# mypkg/tasks.py\n(.*?)```", re.S)
TOML = re.compile(r"```toml\n(.*?)```", re.S)


def example_code(page: str) -> str:
    m = TASK.search(page_text(page))
    assert m, f"{page}'s task example (a python block starting '# mypkg/tasks.py') is missing"
    return m.group(1)


def task_pages() -> list[str]:
    return [page for page in pages() if TASK.search(page_text(page))]


def test_the_readme_and_the_own_task_page_show_a_task():
    assert {"README.md", "docs/own-task.md"} <= set(task_pages())


@pytest.mark.parametrize("page", task_pages())
def test_page_task_example_runs_and_validates(tmp_path, monkeypatch, page):
    import torch

    from gridrun import Task

    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tasks.py").write_text(example_code(page))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("mypkg", None)
    sys.modules.pop("mypkg.tasks", None)
    from mypkg.tasks import regression

    task = regression()
    assert isinstance(task, Task)
    assert isinstance(task.model, torch.nn.Module)
    assert len(task.train_data) > 0 and len(task.val_data) > 0
    batch = next(iter(torch.utils.data.DataLoader(task.train_data, batch_size=16)))
    loss = task.loss(task.model, batch)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    sums = task.evaluate(task.model, batch)
    assert set(sums) == set(task.metrics)
    assert set(task.metrics.values()) <= {"lower", "higher"}

    spec = tmp_path / "e.toml"
    spec.write_text('[experiments.fit]\ntask = "mypkg.tasks:regression"\ngrid = { hidden = [8, 16] }\n')
    runs = load_runs(spec)
    assert [r.task_args["hidden"] for r in runs] == [8, 16]

    # the page's own file for it passes the task check, run as the page says
    files = [t for t in TOML.findall(page_text(page)) if '"mypkg.tasks:regression"' in t]
    assert files, f"{page} shows no experiment file using its task"
    monkeypatch.chdir(tmp_path)
    for i, text in enumerate(files):
        (tmp_path / f"page{i}.toml").write_text(text)
        result = CliRunner().invoke(app, ["plan", "--check", f"page{i}.toml"])
        assert result.exit_code == 0 and "task check passed" in result.output, result.output
