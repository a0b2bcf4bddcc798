"""docs/architecture.md names every source file of the package folders, so a new module cannot go undocumented.

The doc's first code block is the tree: a line whose first word ends in `/` opens a folder, nested by two spaces
of indentation per level; a line indented by CONTINUATION_INDENT or more continues the entry above it. A file
counts as named when a word of its folder's block is its name (`canvas.py`) or its path below that folder
(`models/base.py` in engine/'s block), or when the doc names its path from the repository root anywhere.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
SOURCE_FOLDERS = ("dllm_constrain", "engine", "kernels", "grammars", "evals")
SOURCE_SUFFIXES = (".py", ".c")
CONTINUATION_INDENT = 20  # entries sit at 0, 2, 4, ... spaces; their descriptions continue from column 25
_FILE_WORD = re.compile(r"[\w./-]+\.(?:py|c)\b")


def source_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--", *SOURCE_FOLDERS], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    return sorted(p for p in listed if p.endswith(SOURCE_SUFFIXES))


def named_paths(doc: str) -> set[str]:
    """Repository paths the tree names: each file word joined to the folder whose block it is in."""
    tree = doc.split("```", 2)[1]
    named: set[str] = set()
    folders: list[tuple[int, str]] = []  # (indent, path) of the open folders, outermost first
    for line in tree.splitlines()[1:]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent < CONTINUATION_INDENT:
            while folders and folders[-1][0] >= indent:
                folders.pop()
            first = line.split()[0]
            if first.endswith("/"):
                parent = folders[-1][1] if folders else ""
                folders.append((indent, parent + first))
        parent = folders[-1][1] if folders else ""
        named.update(parent + word for word in _FILE_WORD.findall(line))
    return named


def test_the_doc_has_a_tree_naming_files():
    assert len(named_paths(DOC.read_text(encoding="utf-8"))) > 50


def test_every_source_file_is_named_in_the_architecture_doc():
    doc = DOC.read_text(encoding="utf-8")
    named = named_paths(doc)
    missing = [p for p in source_files() if p not in named and p not in doc]
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_a_file_named_outside_its_folder_block_does_not_count():
    doc = "```\nengine/   the engine\n  policies.py   commit policies\nkernels/   kernels\n  bitmask.py   masks\n```\n"
    named = named_paths(doc)
    assert {"engine/policies.py", "kernels/bitmask.py"} <= named
    assert "kernels/policies.py" not in named and "engine/bitmask.py" not in named
