#!/usr/bin/env python3
"""Where a cold request's time goes beyond a warm one's: each forward, the compilation, the new token transitions
(by thread) and the collector's passes, for the requests of benchmarks/bench_constraint_overhead.py.

    OMP_NUM_THREADS=1 taskset -c 0,1 python benchmarks/bench_cold_cost.py              # 40 schemas, 2 passes
    OMP_NUM_THREADS=1 taskset -c 0,1 python benchmarks/bench_cold_cost.py --only o84331 --passes 8
    OMP_NUM_THREADS=1 taskset -c 0,1 python benchmarks/bench_cold_cost.py --per-schema    # and a row per schema

Per schema and pass: a cold call (compile cache cleared, the schema compiled on the LLM's compile thread beside the
request's first forward, as `LLM.generate` does), then a warm one (the same compiled constraint, a new canvas
state), one mask worker. The engine's own code is timed from outside: the forwards through `MaskTiming.add_forward`,
the compilation through `PendingConstraint`'s compile job, the token transitions through
`TokenAutomaton._compute_trans` (wrapped for the run; they are counted by the thread that computed them), the
collector through `gc.callbacks`, the loop thread's wait at the join of the masks computed beside a forward
(`MaskBatch.join`: what those masks took past the forward's end), and from `MaskTiming` the mask time outside the
forwards (the masks computed on the loop thread, and the part of the others past the forward). Means per call are
printed for cold and warm, and cold minus warm over the calls that took the same number of forwards both ways (the
others took other paths: their difference is not the cold cost).
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_masks import DEFAULT_MIX, load_sample  # noqa: E402

PROMPT = "Write a JSON value for the schema."


class Probe:
    """What the wrapped engine pieces recorded since the last `take()`."""

    def __init__(self) -> None:
        self.forwards: list[tuple[float, float]] = []
        self.compile_s = 0.0
        self.transitions: Counter = Counter()  # thread kind -> new token transitions
        self.transition_s: Counter = Counter()
        self.gc_s: Counter = Counter()  # thread kind -> seconds in collector passes
        self.join_s = 0.0  # the loop thread waiting for the masks computed beside the forward, after it ended
        self._gc_start: dict[int, float] = {}

    def take(self) -> dict[str, Any]:
        out = {"forwards": self.forwards, "compile_s": self.compile_s, "transitions": dict(self.transitions),
               "transition_s": dict(self.transition_s), "gc_s": dict(self.gc_s),
               "join_s": self.join_s}
        self.__init__()
        return out

    def on_gc(self, phase: str, info: dict) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._gc_start[me] = time.perf_counter()
        elif me in self._gc_start:
            self.gc_s[thread_kind()] += time.perf_counter() - self._gc_start.pop(me)


def thread_kind() -> str:
    name = threading.current_thread().name
    return "loop" if name == "MainThread" else "masks" if name.startswith("dllm-masks") else \
        "compile" if name.startswith("dllm-compile") else "other"


def instrument(probe: Probe) -> None:
    from dllm_constrain.constraints.token_automaton import TokenAutomaton
    from dllm_constrain.engine.mask_workers import MaskBatch, MaskTiming
    from dllm_constrain.engine.state import PendingConstraint

    add_forward, run, compute_trans = MaskTiming.add_forward, PendingConstraint._run, TokenAutomaton._compute_trans
    join = MaskBatch.join

    def timed_join(self, timing=None, forward=None):
        t0 = time.perf_counter()
        try:
            return join(self, timing, forward)
        finally:
            probe.join_s += time.perf_counter() - t0

    def timed_forward(self, start, end, refresh=False):
        probe.forwards.append((start, end))
        add_forward(self, start, end, refresh)

    def timed_run(self, *args):
        t0 = time.perf_counter()
        run(self, *args)
        probe.compile_s += time.perf_counter() - t0

    def timed_trans(self, s):
        t0 = time.perf_counter()
        out = compute_trans(self, s)
        kind = thread_kind()
        probe.transitions[kind] += 1
        probe.transition_s[kind] += time.perf_counter() - t0
        return out

    MaskTiming.add_forward, PendingConstraint._run, TokenAutomaton._compute_trans, MaskBatch.join = \
        timed_forward, timed_run, timed_trans, timed_join
    gc.callbacks.append(probe.on_gc)


def summary(call: dict[str, Any], wall: float, timing: Any) -> dict[str, float]:
    fw = call["forwards"]
    return {"wall_ms": 1e3 * wall, "forwards": len(fw),
            "first_forward_ms": 1e3 * (fw[0][1] - fw[0][0]) if fw else 0.0,
            "forward_ms": 1e3 * sum(e - s for s, e in fw), "compile_ms": 1e3 * call["compile_s"],
            "mask_ms": 1e3 * timing.mask_seconds,
            "mask_outside_forward_ms": 1e3 * (timing.mask_seconds - timing.overlapped_seconds),
            "join_wait_ms": 1e3 * call["join_s"],
            "transitions_masks": call["transitions"].get("masks", 0),
            "transitions_loop": call["transitions"].get("loop", 0),
            "transition_ms_loop": 1e3 * call["transition_s"].get("loop", 0.0),
            "gc_ms": 1e3 * sum(call["gc_s"].values()), "gc_ms_loop": 1e3 * call["gc_s"].get("loop", 0.0)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(HERE, "..", "..", "shared", "data", "jsonschemabench"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-per-subset", type=int, default=4)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--only", default="", help="only the schemas whose id contains this")
    ap.add_argument("--per-schema", action="store_true", help="also a line per schema (means over its passes)")
    ap.add_argument("--core-split", choices=("auto", "on", "off"), default="auto",
                    help="EngineConfig.core_split (auto: the engine's rule)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.set_flush_denormal(True)
    import dllm_constrain as dc
    from dllm_constrain.constraints import clear_cache
    from dllm_constrain.engine.llm_engine import LLMEngine
    from dllm_constrain.engine.state import PendingConstraint, Request
    from dllm_constrain.errors import DllmConstrainError

    if not os.path.isdir(args.data):
        print(f"no JSONSchemaBench data at {args.data}", file=sys.stderr)
        return 2
    items = [it for it in load_sample(args.data, args.seed, {k: args.n_per_subset for k in DEFAULT_MIX})
             if args.only in it["id"]]
    llm = dc.LLM(None)
    split = {"auto": None, "on": True, "off": False}[args.core_split]
    engine = LLMEngine(llm.model, llm.tokenizer, config=replace(llm.engine.config, mask_workers=1, core_split=split))
    probe = Probe()
    instrument(probe)

    def prepare(schema: Any, beside: bool) -> Request:
        [req] = llm.processor.build(PROMPT, schema=schema, compile_beside=beside).make_requests()
        return req

    warm_up = prepare({"type": "object"}, False)
    engine.generate([warm_up])
    rows: list[tuple[dict[str, float], dict[str, float]]] = []
    names: list[str] = []
    for it in items:
        try:
            clear_cache()
            prepare(it["schema"], False).constraint_state()
        except DllmConstrainError:
            continue  # refused (unsupported, or does not fit the canvas): bench_constraint_overhead leaves it out too
        for _ in range(args.passes):
            clear_cache()
            probe.take()
            t0 = time.perf_counter()
            req = prepare(it["schema"], True)
            [res] = engine.generate([req], raise_errors=False)
            cold = summary(probe.take(), time.perf_counter() - t0, engine.mask_timing)
            if res.error is not None:  # e.g. a fit check decided within its time limit one way, then the other
                break
            compiled = req.constraint.result() if isinstance(req.constraint, PendingConstraint) else req.constraint
            t0 = time.perf_counter()
            engine.generate([Request(req.prompt_ids, req.params, compiled)], raise_errors=False)
            warm = summary(probe.take(), time.perf_counter() - t0, engine.mask_timing)
            rows.append((cold, warm))
            names.append(it["id"])

    if not rows:
        print("no schema measured", file=sys.stderr)
        return 1
    keys = list(rows[0][0])
    print(f"# bench_cold_cost: {len(rows)} cold/warm call pairs ({args.passes} passes), one mask worker, core split "
          f"{engine.core_split}, cpu affinity "
          f"{sorted(os.sched_getaffinity(0))}")
    print("| per call (mean) | cold | warm |")
    print("|---|---|---|")
    for k in keys:
        print(f"| {k} | {statistics.mean(c[k] for c, _ in rows):.2f} | {statistics.mean(w[k] for _, w in rows):.2f} |")
    if args.per_schema:
        shown = ("wall_ms", "forwards", "forward_ms", "compile_ms", "mask_ms", "join_wait_ms")
        print("\n| schema | " + " | ".join(f"{k} cold / warm" for k in shown) + " |")
        print("|---|" + "---|" * len(shown))
        for name in dict.fromkeys(names):
            mine = [r for r, n in zip(rows, names) if n == name]
            print(f"| {name} | " + " | ".join(f"{statistics.mean(c[k] for c, _ in mine):.1f} / "
                                              f"{statistics.mean(w[k] for _, w in mine):.1f}" for k in shown) + " |")
    same = [(c, w) for c, w in rows if c["forwards"] == w["forwards"]]
    if same:
        diff = {k: statistics.mean(c[k] - w[k] for c, w in same) for k in ("wall_ms", "forward_ms", "first_forward_ms")}
        rel = statistics.mean((c["wall_ms"] - w["wall_ms"]) / w["wall_ms"] for c, w in same)
        print(f"cold minus warm over the {len(same)} pairs with the same forwards: {diff['wall_ms']:.2f} ms a call "
              f"({100 * rel:.1f}%), of which the forwards {diff['forward_ms']:.2f} ms (the first "
              f"{diff['first_forward_ms']:.2f} ms) and the rest {diff['wall_ms'] - diff['forward_ms']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
