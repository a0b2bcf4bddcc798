"""The code's shape as a specification: the checked folders hold no file over 600 lines, no function over 80, no
module docstring over 20 and no import cycle; and the tool that measures it (benchmarks/code_shape.py) counts
what it says it counts.

CHECKED is what is held to the limits: None, the whole tree outside tests/ and benchmarks/ (a list of folders and
files narrows it).
"""
from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("code_shape", ROOT / "benchmarks" / "code_shape.py")
code_shape = importlib.util.module_from_spec(_spec)
sys.modules["code_shape"] = code_shape  # dataclasses look their module up by name
_spec.loader.exec_module(code_shape)

CHECKED: list[str] | None = None  # the whole tree outside tests/ and benchmarks/


@pytest.fixture(scope="module")
def tree_shape():
    return code_shape.measure(ROOT, CHECKED)


def test_every_checked_path_exists():
    assert all((ROOT / p).exists() for p in CHECKED or []), [p for p in CHECKED or [] if not (ROOT / p).exists()]


def test_no_checked_file_is_over_600_lines(tree_shape):
    over = tree_shape.describe(("files",))
    assert not over, "over the limit:\n" + "\n".join(over)


def test_no_checked_function_is_over_80_lines(tree_shape):
    over = tree_shape.describe(("functions",))
    assert not over, "over the limit:\n" + "\n".join(over)


def test_no_checked_module_docstring_is_over_20_lines(tree_shape):
    over = tree_shape.describe(("docstrings",))
    assert not over, "over the limit:\n" + "\n".join(over)


def test_no_checked_module_is_on_an_import_cycle(tree_shape):
    over = tree_shape.describe(("cycles",))
    assert not over, "over the limit:\n" + "\n".join(over)


# ---------------------------------------------------------------- the tool's counting, on synthetic trees


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def function_source(name: str, body_lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(body_lines))
    return f"{indent}def {name}():\n{body}"


def test_total_lines_and_file_count_cover_the_package_but_not_tests_or_benchmarks(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "a = 1\nb = 2\n", "setup.py": "x = 1\n",
                     "tests/test_a.py": "x = 1\n" * 700, "benchmarks/b.py": "x = 1\n" * 700,
                     ".venv/lib/c.py": "x = 1\n" * 700})
    shape = code_shape.measure(tmp_path)
    assert (shape.files, shape.total_lines, shape.long_files) == (3, 3, [])


def test_a_file_over_the_limit_is_listed_with_its_line_count(tmp_path):
    write(tmp_path, {"pkg/big.py": "x = 1\n" * 601, "pkg/edge.py": "x = 1\n" * 600})
    shape = code_shape.measure(tmp_path)
    assert [(s.path, s.lines) for s in shape.long_files] == [("pkg/big.py", 601)]


def test_a_function_is_measured_from_its_def_line_to_its_last_line(tmp_path):
    # def line + 80 body lines = 81 lines; def line + 79 = 80 lines (at the limit, not over)
    write(tmp_path, {"m.py": function_source("over", 80) + function_source("at_limit", 79)})
    [over] = code_shape.measure(tmp_path).long_functions
    assert (over.name, over.line, over.lines) == ("over", 1, 81)


def test_a_nested_function_is_measured_on_its_own_and_inside_its_outer_function(tmp_path):
    source = "class C:\n    def method(self):\n" + function_source("inner", 85, indent="        ")
    write(tmp_path, {"m.py": source})
    found = {s.name: s.lines for s in code_shape.measure(tmp_path).long_functions}
    assert found == {"C.method": 87, "C.method.inner": 86}


def test_async_functions_count_too(tmp_path):
    write(tmp_path, {"m.py": "async " + function_source("serve", 81)})
    assert [s.name for s in code_shape.measure(tmp_path).long_functions] == ["serve"]


def test_a_module_docstring_is_measured_by_the_lines_it_spans(tmp_path):
    long_doc = '"""One.\n' + "more\n" * 19 + '"""\nx = 1\n'  # 21 lines
    short_doc = '"""One.\n' + "more\n" * 18 + '"""\n'  # 20 lines
    write(tmp_path, {"long.py": long_doc, "short.py": short_doc, "none.py": "x = 1\n'''not a docstring'''\n"})
    shape = code_shape.measure(tmp_path)
    assert [(s.path, s.lines) for s in shape.long_docstrings] == [("long.py", 21)]


