"""The README stays true: its trainer-key table is TRAINER_KEYS, its task example runs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from gridrun.spec import TRAINER_KEYS, Key, load_runs
from gridrun.spec.keys import number

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- trainer-keys:start -->", "<!-- trainer-keys:end -->"


def toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(toml(x) for x in v) + "]"
    return repr(v)


def allowed(key: Key) -> str:
    if key.choices:
        return " \\| ".join(f"`{c}`" for c in key.choices)
    bits = []
    for op, bound in ((">=", key.min), (">", key.above), ("<=", key.max), ("<", key.below)):
        if bound is not None:
            bits.append(f"{op} {number(bound)}")
    special = {
        "boolean": "`true` \\| `false`",
        'boolean or "auto"': "`true` \\| `false` \\| `auto`",
        "array of 2 floats": "each in [0, 1)",
        "array of strings": "class names of the model's modules",
        "float or integer": "a float in [0, 1), or an integer >= 0"
                            + (f", <= {number(key.max)}" if key.max is not None else ""),
        "source or array of sources": "`all`, `init`, `order`, `augment`, `model`, or an array "
                                      "of sources",
        'integer or "seed"': "an integer >= 0, or `seed`",
        'integer or "auto"': "`auto`, or an integer " + ", ".join(bits),
        'float or "auto"': "`auto`, or a number " + ", ".join(bits),
    }
    if key.type in special:
        return special[key.type]
    if key.name == "early_stop_metric":
        return "a metric of the task, or empty"
    return ", ".join(bits)


def trainer_table() -> str:
    rows = ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for key in TRAINER_KEYS.values():
        doc = key.doc + ("" if key.affects_results else " (not part of the run id)")
        kind = key.type.replace('"', "`")
        rows.append(f"| `{key.name}` | {kind} | `{toml(key.default)}` "
                    f"| {allowed(key)} | {doc} |")
    return "\n".join(rows)


def test_readme_trainer_table_matches_trainer_keys():
    text = README.read_text()
    block = text.split(START, 1)[1].split(END, 1)[0].strip()
    expected = trainer_table()
    assert block == expected, f"regenerate the README table between the markers:\n{expected}"


def example_code() -> str:
    text = README.read_text()
    m = re.search(r"```python\n# mypkg/tasks.py\n(.*?)```", text, re.S)
    assert m, "the README's task example (a python block starting '# mypkg/tasks.py') is missing"
    return m.group(1)


def test_readme_task_example_runs_and_validates(tmp_path, monkeypatch):
    import torch

    from gridrun import Task

    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tasks.py").write_text(example_code())
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
