#!/usr/bin/env python3
"""Compilation work on JSONSchemaBench: per schema the deadline checks a compilation passes (deadline.Deadline.spent,
the unit of compiler.COMPILE_WORK) and its wall time, so that the work limit can be set where the time limit was.

    python benchmarks/bench_compile_work.py --n-per-subset 8      # 8 schemas of each subset file (seeded shuffle)
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import sys
import time
import warnings
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    from bench_masks import SHARED, load_tokenizer

    from dllm_constrain.constraints import compiler as compiler_mod
    from dllm_constrain.constraints import deadline as deadline_mod
    from dllm_constrain.errors import DllmConstrainError

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(SHARED, "data", "jsonschemabench"))
    ap.add_argument("--tokenizer", default=os.path.join(SHARED, "data", "tokenizers", "bpe128k"))
    ap.add_argument("--n-per-subset", type=int, default=8)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    _, info = load_tokenizer(args.tokenizer)
    made: list = []
    real_init = deadline_mod.Deadline.__init__

    def init(self, *a, **k):  # remember the compilation's Deadline to read its count afterwards
        real_init(self, *a, **k)
        made.append(self)

    deadline_mod.Deadline.__init__ = init
    comp = compiler_mod.ConstraintCompiler(info, cache=False)
    rows = []
    for path in sorted(glob.glob(os.path.join(args.data, "*.jsonl"))):
        lines = open(path).read().splitlines()
        random.Random(0).shuffle(lines)
        for line in lines[:args.n_per_subset]:
            schema = json.loads(line)["schema"]
            made.clear()
            t0 = time.perf_counter()
            try:
                comp.compile(schema=schema)
                status = "ok"
            except DllmConstrainError as e:
                status = type(e).__name__
            rows.append((status, time.perf_counter() - t0, made[0].spent if made else 0))
    ok = [r for r in rows if r[0] == "ok"]
    checks = sorted(r[2] for r in ok)
    secs = sorted(r[1] for r in ok)
    q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
    print(f"schemas {len(rows)}, compiled {len(ok)}; refusals {dict(Counter(r[0] for r in rows if r[0] != 'ok'))}")
    print(f"checks p50 {q(checks, .5)} p99 {q(checks, .99)} max {checks[-1]};  seconds p50 {q(secs, .5):.3f} "
          f"p99 {q(secs, .99):.3f} max {secs[-1]:.3f};  checks per second {sum(checks) / sum(secs):.0f}; "
          f"COMPILE_WORK {compiler_mod.COMPILE_WORK}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
