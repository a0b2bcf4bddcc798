"""python -m dllm_constrain.evals {jsonschemabench,test-suite} ...

  jsonschemabench --data DIR [--subsets A,B] [--n N] [--tokenizer PATH|bytes] --out DIR [--generate]
                  [--model PATH] [--engines ours,llguidance,xgrammar,outlines] [--timeout S]
  test-suite      --data DIR [--tokenizer PATH|bytes] [--out DIR] [--engines ...] [--timeout S]

Both print the Markdown summary at the end and write OUT/{results.jsonl, summary.md, summary.json, *.png}.
Re-running the same command resumes (schemas already in OUT/results.jsonl are skipped).
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from . import data as D
from .engines import engine_label
from .runner import run
from .tok import resolve_tokenizer


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", default=None,
                   help="folder with tokenizer.json, or 'bytes' (256 one-byte tokens + EOS); "
                        "default: the bundled model's tokenizer, else 'bytes'")
    p.add_argument("--engines", default="ours",
                   help="comma-separated: ours, llguidance, xgrammar, outlines (the last three when installed), "
                        "or module:factory / file.py:factory")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds per schema for compilation, and as much again for walking its instances")
    p.add_argument("--max-tokens", type=int, default=10000, help="walk at most this many tokens of an instance")
    p.add_argument("--mem-limit-gb", type=float, default=6.0, help="RSS limit of an engine worker")
    p.add_argument("--in-process", action="store_true",
                   help="run the engines in this process: no per-schema kill on timeout or memory (debugging, tiny runs)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="do not print the summary")
    p.add_argument("--fail-on-under-constraint", action="store_true",
                   help="exit with status 1 when any engine accepted an invalid instance (for CI)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dllm_constrain.evals",
                                 description="JSON-schema validation evals: JSONSchemaBench and the JSON-Schema-Test-Suite.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    j = sub.add_parser("jsonschemabench", help="coverage, over/under-constraint, compile/mask time, generation")
    j.add_argument("--data", required=True, help="per-subset JSONL folder, or one folder per subset of .json schemas")
    j.add_argument("--subsets", default="", help="comma-separated subset names (default: all in --data)")
    j.add_argument("--n", type=int, default=0, help="schemas per subset, sampled with --seed (0 = all)")
    j.add_argument("--seed", type=int, default=0)
    j.add_argument("--all-schemas", action="store_true",
                   help="also sample schemas without any valid instance (default: only schemas with one, as MaskBench)")
    j.add_argument("--out", required=True)
    j.add_argument("--generate", action="store_true", help="also generate under each compiled schema (ours)")
    j.add_argument("--model", default=None, help="checkpoint folder for --generate (default: the bundled model)")
    j.add_argument("--gen-max-new-tokens", type=int, default=256)
    j.add_argument("--gen-policy", default="threshold")
    j.add_argument("--gen-block-length", type=int, default=32)
    j.add_argument("--gen-timeout", type=float, default=300.0, help="seconds per generation")
    _common(j)
    t = sub.add_parser("test-suite", help="JSON-Schema-Test-Suite draft 2020-12, the JSONSchemaBench paper's rule")
    t.add_argument("--data", required=True, help="the suite root (with tests/draft2020-12) or the draft2020-12 folder")
    t.add_argument("--out", default="eval-results/test-suite")
    _common(t)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    command = "python -m dllm_constrain.evals " + " ".join(shlex.quote(a) for a in argv)
    try:
        tokdir, tokname = resolve_tokenizer(args.tokenizer)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    meta = {"command": command, "data": str(Path(args.data).resolve())}
    try:
        if args.cmd == "jsonschemabench":
            records = D.load_jsonschemabench(args.data, [s for s in args.subsets.split(",") if s.strip()], args.n,
                                              args.seed, require_valid=not args.all_schemas)
            model = None
            if args.generate:
                model = args.model
                if model is None:
                    from dllm_constrain.api import bundled_model_path

                    if not (bundled_model_path() / "config.json").is_file():
                        print("error: --generate needs a model: no bundled model is installed (config.json "
                              "missing; train it with `python -m dllm_constrain.train`) - pass --model PATH",
                              file=sys.stderr)
                        return 2
                else:
                    model = str(Path(model).resolve())
            gen_params = {"max_new_tokens": args.gen_max_new_tokens, "policy": args.gen_policy,
                          "block_length": args.gen_block_length, "temperature": 0.0, "seed": 0}
            res = run("jsonschemabench", records, engines, tokdir, tokname, Path(args.out), timeout=args.timeout,
                      max_tokens=args.max_tokens, mem_limit_gb=args.mem_limit_gb, generate=args.generate, model=model,
                      gen_params=gen_params, gen_timeout=args.gen_timeout, progress=not args.no_progress,
                      meta_extra=meta, plots=not args.no_plots, isolate=not args.in_process)
        else:
            records, left_out = D.load_test_suite(args.data)
            meta["left_out"] = f"{len(left_out)} cases (format.json, refRemote.json, remote $ref)"
            res = run("test-suite", records, engines, tokdir, tokname, Path(args.out), timeout=args.timeout,
                      max_tokens=args.max_tokens, mem_limit_gb=args.mem_limit_gb, progress=not args.no_progress,
                      meta_extra=meta, plots=not args.no_plots, isolate=not args.in_process)
    except D.DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(res["markdown"])
        print(f"[evals] wrote {Path(args.out) / 'summary.md'}")
    if res.get("failed_engines"):
        print(f"error: engine(s) failed to start: {', '.join(res['failed_engines'])}", file=sys.stderr)
        return 1
    if args.fail_on_under_constraint:
        from .report import row_stats

        if any(row_stats(r)["under"] for r in res["rows"]):
            return 1
    return 0


__all__ = ["main", "build_parser", "engine_label"]
