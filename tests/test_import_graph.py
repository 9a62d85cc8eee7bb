"""The engine's modules import one another without a cycle, lazy imports included
(a cycle broken by an import inside a function is still a cycle), and nothing in
the backends points back up at the scheduler."""

from __future__ import annotations

import ast
from pathlib import Path

import gridrun.engine

ENGINE = Path(gridrun.engine.__file__).parent
PACKAGE = "gridrun.engine"


def module_name(path: Path) -> str:
    parts = path.relative_to(ENGINE.parent.parent).with_suffix("").parts
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
    files = sorted(ENGINE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports_of(f, modules) for f in files}


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
    assert "gridrun.engine.spec.keys" in edges["gridrun.engine.spec.validate"]
    assert "gridrun.engine.tasks" in edges["gridrun.engine.spec.derive"]  # inside a function
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_engine_has_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_backends_never_import_the_scheduler():
    edges = graph()
    up = {m: sorted(t for t in ts if t == f"{PACKAGE}.scheduler" or t == f"{PACKAGE}.daemon")
          for m, ts in edges.items() if m.startswith(f"{PACKAGE}.backends")}
    assert not any(up.values()), up


def test_the_spec_package_imports_nothing_above_it_but_tasks():
    edges = graph()
    spec = {m: ts for m, ts in edges.items() if m.startswith(f"{PACKAGE}.spec")}
    assert set(spec) >= {f"{PACKAGE}.spec.{n}" for n in
                         ("keys", "errors", "model", "validate", "expand", "load", "derive")}
    outside = {t for ts in spec.values() for t in ts if not t.startswith(f"{PACKAGE}.spec")}
    assert outside <= {f"{PACKAGE}.tasks"}, outside
