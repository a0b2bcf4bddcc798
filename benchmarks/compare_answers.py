"""The bundled model's held-out answers from this tree and from another revision's worktree, compared text by text.

    python benchmarks/compare_answers.py --before 58d77b7                  # 40 requests per run
    python benchmarks/compare_answers.py --before ../old-worktree --n 24 --temperature 0.7 --seed 11

The requests are `dllm_constrain.train.heldout`'s held-out split (phrasings training never produces, values at its
seed 10007), each with its schema. Three runs per side, each in its own process (`--before`: a git revision or a
worktree folder, as for bench_step_compare.py; imported through PYTHONPATH):
  constrained     `heldout.evaluate(constrained=True)`: one request per call, its schema the constraint;
  unconstrained   `heldout.evaluate()`: batches of 8 through one engine call, the schema's sketch in the prompt;
  sampled         each request under its schema at `--temperature`, `--seed`.
Decoding is the checkpoint's default (generation_config.json: threshold policy, 96 tokens, blocks of 32); greedy
runs are at temperature 0. Prints, per run, how many of the n answers are identical on both sides, and the first
few that differ.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from _revision_tree import add_before_argument, with_before

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("constrained", "unconstrained", "sampled")


def answers(run: str, n: int, temperature: float, seed: int) -> list[dict[str, Any]]:
    """In a side's process: the held-out requests' answers of one run."""
    from dllm_constrain.train import heldout

    if run == "sampled":
        return sampled_answers(n, temperature, seed)
    _, records = heldout.evaluate(n=n, constrained=run == "constrained", temperature=0.0)
    return [{"request": r["request"], "answer": r["answer"], "nfe": r["nfe"]} for r in records]


def sampled_answers(n: int, temperature: float, seed: int) -> list[dict[str, Any]]:
    """Each held-out request under its schema at `temperature` and `seed` (the answer does not depend on whether
    its schema compiles beside the first forward: tests/test_compile_timing_answers.py)."""
    from dllm_constrain.api import LLM
    from dllm_constrain.train import heldout
    from dllm_constrain.train.data import ExampleGenerator

    llm = LLM(None)
    out = []
    for e in ExampleGenerator(heldout.HELDOUT_SEED, plain_text_share=0.0, split="heldout").examples(n):
        [r] = llm.generate([e["request"]], schema=e["schema"], temperature=temperature, seed=seed)
        out.append({"request": e["request"], "answer": r.text, "nfe": r.nfe})
    return out


def side(root: Path, this_tree: bool, run: str, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if not this_tree:
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    code = ("import json, sys, dllm_constrain, dllm_constrain.engine.llm_engine as e; "
            f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import compare_answers as c; "
            f"print(json.dumps({{'package': dllm_constrain.__file__, 'engine': e.__file__, "
            f"'answers': c.answers({run!r}, {args.n}, {args.temperature}, {args.seed})}}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{run} on {root} failed:\n{out.stderr[-4000:]}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    where = Path(report["engine"]).resolve()
    if root.resolve() not in where.parents:
        raise SystemExit(f"{run}: the engine imported from {where}, not from {root}")
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_before_argument(ap)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--temperature", type=float, default=0.7, help="of the sampled run")
    ap.add_argument("--seed", type=int, default=11, help="of the sampled run")
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--json", type=Path, help="also write both sides' answers here")
    with_before(ap.parse_args(argv), compare)


def compare(args: argparse.Namespace, before_tree: Path) -> None:
    saved = {}
    print("| run | requests | identical | differ |\n|---|---:|---:|---:|")
    notes = []
    for run in args.runs.split(","):
        before = side(before_tree, False, run, args)["answers"]
        after = side(ROOT, True, run, args)["answers"]
        assert [b["request"] for b in before] == [a["request"] for a in after]
        same = [b["answer"] == a["answer"] for b, a in zip(before, after)]
        print(f"| {run} | {len(same)} | {sum(same)} | {len(same) - sum(same)} |")
        for i, (b, a) in enumerate(zip(before, after)):
            if b["answer"] != a["answer"] and len(notes) < 6:
                notes.append(f"{run} #{i}: before {b['answer']!r}\n{' ' * (len(run) + 4)}after  {a['answer']!r}")
        saved[run] = {"before": before, "after": after}
    if notes:
        print("\nfirst answers that differ:\n" + "\n".join(notes))
    if args.json:
        args.json.write_text(json.dumps(saved, indent=1) + "\n")


if __name__ == "__main__":
    main()
