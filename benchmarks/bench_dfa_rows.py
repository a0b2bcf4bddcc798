#!/usr/bin/env python3
"""What a DFA row costs to build: the derivative automaton's first rows of each schema, breadth-first.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/bench_dfa_rows.py                 # 2 schemas per subset
    python benchmarks/bench_dfa_rows.py --n-per-subset 4 --rows 3000 --runs 5

First exploration of a schema's automaton (the first requests' masks, the greedy continuation, the fit check) is
mostly building DFA rows by derivatives (`DerivDFA.expand`; the term algebra in C, `_terms.c`, or in Python with
DLLM_CONSTRAIN_NO_C=1: run both to compare them). For each schema of the bench_masks
sample (`--n-per-subset` per JSONSchemaBench subset), compiled afresh as `generate(prompt, schema=...)` compiles it,
the rows reachable from the start are built breadth-first until `--rows` states are queued; the figure is the
time per row over all schemas, median over `--runs` runs (each run compiles anew). To compare two layers, run
this on each in alternation and take the ratio pair by pair.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_masks import DEFAULT_MIX, load_sample  # noqa: E402


def build_rows(dfa, limit: int) -> int:
    """Expand the states reachable from START breadth-first until `limit` are queued; the number expanded."""
    from dllm_constrain.constraints.byte_dfa import DEAD, START

    seen = {START}
    queue = [START]
    i = 0
    while i < len(queue) and len(queue) < limit:
        s = queue[i]
        i += 1
        dfa.expand(s)
        for u in set(dfa.T[s].tolist()):
            if u != DEAD and u not in seen:
                seen.add(u)
                queue.append(u)
    return i


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(HERE, "..", "..", "shared", "data", "jsonschemabench"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-per-subset", type=int, default=2)
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if not os.path.isdir(args.data):
        print(f"no JSONSchemaBench data at {args.data}: nothing to measure")
        return 0
    import dllm_constrain as dc
    from dllm_constrain.constraints import clear_cache
    from dllm_constrain.errors import DllmConstrainError

    items = load_sample(args.data, args.seed, {k: args.n_per_subset for k in DEFAULT_MIX})
    llm = dc.LLM()
    per_row: list[float] = []
    for _ in range(args.runs):
        seconds, rows = 0.0, 0
        for item in items:
            clear_cache()
            try:
                [req] = llm.processor.build("x", schema=item["schema"]).make_requests()
            except DllmConstrainError:
                continue
            t0 = time.perf_counter()
            rows += build_rows(req.constraint.dfa, args.rows)
            seconds += time.perf_counter() - t0
        per_row.append(1e6 * seconds / max(1, rows))
        print(f"  run: {rows} rows in {seconds:.3f} s ({per_row[-1]:.1f} us per row)", flush=True)
    print(f"# bench_dfa_rows: {len(items)} schemas, up to {args.rows} rows each, {args.runs} runs: "
          f"median {statistics.median(per_row):.1f} us per row (min {min(per_row):.1f}, max {max(per_row):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
