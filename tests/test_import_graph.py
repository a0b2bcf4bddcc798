"""The package's modules import one another without a circle, deferred (in-function) imports included.

The graph is built statically (ast), so an import moved inside a function to dodge a circle at load time still
counts: a deferred import hides a circle, it does not remove one. An edge goes from a module to each package module
it names: `from pkg import name` points at `pkg.name` when that is a module, else at `pkg` (its __init__.py).
The package's import names map onto folders as pyproject.toml's package-dir says (dllm_constrain.engine is engine/).
CHECKED lists the parts whose circles are tested; a circle is reported as its modules' files in order.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# import prefix -> folder (pyproject.toml [tool.setuptools] package-dir)
PACKAGE_DIRS = {"dllm_constrain": "dllm_constrain", "dllm_constrain.engine": "engine",
                "dllm_constrain.kernels": "kernels", "dllm_constrain.evals": "evals",
                "dllm_constrain.grammars": "grammars"}
# the parts of the package checked for circles (module-name prefixes); a circle through any of them fails
CHECKED = ("dllm_constrain.constraints", "dllm_constrain.vllm_plugin", "dllm_constrain.kernels",
           "dllm_constrain.errors")


def module_files() -> dict[str, Path]:
    """Module name -> source file, for every .py file of the package's folders."""
    modules: dict[str, Path] = {}
    for prefix, folder in PACKAGE_DIRS.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([prefix, *parts])
            if any(name.startswith(p + ".") for p in PACKAGE_DIRS if p != prefix and p.startswith(prefix + ".")):
                continue  # a folder mapped to its own import name elsewhere
            modules[name] = path
    return modules


def _resolve(module: str, path: Path, level: int, target: str | None) -> str:
    """The absolute module name of a (possibly relative) import written in `module`'s file."""
    if level == 0:
        return target or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{target}" if target else package


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules `module` imports anywhere in its file (top level, in functions, under TYPE_CHECKING
    excepted: those never run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node.level, node.module)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan's algorithm, iterative), each
    as the path of modules that closes it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return [_circle_in(graph, c) for c in components]


def _circle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest circle through the component's first module (breadth first inside the component)."""
    start = min(component)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for succ in sorted(graph[node] & component):
                if succ == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, node, start]
                if succ not in parent:
                    parent[succ] = node
                    nxt.append(succ)
        frontier = nxt
    raise AssertionError(f"no circle in component {sorted(component)}")


def _describe(circle: list[str], files: dict[str, Path]) -> str:
    return " -> ".join(str(files[m].relative_to(ROOT)) for m in circle)


def test_a_deferred_import_counts_as_an_edge(tmp_path: Path) -> None:
    src = tmp_path / "a.py"
    src.write_text("def f():\n    from .b import g\n    return g\n", encoding="utf-8")
    assert imports_of("pkg.a", src, {"pkg.a": src, "pkg.b": tmp_path / "b.py"}) == {"pkg.b"}


def test_an_import_under_type_checking_is_not_an_edge(tmp_path: Path) -> None:
    src = tmp_path / "a.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import g\n", encoding="utf-8")
    assert imports_of("pkg.a", src, {"pkg.a": src, "pkg.b": tmp_path / "b.py"}) == set()


def test_a_circle_is_found_and_reported_in_order() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("part", CHECKED)
def test_no_import_circle_runs_through_the_part(part: str) -> None:
    files = module_files()
    circles = [c for c in find_cycles(import_graph())
               if any(m == part or m.startswith(part + ".") for m in c)]
    assert not circles, "import circles:\n" + "\n".join(_describe(c, files) for c in circles)
