#!/usr/bin/env python3
"""A step's forward and a step's Python (the masks) on two cores: eager against the GIL-free TorchScript twin.

    OMP_NUM_THREADS=1 taskset -c 0,1 python benchmarks/bench_gil_free_forward.py            # bundled model, 5 runs
    python benchmarks/bench_gil_free_forward.py --model DIR --rows 32 --work 2 --runs 9

One packed forward of the bundled model (or `--model`) through `ModelRunner`, a request's KV-reuse step of `--rows`
query rows after its refresh (the step a canvas block repeats), and `--work` ms of Python on another thread (a loop
of small dict and int operations, the kind of work the constraint masks do). A step ends when both are done. Four
ways, alternating, medians over `--runs` rounds of `--reps` steps each:

  forward alone   the eager forward, no Python beside it (the free step);
  eager, serial   the eager forward, then the Python (the engine's serial path);
  eager, beside   the Python started first, then the eager forward on the calling thread: both take the GIL, the
                  forward between every torch call (what mask workers meant on the CPU before the twin);
  twin, beside    the GIL-free forward started, then the Python on the other thread (the engine's order with
                  mask workers, EngineConfig.gil_free_forward).

Reported: ms per step and the ratio to the forward alone. The twin needs two usable cores (see
engine.model_runner); with one the script says so and stops.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the bundled model)")
    ap.add_argument("--rows", type=int, default=32, help="query rows of the KV-reuse step")
    ap.add_argument("--prompt", type=int, default=40, help="prompt tokens before the canvas")
    ap.add_argument("--work", type=float, default=1.0, help="ms of Python the other thread runs per forward")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20, help="forwards per configuration and run")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.set_flush_denormal(True)
    import dllm_constrain as dc
    from dllm_constrain.engine.config import EngineConfig
    from dllm_constrain.engine.model_runner import ModelRunner
    from dllm_constrain.engine.placement import usable_cores
    from dllm_constrain.engine.state import Request, SamplingParams

    if usable_cores() < 2:
        print("the GIL-free forward needs two usable cores (taskset -c 0,1)", file=sys.stderr)
        return 2
    llm = dc.LLM(args.model)
    model, engine = llm.model, llm.engine
    params = SamplingParams(max_new_tokens=args.rows * 3, block_length=args.rows)
    prompt = [5 + i % 200 for i in range(args.prompt)]

    def runner(twin: bool) -> tuple[ModelRunner, object]:
        r = ModelRunner(model, model.special.pad_id, EngineConfig(gil_free_forward=twin))
        assert (r.scripted is not None) == twin, "the GIL-free forward did not turn on"
        s = engine._new_state(0, Request(prompt, params))
        with torch.inference_mode():
            r.forward_rows([s])  # the refresh: the cache entry the reuse steps attend to
        return r, s

    stop = threading.Event()
    go = threading.Event()
    done = threading.Event()

    def python_work() -> None:
        table: dict[int, int] = {}
        while not stop.is_set():
            if not go.wait(0.05):
                continue
            go.clear()
            end = time.perf_counter() + args.work / 1e3
            n = 0
            while time.perf_counter() < end:
                for k in range(64):
                    table[(n + k) & 1023] = table.get((n * 7 + k) & 1023, 0) + 1
                n += 1
            done.set()

    worker = threading.Thread(target=python_work, daemon=True)
    worker.start()

    def timed(r: ModelRunner, s: object, mode: str) -> float:
        """ms per step, median over --reps: mode "alone", "serial", "first" (Python started before the forward) or
        "after" (Python started once the forward is running)."""
        times = []
        with torch.inference_mode():
            for _ in range(args.reps):
                done.clear()
                t = time.perf_counter()
                if mode == "first":
                    go.set()
                finish = r.start_rows([s])
                if mode == "after":
                    go.set()
                finish()
                if mode == "serial":
                    go.set()
                if mode != "alone":
                    done.wait()
                times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3

    eager, twin = runner(False), runner(True)
    configs = {"forward alone": (eager, "alone"), "eager, serial": (eager, "serial"),
               "eager, beside": (eager, "first"), "twin, beside": (twin, "after")}
    for r, s in (eager, twin):  # warm-up (the twin compiles on first use)
        timed(r, s, "alone")
    results: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(args.runs):
        for name, ((r, s), mode) in configs.items():
            results[name].append(timed(r, s, mode))
    stop.set()
    worker.join()
    base = statistics.median(results["forward alone"])
    print(f"# bench_gil_free_forward: {args.rows} query rows after a {args.prompt}-token prompt, {args.work} ms of "
          f"Python beside, torch threads {torch.get_num_threads()}, cpu affinity {sorted(os.sched_getaffinity(0))}, "
          f"medians of {args.runs} runs x {args.reps} forwards")
    print("| configuration | ms per step | vs the forward alone |")
    print("|---|---|---|")
    for name, vals in results.items():
        med = statistics.median(vals)
        print(f"| {name} | {med:.2f} | {med / base:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
