#!/usr/bin/env python3
"""The code's shape, measured: the checks behind the project's size rules, over the Python source.

    python benchmarks/code_shape.py                 # the whole tree outside tests/ and benchmarks/
    python benchmarks/code_shape.py evals engine    # only these folders (or files)
    python benchmarks/code_shape.py --json          # the same as one JSON object
    python benchmarks/code_shape.py --check         # exit status 1 when anything is over a limit

Reports files over 600 lines, functions over 80 lines (a nested function is measured on its own as well as
inside the function around it), module docstrings over 20 lines, the import cycles between the package's
modules, and the total line count. The import graph is static (ast): every `import` / `from ... import`
anywhere in a module, in-function imports included, except those under `if TYPE_CHECKING:`; an import names
one module (`from pkg import mod` the submodule when it is one, else `pkg`), not the packages above it.
Module names come from pyproject.toml's `[tool.setuptools] package-dir` (engine/ is dllm_constrain.engine).
tests/test_code_shape.py holds the folders that must stay within the limits.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
from collections import deque
from dataclasses import asdict, dataclass, field
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the package-dir line is read by _PACKAGE_DIR below
    tomllib = None

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_DOCSTRING_LINES = 20
EXCLUDED_TOP = ("tests", "benchmarks")  # folders of the root left out of the default walk
_PACKAGE_DIR = re.compile(r"^package-dir\s*=\s*\{(.*)\}", re.MULTILINE)


@dataclass(frozen=True)
class Limits:
    file_lines: int = MAX_FILE_LINES
    function_lines: int = MAX_FUNCTION_LINES
    docstring_lines: int = MAX_DOCSTRING_LINES


@dataclass(frozen=True)
class Sized:
    """One thing over its limit: a file (name ""), a function (its qualified name) or a module docstring."""
    path: str
    name: str
    line: int
    lines: int


@dataclass
class Shape:
    files: int = 0
    total_lines: int = 0
    long_files: list[Sized] = field(default_factory=list)
    long_functions: list[Sized] = field(default_factory=list)
    long_docstrings: list[Sized] = field(default_factory=list)
    cycles: list[list[str]] = field(default_factory=list)  # each: modules in import order, the first repeated last

    @property
    def violations(self) -> int:
        return len(self.long_files) + len(self.long_functions) + len(self.long_docstrings) + len(self.cycles)

    def describe(self, kinds: tuple[str, ...] = ("files", "functions", "docstrings", "cycles")) -> list[str]:
        """One line per violation of the given kinds, for a failure message."""
        out = [f"file {s.path}: {s.lines} lines" for s in self.long_files if "files" in kinds]
        out += [f"function {s.path}:{s.line} {s.name}: {s.lines} lines" for s in self.long_functions
                if "functions" in kinds]
        out += [f"module docstring {s.path}: {s.lines} lines" for s in self.long_docstrings if "docstrings" in kinds]
        out += ["import cycle: " + " -> ".join(c) for c in self.cycles if "cycles" in kinds]
        return out


# ---------------------------------------------------------------- files and module names


def python_files(root: Path, paths: list[str] | None = None) -> list[Path]:
    """The .py files under `paths` (files or folders, relative to root); by default all outside tests/, benchmarks/.

    Hidden folders (.venv, .git), build outputs and caches are skipped.
    """
    starts = [root / p for p in paths] if paths else [root]
    found: set[Path] = set()
    for start in starts:
        if start.is_file():
            found.add(start)
            continue
        for dirpath, dirnames, filenames in os.walk(start):
            here = Path(dirpath)
            dirnames[:] = [d for d in dirnames if not _skipped_dir(root, here / d, d, explicit=bool(paths))]
            found.update(here / f for f in filenames if f.endswith(".py"))
    return sorted(found)


def _skipped_dir(root: Path, path: Path, name: str, explicit: bool) -> bool:
    if name.startswith(".") or name in ("__pycache__", "build", "dist") or name.endswith(".egg-info"):
        return True
    return not explicit and path.parent == root and name in EXCLUDED_TOP


def package_dirs(root: Path) -> dict[str, str]:
    """Import prefix -> folder relative to root, from pyproject.toml (a folder per top-level package otherwise)."""
    pyproject = root / "pyproject.toml"
    if pyproject.exists():
        text = pyproject.read_text(encoding="utf-8")
        if tomllib is not None:
            mapping = tomllib.loads(text).get("tool", {}).get("setuptools", {}).get("package-dir", {})
        else:
            line = _PACKAGE_DIR.search(text)
            mapping = dict(re.findall(r'"([^"]*)"\s*=\s*"([^"]*)"', line.group(1))) if line else {}
        if mapping:
            return {name: folder.strip("/") for name, folder in mapping.items() if name}
    return {p.name: p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def extension_modules(root: Path, dirs: dict[str, str]) -> frozenset[str]:
    """The import names of the package's compiled modules (`_native.cpython-311-x86_64-linux-gnu.so`)."""
    names = set()
    for prefix, folder in dirs.items():
        for path in (root / folder).glob("**/*"):
            suffix = next((s for s in EXTENSION_SUFFIXES if path.name.endswith(s)), None)
            if suffix and not any(part.startswith(".") for part in path.relative_to(root).parts):
                stem = path.with_name(path.name[: -len(suffix)])
                name = module_name(root, stem.with_suffix(".py"), dirs)
                if name:
                    names.add(name)
    return frozenset(names)


