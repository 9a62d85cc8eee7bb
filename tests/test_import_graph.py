"""gridrun's modules import one another without a cycle, lazy imports included
(a cycle broken by an import inside a function is still a cycle); the packages
form one stack, each importing only those below it; training code never
imports the store; nothing in the backends points back up at the scheduler;
and within one package no modules import one another in a circle, not even
through imports made only for type checking."""

from __future__ import annotations

import ast
from pathlib import Path

import gridrun

GRIDRUN = Path(gridrun.__file__).parent
ENGINE = GRIDRUN  # the walker's root: every module of the gridrun package
PACKAGE = "gridrun.engine"

# The stack, bottom first: a package may import only the packages before it.
# `analysis` and `deploy` sit beside the engine: they never import it.
LAYERS = ["userfiles", "data", "randomness", "tasks", "spec", "runs", "train", "engine", "analysis", "deploy",
          "checks", "tui", "commands", "cli", "__main__"]
SIDE_BY_SIDE = {("analysis", "engine"), ("deploy", "engine"), ("deploy", "analysis")}


def module_name(path: Path) -> str:
    parts = path.relative_to(GRIDRUN.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path, modules: set[str], type_only: bool = False) -> set[str]:
    """The engine modules `path` imports, wherever the import statement is; with
    `type_only`, those imported under `if TYPE_CHECKING:` too."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = set() if type_only else {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _type_checking_only(node)
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


def graph(type_only: bool = False) -> dict[str, set[str]]:
    """Module -> the gridrun modules it imports (with `type_only`, for type checking
    too). `gridrun` itself (the public face, which reaches down lazily) is left out:
    importing it for `__version__` or `Task` costs only `gridrun.tasks`, the bottom
    of the stack."""
    files = sorted(ENGINE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    edges = {module_name(f): imports_of(f, modules, type_only) - {"gridrun"} for f in files}
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


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted:
    the modules that reach one another through their imports (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_walker_sees_lazy_and_relative_imports(tmp_path):
    edges = graph()
    assert "gridrun.spec.keys" in edges["gridrun.spec.validate"]
    assert "gridrun.tasks" in edges["gridrun.spec.derive"]  # inside a function
    assert "gridrun.spec.search" not in edges["gridrun.spec.model"]  # for type checking only
    assert "gridrun.spec.search" in graph(type_only=True)["gridrun.spec.model"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert circles({"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
                   ) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


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


def test_no_package_has_a_circle_of_modules():
    """Within one package of the stack (train, engine, ...) the modules import
    downward only: no module imports one that imports it back, directly or round
    a longer circle, lazily inside a function or only for type checking (a type
    shared by two modules lives in a module below both, as `train.loop.probe`)."""
    edges = graph(type_only=True)
    inside = {m: {t for t in ts if package_of(t) == package_of(m)} for m, ts in edges.items()}
    found = [[f"{m} -> {t}" for m in circle for t in sorted(inside[m]) if t in circle]
             for circle in circles(inside)]
    assert not found, "modules of one package import one another in a circle:\n" + "\n\n".join(
        "\n".join(imports) for imports in found)


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
