"""bench_step side by side: this tree's engine against another revision's, in one sitting, timed runs alternating.

    python benchmarks/bench_step_compare.py --before 58d77b7                  # B = 1, 8, 32, 64; 5 timed pairs
    python benchmarks/bench_step_compare.py --before ../old-worktree --pairs 3 --timed-batch 32

`--before` is a git revision (a worktree of it is made and removed: benchmarks/_revision_tree.py) or a worktree
folder (prepared the same way: compiled .so files copied in, package folders linked so `PYTHONPATH=<before>`
imports it whole). Each side runs in its own process: this tree's `benchmarks/bench_step.py` drives the engine
that side imports. A revision older than `engine/sync_counter.py` is counted by this tree's
counter and `host_sync` module, loaded under the package's names (`_count_with_this_tree`): the counter reads aten
ops, so it counts any revision's engine the same way. Each side's process checks the engine it imported comes from
the root it was given.

One counted run per side (bench_step's counted and timed passes, at every `--batches`), then `--pairs` timed-only
runs at `--timed-batch`, alternating which side goes first (the machine is shared: drift hits both sides alike).
Prints a table: per-step ops, launches, launches per layer, head passes, host syncs for each side and B; the growth
of ops per step from the first to the last B; tokens/s at `--timed-batch` per pair and the median after/before.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from _revision_tree import add_before_argument, with_before

ROOT = Path(__file__).resolve().parents[1]


def _count_with_this_tree() -> None:
    """Register this tree's host_sync and sync_counter modules under the package's names when the imported engine
    has none (a revision from before they existed)."""
    try:
        import dllm_constrain.engine.sync_counter  # noqa: F401
        return
    except ImportError:
        pass
    for name in ("host_sync", "sync_counter"):
        spec = importlib.util.spec_from_file_location(f"dllm_constrain.engine.{name}", ROOT / "engine" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)


def run_side(root: str, argv: list[str]) -> None:
    """In a side's process: check the imported engine is `root`'s, then bench_step's JSON on stdout."""
    import dllm_constrain.engine.llm_engine as engine_module

    where = Path(engine_module.__file__).resolve()
    if Path(root).resolve() not in where.parents:
        raise SystemExit(f"the engine imported from {where}, not from {root}")
    _count_with_this_tree()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_step

    report = bench_step.main([*argv, "--json"])
    del report  # printed by bench_step


def side(root: Path, this_tree: bool, argv: list[str]) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if not this_tree:
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--side", str(root), "--", *argv]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{'after' if this_tree else 'before'} side failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout)


def counts_table(before: dict[str, Any], after: dict[str, Any]) -> str:
    lines = ["| B | side | ops/step | launches/step | launches/layer | head passes/step | syncs/step (kinds) | "
             "tokens/s |", "|---:|---|---:|---:|---:|---:|---|---:|"]
    for b, a in zip(before["results"], after["results"]):
        for name, r in (("before", b), ("after", a)):
            s = r["per_step"]["all"]
            kinds = ", ".join(f"{k} {v:.2f}" for k, v in s["sync_kinds"].items())
            lines.append(f"| {r['batch']} | {name} | {s['ops']:.0f} | {s['launches']:.0f} | "
                         f"{s['launches_per_layer']:.1f} | {s['head_passes']:.2f} | {s['syncs']:.2f} ({kinds}) | "
                         f"{r['tokens_per_s']:.0f} |")
    return "\n".join(lines)


def growth(report: dict[str, Any]) -> str:
    first, last = report["results"][0], report["results"][-1]
    f, l_ = first["per_step"]["all"]["ops"], last["per_step"]["all"]["ops"]
    return f"{f:.0f} -> {l_:.0f} ops/step (x{l_ / f:.2f}) from B={first['batch']} to B={last['batch']}"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--side"]:
        rest = argv[2:]
        run_side(argv[1], rest[1:] if rest[:1] == ["--"] else rest)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_before_argument(ap)
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--pairs", type=int, default=5, help="alternating timed runs per side at --timed-batch")
    ap.add_argument("--timed-batch", type=int, default=32)
    ap.add_argument("--json", type=Path, help="also write every side's JSON here")
    with_before(ap.parse_args(argv), compare)


def compare(args: argparse.Namespace, before_tree: Path) -> None:
    before = side(before_tree, False, ["--batches", args.batches])
    after = side(ROOT, True, ["--batches", args.batches])
    print(counts_table(before, after))
    print(f"\nops/step growth before: {growth(before)}")
    print(f"ops/step growth after:  {growth(after)}")
    timed = ["--batches", str(args.timed_batch), "--no-count"]
    pairs = []
    for i in range(args.pairs):
        order = [("before", before_tree, False), ("after", ROOT, True)]
        runs = dict((name, side(root, mine, timed)["results"][0]["tokens_per_s"])
                    for name, root, mine in (order if i % 2 == 0 else order[::-1]))
        pairs.append(runs)
    print(f"\ncommitted tokens/s at B={args.timed_batch}, timed-only runs alternating (first: "
          "before, after, before, ...):\n| pair | before | after | after/before |\n|---:|---:|---:|---:|")
    for i, p in enumerate(pairs):
        print(f"| {i + 1} | {p['before']:.0f} | {p['after']:.0f} | {p['after'] / p['before']:.2f} |")
    ratio = statistics.median(p["after"] / p["before"] for p in pairs)
    print(f"median after/before: {ratio:.2f} ({len(pairs)} pairs; shared, loaded machine: a ratio, not a rate)")
    if args.json:
        args.json.write_text(json.dumps({"before": before, "after": after, "pairs": pairs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