def module_name(root: Path, path: Path, dirs: dict[str, str]) -> str | None:
    """The dotted import name of a file of the package, or None for a file outside it (setup.py, a script)."""
    rel = path.relative_to(root).with_suffix("")
    best: tuple[int, str] | None = None
    for prefix, folder in dirs.items():
        fparts = Path(folder).parts
        if rel.parts[:len(fparts)] == fparts and (best is None or len(fparts) > best[0]):
            tail = rel.parts[len(fparts):]
            best = (len(fparts), ".".join([prefix, *tail]))
    if best is None:
        return None
    name = best[1]
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


# ---------------------------------------------------------------- per-file measures


def _qualified_functions(tree: ast.AST) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                out.append((name, child))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def long_functions(tree: ast.AST, path: str, limit: int) -> list[Sized]:
    """Functions longer than `limit` lines, from the `def` line to the last line of the body."""
    out = []
    for name, node in _qualified_functions(tree):
        lines = node.end_lineno - node.lineno + 1
        if lines > limit:
            out.append(Sized(path, name, node.lineno, lines))
    return out


def docstring_lines(tree: ast.Module) -> int:
    """Lines the module docstring spans in the file (0 without one)."""
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant) \
            and isinstance(tree.body[0].value.value, str):
        node = tree.body[0]
        return node.end_lineno - node.lineno + 1
    return 0


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_names(tree: ast.AST, module: str, is_package: bool) -> set[tuple[str, str]]:
    """What the module imports, as (name, fallback) pairs, relative imports resolved.

    `import a.b` gives (a.b, a.b); `from a import b` gives (a.b, a): the submodule a.b when it is one, else a.
    """
    names: set[tuple[str, str]] = set()
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                names.update((alias.name, alias.name) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = _resolve_from(child, package)
                if base:
                    names.update((f"{base}.{alias.name}" if alias.name != "*" else base, base)
                                 for alias in child.names)
            visit(child)

    visit(tree)
    return names


def _resolve_from(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".") if package else []
    if node.level - 1 > len(parts):
        return ""
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


# ---------------------------------------------------------------- import cycles


def import_graph(imports: dict[str, set[tuple[str, str]]], extensions: frozenset[str] = frozenset()
                 ) -> dict[str, set[str]]:
    """Module -> the package modules it imports (names outside the package are dropped).

    `extensions` are the package's compiled modules: known names (`from . import _native` names it, not the
    package), but leaves of the graph. Importing `a.b.c` runs a/__init__.py and a/b/__init__.py first, so the
    packages above a target are edges too, except those above the importing module itself (already running).
    """
    known = set(imports) | set(extensions)
    graph: dict[str, set[str]] = {}
    for module, pairs in imports.items():
        targets = {name if name in known else fallback for name, fallback in pairs}
        for target in list(targets):
            parent = target.rpartition(".")[0]
            while parent and parent != module and not module.startswith(parent + "."):
                targets.add(parent)
                parent = parent.rpartition(".")[0]
        graph[module] = (targets & set(imports)) - {module}
    return graph


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan, iterative) with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    members.append(top)
                    if top == node:
                        break
                if len(members) > 1:
                    out.append(sorted(members))
    return sorted(out)


