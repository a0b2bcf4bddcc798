"""An earlier revision of this repository as an importable tree, for side-by-side benchmarks.

`revision_tree(rev)` makes a detached git worktree of `rev` in a temporary folder, copies this tree's compiled
extensions into it (the same sources at a nearby revision; an old tree without them falls back to its pure-Python
paths anyway), and links `dllm_constrain/engine`, `kernels`, `evals`, `grammars` to its top-level folders, so that
`PYTHONPATH=<tree>` imports the whole package from it (the editable install maps those names onto this tree's
folders, which would otherwise win for the subpackages). The worktree is removed on exit.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINKED = ("engine", "kernels", "evals", "grammars")


def prepare(tree: Path) -> None:
    """Make the worktree `tree` importable whole through PYTHONPATH (see the module docstring)."""
    for so in [*ROOT.glob("dllm_constrain/constraints/*.so"), *ROOT.glob("kernels/*.so")]:
        target = tree / so.relative_to(ROOT)
        if not target.exists():
            shutil.copy2(so, target)
    for name in LINKED:
        link = tree / "dllm_constrain" / name
        if (tree / name).is_dir() and not link.exists():
            link.symlink_to(Path("..") / name)


@contextmanager
def revision_tree(rev: str) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="rev-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), rev], check=True,
                   capture_output=True)
    try:
        prepare(folder)
        yield folder
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)], check=False,
                       capture_output=True)
        shutil.rmtree(folder.parent, ignore_errors=True)


BEFORE_HELP = "the earlier revision: a git revision (a worktree of it is made and removed) or a prepared worktree folder"


def add_before_argument(ap: argparse.ArgumentParser) -> None:
    """The `--before` option of a side-by-side benchmark."""
    ap.add_argument("--before", required=True, help=BEFORE_HELP)


def with_before(args: argparse.Namespace, compare: Callable[[argparse.Namespace, Path], None]) -> None:
    """`compare(args, tree)` with `tree` the importable earlier revision named by `args.before`."""
    if Path(args.before).is_dir():
        prepare(Path(args.before))
        compare(args, Path(args.before))
    else:
        with revision_tree(args.before) as tree:
            compare(args, tree)
