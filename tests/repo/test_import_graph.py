"""The packages' import graph, read from the source (ast): no module imports itself through others (an import
cycle), and the library ``commitenv`` never imports the plug-in package ``commitenv_controllers``.

Every ``import`` and ``from ... import`` statement counts, at module level, inside functions and under
``if TYPE_CHECKING:`` alike: a cycle through any of them ties the modules' designs together. An import of
``a.b.c`` is an edge to the module ``a.b.c`` (its package ``__init__`` files run first, but they are not its
dependency); ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``."""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from helpers.paths import ROOT

PACKAGES = {"commitenv": ROOT / "commitenv", "commitenv_controllers": ROOT / "controllers" / "commitenv_controllers"}

# nothing is left out: the object loop's GPU <-> replica pair lives in tests/helpers/reference, outside the library
EXCLUDED: frozenset[str] = frozenset()


@dataclass
class ImportGraph:
    """Modules (dotted name -> source file) and, per module, the modules it imports with the line of each."""

    files: dict[str, Path]
    edges: dict[str, dict[str, int]] = field(default_factory=dict)


def module_name(top: str, root: Path, path: Path) -> str:
    """The dotted name of ``path`` under the package folder ``root`` named ``top``."""
    parts = [top, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(name: str, files: dict[str, Path]) -> str | None:
    """The innermost module of ours that ``name`` is or lies in (None: another distribution's)."""
    while name and name not in files:
        name = name.rpartition(".")[0]
    return name or None


def imported_names(tree: ast.AST, module: str, is_package: bool, files: dict[str, Path]) -> list[tuple[str, int]]:
    """(module imported, line) of every import statement in ``tree``, relative imports resolved against
    ``module``; only modules in ``files`` are kept."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names = [f"{source}.{a.name}" if f"{source}.{a.name}" in files else source for a in node.names]
        for n in names:
            target = _resolve(n, files)
            if target is not None and target != module:
                out.append((target, node.lineno))
    return out


def build_graph(packages: dict[str, Path] = PACKAGES) -> ImportGraph:
    """The import graph of every ``*.py`` file of ``packages`` (top-level name -> folder)."""
    files = {module_name(top, root, p): p for top, root in packages.items() for p in sorted(root.rglob("*.py"))}
    g = ImportGraph(files)
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        g.edges[mod] = {}
        for target, line in imported_names(tree, mod, path.name == "__init__.py", files):
            g.edges[mod].setdefault(target, line)
    return g


def strongly_connected(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out)


def shortest_cycle(edges: dict[str, dict[str, int]], start: str, within: set[str]) -> list[str]:
    """The shortest chain of imports from ``start`` back to itself through modules of ``within`` (breadth first)."""
    prev: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(edges[v]):
            if w not in within:
                continue
            if w == start:
                chain = [v]
                while chain[-1] != start:
                    chain.append(prev[chain[-1]])
                return [start, *reversed(chain[:-1]), start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return []


def cycle_text(g: ImportGraph, chain: list[str]) -> str:
    """``a -> b (line 12) -> a (line 40)``: each import of the chain with its line in the importing file."""
    parts = [chain[0]]
    for a, b in zip(chain, chain[1:]):
        parts.append(f"{b} ({g.files[a].relative_to(ROOT)}:{g.edges[a][b]})")
    return " -> ".join(parts)


def import_cycles(g: ImportGraph) -> list[str]:
    """One shortest cycle per strongly connected component, as text, leaving out the one of `EXCLUDED`."""
    out = []
    for comp in strongly_connected(g.edges):
        if set(comp) == EXCLUDED:
            continue
        out.append(cycle_text(g, shortest_cycle(g.edges, comp[0], set(comp))) + f"  [component: {', '.join(comp)}]")
    return out


# ------------------------------------------------------------------------------------------ the finder itself
def _write_package(root: Path, sources: dict[str, str]) -> Path:
    for rel, text in sources.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_finder_sees_function_level_relative_and_type_checking_imports(tmp_path):
    """A hand-made package: a -> b at module level, b -> c inside a function, c -> a under TYPE_CHECKING through
    a relative import; d imports a only. The one cycle is a -> b -> c -> a; d is outside it."""
    pkg = _write_package(tmp_path / "pkg", {
        "__init__.py": "",
        "a.py": "from pkg import b\n",
        "b.py": "def f():\n    import pkg.sub.c\n",
        "sub/__init__.py": "",
        "sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import a\n",
        "d.py": "import os\nfrom pkg.a import something\n",
    })
    g = build_graph({"pkg": pkg})
    assert g.edges["pkg.a"] == {"pkg.b": 1}
    assert g.edges["pkg.b"] == {"pkg.sub.c": 2}
    assert g.edges["pkg.sub.c"] == {"pkg.a": 3}
    assert g.edges["pkg.d"] == {"pkg.a": 2}  # os is not ours; `from pkg.a import something` is pkg.a
    assert strongly_connected(g.edges) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    assert shortest_cycle(g.edges, "pkg.a", {"pkg.a", "pkg.b", "pkg.sub.c"}) == ["pkg.a", "pkg.b", "pkg.sub.c",
                                                                                 "pkg.a"]


def test_finder_without_cycles_and_with_a_package_init(tmp_path):
    """``from pkg import x`` where x is a name defined in ``pkg/__init__`` is an edge to pkg; a chain without a
    way back has no component."""
    pkg = _write_package(tmp_path / "pkg", {
        "__init__.py": "from pkg.core import VALUE\n",
        "core.py": "VALUE = 1\n",
        "user.py": "from pkg import VALUE\n",
    })
    g = build_graph({"pkg": pkg})
    assert g.edges["pkg"] == {"pkg.core": 1} and g.edges["pkg.user"] == {"pkg": 1}
    assert strongly_connected(g.edges) == []


# ------------------------------------------------------------------------------------------ the packages
def test_no_import_cycles():
    cycles = import_cycles(build_graph())
    assert not cycles, "import cycles (module -> imported module (file:line) ...):\n" + "\n".join(cycles)


def test_library_never_imports_the_plugin_package():
    g = build_graph()
    bad = [f"{g.files[m].relative_to(ROOT)}:{line} imports {t}" for m in sorted(g.edges)
           if m.split(".")[0] == "commitenv" for t, line in sorted(g.edges[m].items())
           if t.split(".")[0] == "commitenv_controllers"]
    assert not bad, "the library imports the plug-in package:\n" + "\n".join(bad)


def test_the_library_finds_the_plugin_folder_without_importing_it():
    """`commitenv._paths.package_dir` (what the reference cache key and the sandbox's read-only binds use) names
    the built-in controllers' folder, in a fresh process that then still has not imported them; an unknown
    package is a ModuleNotFoundError naming it."""
    import subprocess
    import sys

    import pytest

    code = ("import sys; from commitenv._paths import package_dir; print(package_dir('commitenv_controllers')); "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'commitenv_controllers']")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert got.returncode == 0, got.stderr
    assert Path(got.stdout.strip()).resolve() == PACKAGES["commitenv_controllers"].resolve()
    from commitenv._paths import package_dir

    with pytest.raises(ModuleNotFoundError, match="no_such_package_here"):
        package_dir("no_such_package_here")
