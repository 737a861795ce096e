"""The engine's modules import each other without a circle: read from their source (every import that runs, at module
level or inside a function; those under ``if TYPE_CHECKING`` only name types and are left out)."""

from __future__ import annotations

import ast
from pathlib import Path

import commitenv.sim

SIM = Path(commitenv.sim.__file__).parent


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _run_time_imports(tree: ast.AST) -> set[str]:
    """Modules named by the imports of ``tree`` that run (``from a.b import c`` gives ``a.b`` and ``a.b.c``)."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def _module_name(p: Path) -> str:
    """The dotted name of the source file ``p`` under commitenv/sim/ (a subpackage's __init__: the subpackage)."""
    parts = p.relative_to(SIM).with_suffix("").parts
    return ".".join(("commitenv", "sim") + (parts[:-1] if parts[-1] == "__init__" else parts))


def _graph() -> dict[str, set[str]]:
    """sim module -> the sim modules it imports at run time (the package's __init__ left out: it re-exports; a
    subpackage, such as ``kernel``, counts under its own name and each of its modules under theirs)."""
    mods = {_module_name(p): p for p in SIM.rglob("*.py") if p != SIM / "__init__.py"}
    return {m: {d for d in _run_time_imports(ast.parse(p.read_text())) if d in mods and d != m}
            for m, p in mods.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def dfs(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (found := dfs(d)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := dfs(m)):
            return found
    return None


def test_the_cycle_finder_finds_a_circle_and_accepts_a_tree():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_type_checking_imports_are_left_out():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x.y\nelse:\n    import z\n"
                     "def f():\n    from q import r\n")
    assert _run_time_imports(tree) == {"typing", "typing.TYPE_CHECKING", "z", "q", "q.r"}


def test_no_import_circle_in_the_engine():
    graph = _graph()
    assert "commitenv.sim.states" in graph and "commitenv.sim.kernel.state" in graph["commitenv.sim.pool"]
    assert "commitenv.sim.kernel.layout" in graph["commitenv.sim.kernel.loop"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
