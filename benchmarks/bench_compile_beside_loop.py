#!/usr/bin/env python3
"""What a compilation on the LLM's compile thread costs the requests the loop is serving meanwhile.

    OMP_NUM_THREADS=1 taskset -c 0,1 python benchmarks/bench_compile_beside_loop.py
    OMP_NUM_THREADS=1 taskset -c 0,1 python benchmarks/bench_compile_beside_loop.py --rounds 9 --seconds 1.5

A server compiles each schema it has not seen on the LLM's compile thread (`PendingConstraint`), beside the request
loop, which goes on serving the other requests. Here the loop serves one unconstrained request after another
(the bundled model, greedy, its decoding defaults; `LLMEngine.generate`) for `--seconds`, in three modes, rounds
alternating them:

  alone          : nothing else runs;
  beside         : compilations of a JSON Schema run back to back on a compile thread the whole time (the compile
                   cache cleared before each), through `PendingConstraint` as the LLM runs them: with the short
                   switch interval a compilation holds, and its pauses while the loop runs a step (engine.gil_share);
  no pauses      : the same without the pauses (the short switch interval only);
  neither        : the same with neither (the interpreter's default switch interval, 5 ms), for comparison.

Printed per mode: the median over rounds of the wall time per request, its ratio to `alone`, and the compilations
done per second beside the loop.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_forward_contention import SCHEMA  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0, help="how long each mode serves requests per round")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.set_flush_denormal(True)
    import dllm_constrain as dc
    from dllm_constrain.constraints import clear_cache
    from dllm_constrain.engine import gil_share
    from dllm_constrain.engine import state as engine_state
    from dllm_constrain.engine.llm_engine import LLMEngine
    from dllm_constrain.engine.state import PendingConstraint, Request

    llm = dc.LLM(None)
    engine = LLMEngine(llm.model, llm.tokenizer, config=replace(llm.engine.config, mask_workers=1))
    [probe] = llm.processor.build("Write a JSON record for a customer.", schema=SCHEMA).make_requests()
    free = Request(probe.prompt_ids, replace(probe.params, constraint=None), None)
    pool = ThreadPoolExecutor(1, thread_name_prefix="dllm-compile")

    def compile_once() -> None:
        clear_cache()
        PendingConstraint(pool, lambda: llm.compile(schema=SCHEMA)).result()

    def serve(seconds: float, mode: str) -> tuple[float, float]:
        """(seconds per request, compilations per second) in `mode` (see the module docstring)."""
        stop = threading.Event()
        compiled = [0]

        def compile_loop() -> None:
            while not stop.is_set():
                compile_once()
                compiled[0] += 1

        saved = engine_state.compiling_beside, engine_state.loop_activity
        if mode in ("no pauses", "neither"):  # a loop activity the loop never marks: its pauses never wait
            engine_state.loop_activity = gil_share.LoopActivity()
        if mode == "neither":  # the interpreter's default interval: a guard that never lowers it
            engine_state.compiling_beside = gil_share.SwitchIntervalWhileBusy(sys.getswitchinterval())
        side = threading.Thread(target=compile_loop) if mode != "alone" else None
        try:
            if side is not None:
                side.start()
            t0, n = time.perf_counter(), 0
            while time.perf_counter() - t0 < seconds:
                engine.generate([free])
                n += 1
            wall = time.perf_counter() - t0
        finally:
            stop.set()
            if side is not None:
                side.join()
            engine_state.compiling_beside, engine_state.loop_activity = saved
        return wall / n, compiled[0] / wall

    engine.generate([free])
    compile_once()
    modes = ("alone", "beside", "no pauses", "neither")
    per: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for name in modes:
            per[name].append(serve(args.seconds, name))
    pool.shutdown()
    base = statistics.median(t for t, _ in per["alone"])
    print(f"# bench_compile_beside_loop: {args.rounds} rounds of {args.seconds:g} s per mode, torch threads "
          f"{torch.get_num_threads()}, cpu affinity {sorted(os.sched_getaffinity(0))}, switch interval while "
          f"compiling {gil_share.COMPILE_SWITCH_INTERVAL_S * 1e3:g} ms")
    print("| mode | wall per request (median) | vs alone | compilations per second beside |")
    print("|---|---|---|---|")
    for name in modes:
        t = statistics.median(x for x, _ in per[name])
        c = statistics.median(y for _, y in per[name])
        print(f"| {name} | {1e3 * t:.0f} ms | {t / base:.2f}x | {c:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
