#!/usr/bin/env python3
"""What work on the other core does to a request's first forward (the prompt's) on the bundled model.

    OMP_NUM_THREADS=1 taskset -c 0,1 python benchmarks/bench_forward_contention.py
    OMP_NUM_THREADS=1 taskset -c 0,1 python benchmarks/bench_forward_contention.py --ms 10 50 --rounds 40

A cold constrained request compiles its schema, and explores the automaton for its first masks, beside its first
forward (`LLM.generate`, docs/constraints.md). This measures, on an unconstrained request so that nothing else
differs, how long that first forward takes while a thread started as it starts (as the engine starts the compile
thread: once the forward runs, so that the thread's Python does not hold up the Python that prepares its inputs) does,
for `--ms` milliseconds, one of:

  none     : nothing (the baseline of every other row);
  python   : a pure-Python arithmetic loop: holds the GIL, touches almost no memory;
  objects  : builds and drops 100,000 small tuples at a time: the allocation pattern of a compilation, without it;
  collector: passes of the cyclic garbage collector over the heap (`gc.collect()`): a walk over every object it
             tracks and has not frozen, as after a compilation (which collects its own young objects);
  compile  : compiles a JSON Schema again and again (the compile cache cleared before each), as the compile thread
             of a cold request does; a compilation under way when the time is up finishes (the schema below takes
             about 50 ms: its formats), so the table prints how long each kind actually worked.

The GIL-free forward (the model's TorchScript twin on torch's inter-op pool) runs on one core and the other thread
on the other, so what slows the forward is what the two cores share (the last-level cache, memory bandwidth), not
the GIL. Rounds alternate the kinds so that the machine's load moves them alike; per kind and duration the median
and the minimum first-forward time over the rounds are printed, and the median's excess over `none`.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from dataclasses import replace
from typing import Any, Callable

# nested objects, enums, patterns, formats and bounds: a schema of the kind the sample's cold requests compile
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "email": {"type": "string", "format": "email"},
        "created": {"type": "string", "format": "date-time"},
        "status": {"enum": ["draft", "active", "suspended", "closed"]},
        "score": {"type": "number", "minimum": 0, "maximum": 100, "multipleOf": 0.5},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 5, "uniqueItems": True},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                "country": {"enum": ["US", "CA", "GB", "FR", "DE", "JP"]},
            },
            "required": ["street", "city", "country"],
            "additionalProperties": False,
        },
        "contacts": {
            "type": "array",
            "items": {"oneOf": [
                {"type": "object", "properties": {"kind": {"const": "phone"}, "number": {"type": "string"}},
                 "required": ["kind", "number"], "additionalProperties": False},
                {"type": "object", "properties": {"kind": {"const": "url"}, "href": {"type": "string", "format": "uri"}},
                 "required": ["kind", "href"], "additionalProperties": False},
            ]},
            "maxItems": 3,
        },
    },
    "required": ["id", "name", "status", "address"],
    "additionalProperties": False,
}


def python_loop(until: float) -> None:
    x = 0
    while time.perf_counter() < until:
        for i in range(200):
            x += i * i


def object_churn(until: float) -> None:
    while time.perf_counter() < until:
        items = [(i, i + 1.0) for i in range(100_000)]
        del items


def collector_passes(until: float) -> None:
    while time.perf_counter() < until:
        gc.collect()


def compile_loop(llm: Any) -> Callable[[float], None]:
    from dllm_constrain.constraints import clear_cache

    def run(until: float) -> None:
        while time.perf_counter() < until:
            clear_cache()
            [req] = llm.processor.build("x", schema=SCHEMA).make_requests()
            req.constraint_state()

    return run


def busy(work: Callable[[float], None], ms: float, spent: list[float]) -> None:
    """Run `work` until `ms` from now (a compilation under way finishes first), recording how long it ran."""
    start = time.perf_counter()
    work(start + ms / 1e3)
    spent.append(1e3 * (time.perf_counter() - start))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", type=float, nargs="+", default=[50.0],
                    help="how long the other thread works, from the call's start (milliseconds)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--prompt-repeats", type=int, default=12,
                    help="the prompt is a sentence this many times (about 28 tokens each with the schema's sketch "
                         "once): 12 gives a first forward like the sample's cold requests' (40-50 ms)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.set_flush_denormal(True)
    import dllm_constrain as dc
    from dllm_constrain.engine.llm_engine import LLMEngine
    from dllm_constrain.engine.mask_workers import MaskTiming
    from dllm_constrain.engine.model_runner import ModelRunner
    from dllm_constrain.engine.state import Request

    llm = dc.LLM(None)
    engine = LLMEngine(llm.model, llm.tokenizer, config=replace(llm.engine.config, mask_workers=1))
    prompt = " ".join(["Write a JSON record for a customer with an address and contacts."] * args.prompt_repeats)
    [probe] = llm.processor.build(prompt, schema=SCHEMA, max_new_tokens=32).make_requests()
    free = Request(probe.prompt_ids, replace(probe.params, constraint=None), None)

    firsts: list[float] = []
    add_forward = MaskTiming.add_forward

    def timed_forward(self: MaskTiming, start: float, end: float, refresh: bool = False) -> None:
        firsts.append(end - start)
        add_forward(self, start, end, refresh)

    MaskTiming.add_forward = timed_forward  # type: ignore[method-assign]
    beside: list[threading.Thread] = []  # the other thread of this call, started with its first forward
    start_rows = ModelRunner.start_rows

    def start_with_beside(self: ModelRunner, states: Any) -> Any:
        finish = start_rows(self, states)
        for worker in beside:
            if worker.ident is None:
                worker.start()
        return finish

    ModelRunner.start_rows = start_with_beside  # type: ignore[method-assign]
    kinds: dict[str, Callable[[float], None] | None] = {"none": None, "python": python_loop,
                                                        "objects": object_churn, "collector": collector_passes,
                                                        "compile": compile_loop(llm)}
    engine.generate([free])  # warm-up: the scripted forward, the allocator
    compile_loop(llm)(time.perf_counter() + 0.05)
    times: dict[tuple[str, float], list[float]] = {}
    busy_ms: dict[tuple[str, float], list[float]] = {}  # how long the other thread actually worked
    for _ in range(args.rounds):
        for ms in args.ms:
            for name, work in kinds.items():
                firsts.clear()
                beside.clear()
                spent: list[float] = []
                if work is not None:
                    beside.append(threading.Thread(target=busy, args=(work, ms, spent)))
                engine.generate([free])
                for worker in beside:
                    worker.join()
                times.setdefault((name, ms), []).append(1e3 * firsts[0])
                busy_ms.setdefault((name, ms), []).extend(spent)

    print(f"# bench_forward_contention: first forward of a {len(free.prompt_ids)}-token prompt, {args.rounds} rounds, "
          f"torch threads {torch.get_num_threads()}, cpu affinity {sorted(os.sched_getaffinity(0))}")
    print("| other thread | asked to work for | worked for (median) | first forward: median | min | median - none |")
    print("|---|---|---|---|---|---|")
    for ms in args.ms:
        base = statistics.median(times[("none", ms)])
        for name in kinds:
            xs = times[(name, ms)]
            med = statistics.median(xs)
            worked = f"{statistics.median(busy_ms[(name, ms)]):.1f} ms" if busy_ms.get((name, ms)) else "-"
            print(f"| {name} | {ms:.0f} ms | {worked} | {med:.2f} ms | {min(xs):.2f} ms | {med - base:+.2f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
