#!/usr/bin/env python3
"""How a compiled constraint's shared automaton grows over repeated requests of one schema, and where it stops.

    OMP_NUM_THREADS=1 taskset -c 0,1 python benchmarks/bench_automaton_growth.py --only wp_94 --calls 60
    OMP_NUM_THREADS=1 taskset -c 0,1 python benchmarks/bench_automaton_growth.py --only o360 --calls 12 \
        --explore-max-mb 0 --after 3          # the exploration allowance spent after 3 calls

Every request of a compiled constraint explores its automaton a budget at a time (canvas.py, "Expansion budget"),
and what it explores stays: the automaton is shared and never shrinks, up to the exploration allowance
(`set_algebra.EXPLORE_MAX_BYTES`, docs/constraints.md "Exploration allowance"). This sends the same request (the
bundled model, the benchmarks' prompt, one mask worker) `--calls` times with one compiled constraint of the
JSONSchemaBench sample (the schema whose id contains `--only`) and prints, every `--every` calls: the call's time, its
new token transitions, the automaton's DFA states and known transitions, its footprint estimate
(`TokenAutomaton.footprint_bytes`), the process's resident memory growth since the first call, whether the
compiled constraint is worn out (`CompiledConstraint.worn_out`), and whether the answer was accepted.
`--explore-max-mb` sets the allowance after the first `--after` calls.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_masks import DEFAULT_MIX, load_sample  # noqa: E402

PROMPT = "Write a JSON value for the schema."


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(HERE, "..", "..", "shared", "data", "jsonschemabench"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="wp_94", help="the first sampled schema whose id contains this")
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--every", type=int, default=1, help="print every this many calls (and the last)")
    ap.add_argument("--explore-max-mb", type=float, default=None, help="the exploration allowance, in MB")
    ap.add_argument("--after", type=int, default=0, help="calls before the allowance is set")
    args = ap.parse_args()
    if not os.path.isdir(args.data):
        print(f"no JSONSchemaBench data at {args.data}", file=sys.stderr)
        return 2

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.set_flush_denormal(True)
    import dllm_constrain as dc
    from dllm_constrain.engine.llm_engine import LLMEngine
    from dllm_constrain.engine.state import Request

    items = [it for it in load_sample(args.data, args.seed, {k: 4 for k in DEFAULT_MIX}) if args.only in it["id"]]
    if not items:
        print(f"no sampled schema's id contains {args.only!r}", file=sys.stderr)
        return 2
    llm = dc.LLM(None)
    engine = LLMEngine(llm.model, llm.tokenizer, config=replace(llm.engine.config, mask_workers=1))
    [request] = llm.processor.build(PROMPT, schema=items[0]["schema"]).make_requests()
    compiled = request.constraint
    print(f"# bench_automaton_growth: {items[0]['id']}, {args.calls} calls, one compiled constraint")
    print("| call | ms | new transitions | DFA states | known transitions | footprint MB | resident MB since call 0 "
          "| worn out | accepted |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = None
    for i in range(args.calls):
        if i == args.after and args.explore_max_mb is not None:
            compiled.algebra.explore_max_bytes = int(args.explore_max_mb * 2**20)
        known = compiled.ta.known_count
        t0 = time.perf_counter()
        [res] = engine.generate([Request(request.prompt_ids, request.params, compiled)], raise_errors=False)
        ms = 1e3 * (time.perf_counter() - t0)
        base = resident_mb() if base is None else base
        accepted = compiled.accepts_tokens(res.token_ids) if res.error is None else res.error
        if i % args.every == 0 or i == args.calls - 1:
            print(f"| {i} | {ms:.0f} | {compiled.ta.known_count - known} | {compiled.dfa.n_states} "
                  f"| {compiled.ta.known_count} | {compiled.ta.footprint_bytes() / 2**20:.1f} "
                  f"| {resident_mb() - base:+.0f} | {compiled.worn_out()} | {accepted} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
