"""The package's modules import one another without a circle, deferred (in-function) imports included.

The graph is built statically (ast), so an import moved inside a function to dodge a circle at load time still
counts: a deferred import hides a circle, it does not remove one. An edge goes from a module to each package module
it names: `from pkg import name` points at `pkg.name` when that is a module, else at `pkg` (its __init__.py).
The package's import names map onto folders as pyproject.toml's package-dir says (dllm_constrain.engine is engine/).
CHECKED lists the parts whose circles are tested (the whole package); a circle is reported as its files in order.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# import prefix -> folder (pyproject.toml [tool.setuptools] package-dir)
PACKAGE_DIRS = {"dllm_constrain": "dllm_constrain", "dllm_constrain.engine": "engine",
                "dllm_constrain.kernels": "kernels", "dllm_constrain.evals": "evals",
                "dllm_constrain.grammars": "grammars"}
# the parts of the package checked for circles (module-name prefixes): all of it
CHECKED = ("dllm_constrain",)


def module_files() -> dict[str, Path]:
    """Module name -> source file, for every .py file of the package's folders and every C extension (its .c
    source: a leaf, it imports no package module)."""
    modules: dict[str, Path] = {}
    for prefix, folder in PACKAGE_DIRS.items():
        base = ROOT / folder
        for path in sorted([*base.rglob("*.py"), *base.rglob("*.c")]):
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
    """The package modules `module` imports anywhere in its file (top level and in functions; not under
    TYPE_CHECKING: those never run). Importing `a.b.c` runs a/__init__.py and a/b/__init__.py first, so the packages
    above a target are edges too, except those above `module` itself (already imported when it runs) unless named."""
    if path.suffix == ".c":
        return set()
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
                found.add(name)  # named: an edge even to a package above `module` (its __init__'s names)
            name = name.rpartition(".")[0]
            while name and name != module and not module.startswith(name + "."):
                found.add(name)
                name = name.rpartition(".")[0]
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


def _knot(circle: list[str], graph: dict[str, set[str]], files: dict[str, Path]) -> str:
    """The circle, then every import edge inside its strongly connected set (one circle is shown per set)."""
    members = {m for c in find_cycles(graph) if c[0] == circle[0] for m in c}
    reach = _reachable(graph, circle[0])
    knot = sorted(m for m in reach if circle[0] in _reachable(graph, m)) or sorted(members)
    edges = [f"    {files[a].relative_to(ROOT)} -> {files[b].relative_to(ROOT)}"
             for a in knot for b in sorted(graph[a] & set(knot))]
    return _describe(circle, files) + "\n" + "\n".join(edges)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


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


def test_no_import_circle_in_the_package() -> None:
    files, graph = module_files(), import_graph()
    circles = [c for c in find_cycles(graph)
               if any(m == part or m.startswith(part + ".") for m in c for part in CHECKED)]
    assert not circles, "import circles:\n" + "\n".join(_knot(c, graph, files) for c in circles)


def test_the_graph_sees_the_package_map() -> None:
    graph = import_graph()
    assert "dllm_constrain.engine.llm_engine" in graph and "dllm_constrain.constraints._native" in graph
    assert "dllm_constrain.constraints.protocol" in graph["dllm_constrain.engine.structured_output"]
