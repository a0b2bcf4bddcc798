#!/usr/bin/env python3
"""What a JSON Schema costs per forward: constrained vs unconstrained generation on the bundled model, same input.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/bench_constraint_overhead.py              # 40 schemas, 3 runs
    python benchmarks/bench_constraint_overhead.py --n-per-subset 1 --runs 1 --json out.json   # quick
    OMP_NUM_THREADS=1 taskset -c 0,1 python benchmarks/bench_constraint_overhead.py --mask-workers 1  # masks beside
                                                                     # the GIL-free forward, a core each
    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/bench_constraint_overhead.py --no-forced-tokens  # same forward mix

Schemas: `--n-per-subset` of each JSONSchemaBench subset, drawn as benchmarks/bench_masks.py draws them (the sample
of ../shared/tools/anchors_mask_bench.py; 4 per subset = 40 schemas). For each schema the model input is the same
token sequence in every configuration: the prompt "Write a JSON value for the schema." formatted with the schema's
field sketch, as `generate(prompt, schema=...)` formats it. Per schema and run, one request alone (greedy, the
checkpoint's decoding defaults, generation_config.json), in three configurations, alternating so that the
machine's load moves them alike:

  free   : no constraint;
  cold   : the schema compiled for this run (the compile cache cleared first): the first request with a schema the
           server has not seen, compilation and first exploration of the automaton included. The request is built
           as `LLM.generate` builds it: the compilation runs on the LLM's compile thread beside the request's first
           forward (`LLM.constraint_for_engine`); `--compile-first` compiles before the call instead;
  warm   : the same compiled constraint again (a new canvas state): a schema seen before.

Per configuration: wall time of the `LLMEngine.generate` call (for the cold request also the time to build it, and
its compilation: it happens inside `generate()` for a user), forwards (NFE) and wall time per forward; the figures per schema are medians over
the runs, and the ratios are constrained / free per forward (the constraint's forced tokens may save forwards, so the
per-call ratio is printed too). The per-forward ratio is then split in two additive parts, from the engine's own
forward timing: the forwards themselves (a call that needs fewer forwards keeps the costly ones, so its forwards
cost more on average) and everything else (the constraint's work, compilation, the engine's per-step work). Every constrained answer is checked against its compiled constraint (and counted).
A schema that does not compile or does not fit the canvas is left out and named.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_masks import DEFAULT_MIX, load_sample, pct, write_json  # noqa: E402

PROMPT = "Write a JSON value for the schema."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(HERE, "..", "..", "shared", "data", "jsonschemabench"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-per-subset", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the bundled model)")
    ap.add_argument("--json", default=None, help="also write the per-schema rows here")
    ap.add_argument("--mask-workers", type=int, default=None,
                    help="EngineConfig.mask_workers (default: the engine's choice, 0 on CPU): with 1 and a core of its own "
                         "(taskset -c 0,1 with one torch thread) the masks run beside the GIL-free forward, as on "
                         "a GPU host")
    ap.add_argument("--no-forced-tokens", action="store_true",
                    help="SamplingParams.forced_tokens=False: positions the mask forces wait for the model, so the "
                         "constrained run does the free run's mix of forwards and the ratio is the constraint's own cost")
    ap.add_argument("--gil-free-forward", choices=("on", "off"), default=None,
                    help="EngineConfig.gil_free_forward (default: the engine's rule, on with mask workers on the CPU)")
    ap.add_argument("--core-split", choices=("auto", "on", "off"), default="auto",
                    help="EngineConfig.core_split: the mask workers and the compile thread on a core of their own, "
                         "the GIL-free forward's threads on the others (auto: the engine's rule)")
    ap.add_argument("--freeze-gc-heap", choices=("on", "off"), default="on",
                    help="LLM(freeze_gc_heap=...): the startup heap out of the garbage collector's reach (the default) "
                         "or not (full collections then walk torch and the model inside the timed calls)")
    ap.add_argument("--compile-first", action="store_true",
                    help="cold: compile before the call (as before compilations ran beside the first forward)")
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
    items = load_sample(args.data, args.seed, {k: args.n_per_subset for k in DEFAULT_MIX})
    llm = dc.LLM(args.model, freeze_gc_heap=args.freeze_gc_heap == "on")
    config = llm.engine.config
    if args.mask_workers is not None:
        config = replace(config, mask_workers=args.mask_workers)
    if args.gil_free_forward is not None:
        config = replace(config, gil_free_forward=args.gil_free_forward == "on")
    config = replace(config, core_split={"auto": None, "on": True, "off": False}[args.core_split])
    engine = LLMEngine(llm.model, llm.tokenizer, config=config)

    def prepare(schema: Any, compile_beside: bool = False) -> Request:
        options = {"schema": schema} if not args.no_forced_tokens else {"schema": schema, "forced_tokens": False}
        [req] = llm.processor.build(PROMPT, compile_beside=compile_beside, **options).make_requests()
        return req

    def timed(req: Request) -> tuple[float, Any, tuple[float, int, float]]:
        """(wall seconds, result, the call's forwards from engine.mask_timing: (seconds of all forwards, refresh
        forwards, seconds of the refresh forwards))."""
        t0 = time.perf_counter()
        [res] = engine.generate([req], raise_errors=False)
        t = engine.mask_timing
        return time.perf_counter() - t0, res, (t.forward_seconds, t.refresh_forwards, t.refresh_seconds)

    def measure(free_req: Request, schema: Any) -> tuple[dict[str, list[tuple[float, int]]], int, int]:
        """The runs of one schema: (wall time, NFE) per configuration, constrained answers accepted, errors."""
        per: dict[str, list[tuple[float, int, tuple[float, int, float]]]] = {"free": [], "cold": [], "warm": []}
        valid = errors = 0
        for _ in range(args.runs):
            wall, res, fwd = timed(free_req)
            per["free"].append((wall, res.nfe, fwd))
            clear_cache()
            t0 = time.perf_counter()
            # as LLM.generate builds it: compiled now (--compile-first) or on the compile thread, beside the
            # request's first forward
            cold_req = prepare(schema, compile_beside=not args.compile_first)
            build_s = time.perf_counter() - t0
            wall, res, fwd = timed(cold_req)
            per["cold"].append((build_s + wall, res.nfe, fwd))
            answers = [res]
            compiled = cold_req.constraint
            if isinstance(compiled, PendingConstraint):
                compiled = compiled.result()
            wall, res, fwd = timed(Request(cold_req.prompt_ids, cold_req.params, compiled))
            per["warm"].append((wall, res.nfe, fwd))
            for r in answers + [res]:
                if r.error is not None:
                    errors += 1
                elif compiled.accepts_tokens(r.token_ids):
                    valid += 1
        return per, valid, errors

    rows: list[dict[str, Any]] = []
    left_out: list[str] = []
    warm_up = prepare({"type": "object"})
    engine.generate([warm_up, Request(warm_up.prompt_ids, replace(warm_up.params, constraint=None), None)])
    for k, item in enumerate(items):
        name = item["id"]
        try:
            clear_cache()
            probe = prepare(item["schema"])
            probe.constraint_state()  # compiles and checks the fit before the timed runs
        except DllmConstrainError as err:
            left_out.append(f"{name}: {type(err).__name__}")
            continue
        free_req = Request(probe.prompt_ids, replace(probe.params, constraint=None), None)
        try:
            per, valid, errors = measure(free_req, item["schema"])
        except DllmConstrainError as err:  # e.g. a fit check decided within its time limit one way, then the other
            left_out.append(f"{name}: {type(err).__name__} in a timed run")
            continue
        row: dict[str, Any] = {"id": name, "subset": item["subset"], "prompt_tokens": len(probe.prompt_ids),
                               "valid": valid, "errors": errors, "answers": 2 * args.runs}
        for cfg, xs in per.items():
            row[f"{cfg}_s"] = statistics.median(w for w, _, _ in xs)
            row[f"{cfg}_nfe"] = statistics.median(n for _, n, _ in xs)
            row[f"{cfg}_refreshes"] = statistics.median(r for _, _, (_, r, _) in xs)
            row[f"{cfg}_per_forward_ms"] = statistics.median(1e3 * w / max(1, n) for w, n, _ in xs)
            # the per-forward time split: the forward itself, and everything else of the call (the constraint's
            # work, compilation of a cold request, the engine's own per-step work)
            row[f"{cfg}_forward_ms"] = statistics.median(1e3 * f / max(1, n) for _, n, (f, _, _) in xs)
            row[f"{cfg}_other_ms"] = statistics.median(1e3 * (w - f) / max(1, n) for w, n, (f, _, _) in xs)
            # the cost of one forward of each kind: a refresh (the prompt's forward, block refreshes) and a KV-reuse step
            row[f"{cfg}_refresh_ms"] = statistics.median(1e3 * rs / r for _, _, (_, r, rs) in xs if r) \
                if any(r for _, _, (_, r, _) in xs) else None
            row[f"{cfg}_reuse_ms"] = statistics.median(1e3 * (f - rs) / (n - r) for _, n, (f, r, rs) in xs if n > r) \
                if any(n > r for _, n, (_, r, _) in xs) else None
        free_fwd = row["free_forward_ms"]
        for cfg in ("cold", "warm"):
            row[f"{cfg}_ratio_per_forward"] = row[f"{cfg}_per_forward_ms"] / row["free_per_forward_ms"]
            row[f"{cfg}_ratio_call"] = row[f"{cfg}_s"] / row["free_s"]
            # ratio - 1 = forward part + other part (each in units of the free run's time per forward)
            row[f"{cfg}_forward_part"] = (row[f"{cfg}_forward_ms"] - free_fwd) / row["free_per_forward_ms"]
            row[f"{cfg}_other_part"] = (row[f"{cfg}_other_ms"] - row["free_other_ms"]) / row["free_per_forward_ms"]
            # the free run's forwards priced at this call's mix of kinds (its refresh and reuse counts), per forward:
            # what a free call's forwards would cost per forward had it needed the forwards this call needed
            n, refreshes = row[f"{cfg}_nfe"], row[f"{cfg}_refreshes"]
            ref_ms = row["free_refresh_ms"] if row["free_refresh_ms"] is not None else free_fwd
            reuse_ms = row["free_reuse_ms"] if row["free_reuse_ms"] is not None else free_fwd
            priced = (refreshes * ref_ms + (n - refreshes) * reuse_ms) / max(1, n)
            # forward part = mix (the kinds' shares) + the forwards' own (the same kinds costing more or less)
            row[f"{cfg}_mix_part"] = (priced - free_fwd) / row["free_per_forward_ms"]
            row[f"{cfg}_same_kind_part"] = (row[f"{cfg}_forward_ms"] - priced) / row["free_per_forward_ms"]
            # per-forward ratio against a free call with this call's mix of forwards
            row[f"{cfg}_ratio_same_mix"] = row[f"{cfg}_per_forward_ms"] / (row["free_per_forward_ms"] + priced - free_fwd)
        rows.append(row)
        print(f"  {k + 1}/{len(items)} {name[:48]:48s} free {row['free_per_forward_ms']:6.1f} ms/fwd "
              f"({row['free_nfe']:.0f} fwd)  cold x{row['cold_ratio_per_forward']:.2f}  "
              f"warm x{row['warm_ratio_per_forward']:.2f} ({row['warm_nfe']:.0f} fwd)  valid {valid}/{2 * args.runs}",
              flush=True)

    print(f"\n# bench_constraint_overhead: {len(rows)} schemas ({len(left_out)} left out), {args.runs} runs, "
          f"model {args.model or 'bundled'}, torch threads {torch.get_num_threads()}, mask workers "
          f"{engine.config.mask_workers}, forced tokens {'off' if args.no_forced_tokens else 'on'}, heap frozen "
          f"{args.freeze_gc_heap}, cpu affinity {sorted(os.sched_getaffinity(0))}, core split {engine.core_split}")
    print("| configuration | per forward: mean ratio | p50 | p90 | worst | per call: mean ratio | worst | NFE (sum) |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| free | 1 | | | | 1 | | {sum(r['free_nfe'] for r in rows):.0f} |")
    for cfg in ("cold", "warm"):
        pf = [r[f"{cfg}_ratio_per_forward"] for r in rows]
        pc = [r[f"{cfg}_ratio_call"] for r in rows]
        worst = max(rows, key=lambda r: r[f"{cfg}_ratio_per_forward"])["id"]
        print(f"| {cfg} | {statistics.mean(pf):.3f} | {pct(pf, 0.5):.3f} | {pct(pf, 0.9):.3f} | {max(pf):.3f} "
              f"({worst}) | {statistics.mean(pc):.3f} | {max(pc):.3f} | {sum(r[f'{cfg}_nfe'] for r in rows):.0f} |")
    print("Per-forward ratio - 1, split (means over schemas, in units of the free run's time per forward): the forward"
          " itself (the mix of forwards: a constrained call that needs fewer forwards keeps the costly ones, the first"
          " forward over the prompt and the block refreshes) + the rest of the call (the constraint's work, compilation"
          " when cold, the engine's per-step work):")
    for cfg in ("cold", "warm"):
        fp = statistics.mean(r[f"{cfg}_forward_part"] for r in rows)
        mp = statistics.mean(r[f"{cfg}_mix_part"] for r in rows)
        kp = statistics.mean(r[f"{cfg}_same_kind_part"] for r in rows)
        op = [r[f"{cfg}_other_part"] for r in rows]
        print(f"  {cfg}: forward {fp:+.3f} (mix of kinds {mp:+.3f}, same kinds {kp:+.3f}), rest "
              f"{statistics.mean(op):+.3f} (p50 {pct(op, 0.5):+.3f}, worst {max(op):+.3f})")
    print("Per-forward ratio against a free call with the constrained call's mix of forwards (the free run's refresh"
          " and KV-reuse forwards each at their own cost, counted as the constrained call counts them):")
    for cfg in ("cold", "warm"):
        sm = [r[f"{cfg}_ratio_same_mix"] for r in rows]
        worst = max(rows, key=lambda r: r[f"{cfg}_ratio_same_mix"])["id"]
        print(f"  {cfg}: mean {statistics.mean(sm):.3f}, p50 {pct(sm, 0.5):.3f}, p90 {pct(sm, 0.9):.3f}, "
              f"worst {max(sm):.3f} ({worst})")
    refreshes = {cfg: sum(r[f"{cfg}_refreshes"] for r in rows) for cfg in ("free", "cold", "warm")}
    print("refresh forwards: " + ", ".join(f"{cfg} {refreshes[cfg]:.0f} of {sum(r[f'{cfg}_nfe'] for r in rows):.0f}"
                                            for cfg in ("free", "cold", "warm")))
    total = {cfg: sum(r[f"{cfg}_s"] for r in rows) for cfg in ("free", "cold", "warm")}
    print(f"total wall: free {total['free']:.1f} s, cold {total['cold']:.1f} s ({total['cold'] / total['free']:.3f}x), "
          f"warm {total['warm']:.1f} s ({total['warm'] / total['free']:.3f}x)")
    n_valid = sum(r["valid"] for r in rows)
    n_ans = sum(r["answers"] for r in rows)
    print(f"constrained answers accepted by their constraint: {n_valid}/{n_ans}; errors: "
          f"{sum(r['errors'] for r in rows)}; left out: {left_out}")
    write_json(args.json, {"rows": rows, "left_out": left_out, "runs": args.runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
