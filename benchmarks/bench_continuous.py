"""Continuous batching vs static batches, counted: forwards spent, request rows served, occupancy; wall time too.

    python benchmarks/bench_continuous.py --n 24 --slots 8            # bundled model, held-out requests, greedy

Static: the requests in consecutive batches of `--slots` through `LLMEngine.generate`, each batch running until its
slowest request ends. Continuous: one `LLMEngine` with `SchedulerConfig(max_num_seqs=slots)`, every request added
at step 0, `step()` until all ended (a freed slot is refilled at the next step). Both use the same packed forward,
so each request's output (and forward count) is the same; the script checks it. Occupancy = request rows served /
(forwards x slots).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.scheduler import SchedulerConfig
from dllm_constrain.engine.state import Request, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--policy", default="threshold")
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)

    from dllm_constrain.api import LLM
    from dllm_constrain.train.data import ExampleGenerator

    llm = LLM(None)
    examples = ExampleGenerator(10007, plain_text_share=0.0).examples(args.n)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, block_length=args.block_length,
                            steps=args.max_new_tokens, policy=args.policy, threshold=args.threshold)
    requests = [Request(llm.encode(llm.format(e["request"], e["schema"])), params) for e in examples]

    def run_static():
        results, forwards, tokens = [], 0, 0
        for i in range(0, len(requests), args.slots):
            engine = LLMEngine(llm.model, llm.tokenizer)
            results += engine.generate(requests[i:i + args.slots])
            forwards += engine.runner.stats.forwards
            tokens += engine.runner.stats.token_rows
        return results, forwards, tokens

    def run_continuous():
        engine = LLMEngine(llm.model, llm.tokenizer, scheduler_config=SchedulerConfig(max_num_seqs=args.slots))
        ids = [engine.add_request(r) for r in requests]
        done = {}
        while engine.has_unfinished():
            done.update({o.request_id: o.result for o in engine.step()})
        return [done[i] for i in ids], engine.forward_stats.forwards, engine.forward_stats.token_rows

    times: dict[str, list[float]] = {"static": [], "continuous": []}
    out = {}
    for _ in range(args.runs):  # alternating, so the machine's load moves both alike
        for name, fn in (("static", run_static), ("continuous", run_continuous)):
            t = time.perf_counter()
            out[name] = fn()
            times[name].append(time.perf_counter() - t)

    static, continuous = out["static"][0], out["continuous"][0]
    rows = sum(r.nfe for r in static)
    same = sum(a.canvas_ids == b.canvas_ids and a.nfe == b.nfe for a, b in zip(static, continuous))
    print(f"{args.n} requests, {args.slots} slots, policy {args.policy}, canvas {args.max_new_tokens}")
    print(f"request rows (sum of NFE): {rows}; identical outputs: {same}/{len(static)}")
    for name in ("static", "continuous"):
        _, forwards, tokens = out[name]
        print(f"{name:>10}: {forwards} forwards, occupancy {rows / (forwards * args.slots):.1%}, {tokens} token rows, "
              f"median {statistics.median(times[name]):.1f} s over {args.runs} run(s)")


if __name__ == "__main__":
    main()
