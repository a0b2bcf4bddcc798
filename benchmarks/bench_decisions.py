#!/usr/bin/env python3
"""Twenty typed questions answered jointly on one canvas vs one request per question (the bundled model).

    OMP_NUM_THREADS=1 python benchmarks/bench_decisions.py --repeats 5

Both ways go through `LLM.decide` with the same questions (10 predicates, 5 three-way choices with a two-token
label, 5 four-level scores) and generation options; "each" submits its 20 requests together, so the engine loop
batches them into shared forwards. Per way: forwards (the summed NFE of its requests: the model rows computed; for
"each" also the loop's forward calls, which batch rows), wall time (median of --repeats runs, the two ways
alternating so the machine's load hits both alike), and validity (every answer one of its labels, probabilities
summing to 1). "calls" and "token rows" are the engine loop's forward calls and the
token rows they ran (prompt and canvas tokens through the model; the last run). The bundled model is small and not trained on questions: the answers' quality is not the point.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

import dllm_constrain as dc
from dllm_constrain.decisions import Question

TEXT = ("Ada Lovelace was born in London in 1815. She wrote the first published algorithm for Babbage's Analytical "
        "Engine and died at 36.")


def questions() -> list[Question]:
    qs = [Question("predicate", f"Statement {i}: {s}") for i, s in enumerate([
        "Ada was born in London.", "Ada was born in Paris.", "Ada wrote an algorithm.", "Ada lived to 80.",
        "Babbage designed an engine.", "The text mentions 1815.", "The text mentions a ship.",
        "Ada is a person.", "Ada died young.", "The engine was analytical."])]
    qs += [Question("choice", f"Item {i}: which city?", options=("London", "Paris", "New York")) for i in range(5)]
    qs += [Question("score", f"Aspect {i}: how famous?", options=("not", "a little", "quite", "very"))
           for i in range(5)]
    return qs


def valid(result, qs: list[Question]) -> bool:
    return all(d.label in q.labels and math.isclose(sum(d.probabilities), 1.0, abs_tol=1e-9)
               for q, d in zip(qs, result.decisions))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--policy", default=None, help="commit policy (default: the checkpoint's)")
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    llm = dc.LLM()
    qs = questions()
    opts = {"seed": 0, **({"policy": args.policy} if args.policy else {})}
    llm.decide(TEXT, qs[:2], joint=True, **opts)  # warm: model, tokenizer tables
    runs: dict[str, list[float]] = {"joint": [], "each": []}
    last: dict[str, object] = {}
    calls: dict[str, tuple[int, int]] = {}
    for _ in range(args.repeats):
        for way in ("joint", "each"):
            before = llm.engine.forward_stats
            before = (before.forwards, before.token_rows)
            start = time.perf_counter()
            result = llm.decide(TEXT, qs, joint=way == "joint", **opts)
            runs[way].append(time.perf_counter() - start)
            after = llm.engine.forward_stats
            calls[way] = (after.forwards - before[0], after.token_rows - before[1])
            last[way] = result
    print(f"20 questions, {args.repeats} runs each (medians), policy {args.policy or 'checkpoint default'}")
    print(f"{'way':<6} {'forwards':>9} {'calls':>6} {'token rows':>11} {'wall s':>8} {'valid':>6}")
    for way in ("joint", "each"):
        r = last[way]
        print(f"{way:<6} {r.nfe:>9} {calls[way][0]:>6} {calls[way][1]:>11} {statistics.median(runs[way]):>8.3f} "
              f"{str(valid(r, qs)):>6}")
    ratio_f = last["joint"].nfe / last["each"].nfe
    ratio_t = statistics.median(runs["joint"]) / statistics.median(runs["each"])
    print(f"joint / each: forwards {ratio_f:.2f}x, wall time {ratio_t:.2f}x")
    agree = sum(a.label == b.label for a, b in zip(last["joint"].decisions, last["each"].decisions))
    print(f"answers equal in both ways: {agree}/20")


if __name__ == "__main__":
    main()
