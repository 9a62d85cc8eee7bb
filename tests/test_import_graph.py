"""gridrun's modules import one another without a cycle, lazy imports included
(a cycle broken by an import inside a function is still a cycle); the packages
form one stack, each importing only those below it; training code never
imports the store; nothing in the backends points back up at the scheduler."""

from __future__ import annotations

import ast
from pathlib import Path

import gridrun

GRIDRUN = Path(gridrun.__file__).parent
ENGINE = GRIDRUN  # the walker's root: every module of the gridrun package
PACKAGE = "gridrun.engine"

# The stack, bottom first: a package may import only the packages before it.
# `analysis` and `deploy` sit beside the engine: they never import it.
LAYERS = ["data", "randomness", "tasks", "spec", "runs", "train", "engine", "analysis", "deploy",
          "checks", "tui", "commands", "cli", "__main__"]
SIDE_BY_SIDE = {("analysis", "engine"), ("deploy", "engine"), ("deploy", "analysis")}


def module_name(path: Path) -> str:
    parts = path.relative_to(GRIDRUN.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The engine modules `path` imports, wherever the import statement is."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _type_checking_only(node)
            for n in ast.walk(node)}
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports the submodule `pkg.mod`
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:  # `import a.b.c` where c is an attribute
                name = name.rpartition(".")[0]
            if name and name != me:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    """Module -> the gridrun modules it imports. `gridrun` itself (the public face,
    which reaches down lazily) is left out: importing it for `__version__` or
    `Task` costs only `gridrun.tasks`, the bottom of the stack."""
    files = sorted(ENGINE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    edges = {module_name(f): imports_of(f, modules) - {"gridrun"} for f in files}
    edges.pop("gridrun", None)
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_walker_sees_lazy_and_relative_imports(tmp_path):
    edges = graph()
    assert "gridrun.spec.keys" in edges["gridrun.spec.validate"]
    assert "gridrun.tasks" in edges["gridrun.spec.derive"]  # inside a function
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_package_is_in_the_stack():
    found = {p.name for p in GRIDRUN.iterdir() if (p / "__init__.py").exists()}
    found |= {p.stem for p in GRIDRUN.glob("*.py") if p.stem != "__init__"}
    assert found == set(LAYERS), found ^ set(LAYERS)


def test_no_package_imports_one_above_it():
    rank = {name: i for i, name in enumerate(LAYERS)}
    up = []
    for module, targets in graph().items():
        here = package_of(module)
        for target in targets:
            there = package_of(target)
            if not there or not here or there == here:
                continue  # gridrun/__init__.py (the public face) imports lazily from below
            if rank[there] > rank[here] or (here, there) in SIDE_BY_SIDE:
                up.append(f"{module} -> {target}")
    assert not up, "imports up the stack:\n" + "\n".join(sorted(up))


def test_training_code_never_imports_the_store():
    edges = graph()
    bad = sorted(f"{m} -> {t}" for m, ts in edges.items() if m.startswith("gridrun.train")
                 for t in ts if t in ("gridrun.runs.store", "gridrun.runs.store_rows"))
    assert not bad, bad


def test_gridrun_has_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_backends_never_import_the_scheduler():
    edges = graph()
    up = {m: sorted(t for t in ts if t == f"{PACKAGE}.scheduler" or t == f"{PACKAGE}.daemon")
          for m, ts in edges.items() if m.startswith(f"{PACKAGE}.backends")}
    assert not any(up.values()), up


def test_the_spec_package_imports_nothing_above_it_but_tasks():
    edges = graph()
    spec = {m: ts for m, ts in edges.items() if m.startswith("gridrun.spec")}
    assert set(spec) >= {f"gridrun.spec.{n}" for n in
                         ("keys", "errors", "model", "validate", "expand", "load", "derive")}
    outside = {t for ts in spec.values() for t in ts if not t.startswith("gridrun.spec")}
    assert outside <= {"gridrun.tasks"}, outside