def test_an_import_cycle_through_a_function_level_import_is_found(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from . import b\n",
                     "pkg/b.py": "def f():\n    from .a import thing\n"})
    assert code_shape.measure(tmp_path).cycles == [["pkg.a", "pkg.b", "pkg.a"]]


def test_absolute_imports_and_longer_cycles_are_followed(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "import pkg.b\n", "pkg/b.py": "from pkg.c import x\n",
                     "pkg/c.py": "from pkg import a\n"})
    assert code_shape.measure(tmp_path).cycles == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_type_checking_imports_make_no_cycle(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from . import b\n",
                     "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n"})
    assert code_shape.measure(tmp_path).cycles == []


def test_importing_a_name_from_a_package_is_an_edge_to_the_package_not_its_submodules(tmp_path):
    # pkg/__init__ imports a; a imports the name `helper` from pkg: a real cycle pkg -> pkg.a -> pkg
    write(tmp_path, {"pkg/__init__.py": "from .a import run\nhelper = 1\n", "pkg/a.py": "from pkg import helper\n",
                     "pkg/b.py": "from pkg import a\n"})
    assert code_shape.measure(tmp_path).cycles == [["pkg", "pkg.a", "pkg"]]


def test_importing_a_submodule_runs_the_packages_above_it(tmp_path):
    # pkg/sub/__init__ imports pkg.a, and pkg.a imports pkg.sub.x: running pkg/sub/__init__ first closes a cycle
    write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg.sub.x import y\n",
                     "pkg/sub/__init__.py": "from pkg import a\n", "pkg/sub/x.py": "y = 1\n"})
    assert code_shape.measure(tmp_path).cycles == [["pkg.a", "pkg.sub", "pkg.a"]]


def test_a_module_importing_a_sibling_makes_no_edge_to_its_own_package(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "from .a import run\n", "pkg/a.py": "from pkg.b import x\nrun = 1\n",
                     "pkg/b.py": "x = 1\n"})
    assert code_shape.measure(tmp_path).cycles == []


def test_a_compiled_submodule_is_a_leaf_not_the_package(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "from .walk import run\n", "pkg/walk.py": "from . import _native\n",
                     "pkg/_native.cpython-311-x86_64-linux-gnu.so": ""})
    assert code_shape.measure(tmp_path).cycles == []


def test_module_names_follow_the_package_dir_mapping_of_pyproject(tmp_path):
    write(tmp_path, {"pyproject.toml": '[tool.setuptools]\npackage-dir = { "pkg" = "pkg", "pkg.engine" = "engine" }\n',
                     "pkg/__init__.py": "", "pkg/api.py": "from pkg.engine.loop import run\n",
                     "engine/__init__.py": "", "engine/loop.py": "from ..api import entry\n"})
    assert code_shape.measure(tmp_path).cycles == [["pkg.api", "pkg.engine.loop", "pkg.api"]]


def test_a_cycle_is_reported_when_any_of_its_modules_is_checked(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/x/__init__.py": "", "pkg/x/a.py": "from pkg.y import b\n",
                     "pkg/y/__init__.py": "", "pkg/y/b.py": "from pkg.x import a\n", "pkg/z/__init__.py": ""})
    assert len(code_shape.measure(tmp_path, ["pkg/x"]).cycles) == 1
    assert code_shape.measure(tmp_path, ["pkg/z"]).cycles == []


def test_every_module_of_a_tangle_is_on_a_reported_cycle(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from . import b, c\n", "pkg/b.py": "from . import a\n",
                     "pkg/c.py": "from . import a\n"})
    cycles = code_shape.measure(tmp_path).cycles
    assert sorted(cycles) == [["pkg.a", "pkg.b", "pkg.a"], ["pkg.a", "pkg.c", "pkg.a"]]


def test_json_output_and_check_exit_status(tmp_path, capsys):
    write(tmp_path, {"m.py": function_source("long", 90)})
    assert code_shape.main(["--root", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["violations"] == 1 and report["long_functions"][0]["name"] == "long"
    assert code_shape.main(["--root", str(tmp_path), "--check"]) == 1
    assert code_shape.main(["--root", str(tmp_path), "--check", "--max-function-lines", "91"]) == 0