def _shortest_cycle(graph: dict[str, set[str]], start: str, members: set[str]) -> list[str]:
    parent: dict[str, str] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node] & members):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if child not in seen:
                seen.add(child)
                parent[child] = node
                queue.append(child)
    return []


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """For every module on a cycle, the shortest import cycle through it; each distinct cycle once.

    Every module of every strongly connected component is on at least one listed cycle.
    """
    cycles: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    for members in _components(graph):
        for module in members:
            cycle = _shortest_cycle(graph, module, set(members))
            ring = cycle[:-1]
            pivot = ring.index(min(ring))
            canonical = tuple(ring[pivot:] + ring[:pivot])
            if canonical not in seen:
                seen.add(canonical)
                cycles.append([*canonical, canonical[0]])
    return cycles


# ---------------------------------------------------------------- the whole measure


def measure(root: Path = ROOT, paths: list[str] | None = None, limits: Limits = Limits()) -> Shape:
    """The shape of the files under `paths` (default: the tree outside tests/ and benchmarks/).

    Import cycles are found on the graph of every package module of the tree and reported when one of their
    modules lies under `paths`.
    """
    dirs = package_dirs(root)
    selected = python_files(root, paths)
    everything = set(python_files(root)) | set(selected)
    shape = Shape()
    imports: dict[str, set[tuple[str, str]]] = {}
    selected_modules: set[str] = set()
    for path in sorted(everything):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(text, filename=rel)
        module = module_name(root, path, dirs)
        if module is not None:
            imports[module] = imported_names(tree, module, path.name == "__init__.py")
        if path not in selected:
            continue
        if module is not None:
            selected_modules.add(module)
        lines = len(text.splitlines())
        shape.files += 1
        shape.total_lines += lines
        if lines > limits.file_lines:
            shape.long_files.append(Sized(rel, "", 1, lines))
        shape.long_functions += long_functions(tree, rel, limits.function_lines)
        doc = docstring_lines(tree)
        if doc > limits.docstring_lines:
            shape.long_docstrings.append(Sized(rel, "", 1, doc))
    shape.cycles = [c for c in import_cycles(import_graph(imports, extension_modules(root, dirs))) if selected_modules & set(c)]
    shape.long_files.sort(key=lambda s: -s.lines)
    shape.long_functions.sort(key=lambda s: -s.lines)
    shape.long_docstrings.sort(key=lambda s: -s.lines)
    return shape


def render(shape: Shape, limits: Limits) -> str:
    out = [f"{shape.files} files, {shape.total_lines} lines"]
    sections = [
        (f"files over {limits.file_lines} lines", [f"{s.lines:6d}  {s.path}" for s in shape.long_files]),
        (f"functions over {limits.function_lines} lines",
         [f"{s.lines:6d}  {s.path}:{s.line}  {s.name}" for s in shape.long_functions]),
        (f"module docstrings over {limits.docstring_lines} lines",
         [f"{s.lines:6d}  {s.path}" for s in shape.long_docstrings]),
        ("import cycles", [" -> ".join(c) for c in shape.cycles]),
    ]
    for title, rows in sections:
        out.append(f"\n{title}: {len(rows)}")
        out += [f"  {row}" for row in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", help="files or folders relative to --root (default: all but tests/, "
                                             "benchmarks/)")
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--check", action="store_true", help="exit status 1 when anything is over a limit")
    ap.add_argument("--max-file-lines", type=int, default=MAX_FILE_LINES)
    ap.add_argument("--max-function-lines", type=int, default=MAX_FUNCTION_LINES)
    ap.add_argument("--max-docstring-lines", type=int, default=MAX_DOCSTRING_LINES)
    args = ap.parse_args(argv)
    limits = Limits(args.max_file_lines, args.max_function_lines, args.max_docstring_lines)
    shape = measure(args.root.resolve(), args.paths or None, limits)
    if args.json:
        print(json.dumps({**asdict(shape), "limits": asdict(limits), "violations": shape.violations}, indent=1))
    else:
        print(render(shape, limits))
    return 1 if args.check and shape.violations else 0


if __name__ == "__main__":
    sys.exit(main())
