"""python -m dllm_constrain.sim: the serving simulator's command line.

    python -m dllm_constrain.sim compare --workload burst --requests 500 --load 0.8 --hardware h200 --shape llada-8b
    python -m dllm_constrain.sim calibrate --out cpu_cost.json          # fit the CPU cost model on measured steps
    python -m dllm_constrain.sim cpu --cost cpu_cost.json               # the real CPU run beside its simulation

`compare` first measures static batching's capacity (every request arriving at once), then runs continuous
phase-aware, continuous FCFS slots and static batches on the same arrivals at `--load` times that capacity, and
prints one JSON line per run plus the ratios against static batching. Every figure is SIMULATED: the real engine
decides, the forward is priced by the cost model (dllm_constrain.sim.cost).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from dllm_constrain.sim.cost import HARDWARE, SHAPES, Kernels, RooflineCost
from dllm_constrain.sim.harness import RequestFactory, RunResult, ServingSetup, simulate
from dllm_constrain.sim.workloads import SCHEMA, WORKLOADS, make_workload

POLICIES = ("phase", "fcfs", "static")


def bundled_factory(constrained: bool = True) -> RequestFactory:
    """Requests over the bundled tokenizer's vocabulary (the simulated model's tokens), SCHEMA compiled for it."""
    from dllm_constrain.bundled import __file__ as bundled_init
    from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
    from dllm_constrain.engine.tokenizer import Tokenizer

    tok = Tokenizer(Path(bundled_init).parent)
    compiled = None
    if constrained:
        info = TokenizerInfo.from_tokenizer(tok, eos_id=tok.eos_id, mask_id=tok.mask_id, vocab_size=tok.vocab_size)
        compiled = ConstraintCompiler(info).compile(schema=SCHEMA)
    return RequestFactory(tok, compiled)


def _line(label: str, result: RunResult, **extra: Any) -> dict[str, Any]:
    row = {"run": label, **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.summary().items()},
           **extra}
    print(json.dumps(row), flush=True)
    return row


def compare(args: argparse.Namespace) -> list[dict[str, Any]]:
    factory = bundled_factory(args.constrained_share > 0)
    hardware = HARDWARE[args.hardware]
    if args.host_us is not None:
        hardware = replace(hardware, host_per_request_s=args.host_us * 1e-6)
    shape, cost = SHAPES[args.shape], RooflineCost(hardware)
    setup = ServingSetup(max_num_seqs=args.slots, kv_budget_bytes=int(args.kv_gb * 1e9),
                         step_tokens=args.step_tokens, tokens_per_forward=args.tokens_per_forward,
                         kernels=Kernels(head_per_request=not args.head_once,
                                         attention_per_request=not args.varlen_attention))
    rows = []
    saturated = make_workload(args.workload, args.requests, 0.0, args.seed, args.constrained_share)
    cap = simulate(saturated, "static", setup, factory, shape, cost)
    rows.append(_line("static-capacity", cap, load=None))
    rate = args.load * cap.throughput
    workload = make_workload(args.workload, args.requests, rate, args.seed, args.constrained_share)
    results = {}
    for policy in args.policies:
        results[policy] = simulate(workload, policy, setup, factory, shape, cost)
        rows.append(_line(policy, results[policy], load=args.load, rate_rps=round(rate, 4)))
    if "static" in results:
        base = results["static"]
        for policy, r in results.items():
            if policy != "static":
                ratio = {"run": f"{policy}/static", "throughput_x": round(r.throughput / base.throughput, 3),
                         "p99_x": round(r.latency(99) / base.latency(99), 3),
                         "p50_x": round(r.latency(50) / base.latency(50), 3),
                         "ttft_p50_x": round(r.ttft(50) / base.ttft(50), 3)}
                print(json.dumps(ratio), flush=True)
                rows.append(ratio)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dllm_constrain.sim", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare", help="the three policies on one workload, SIMULATED")
    c.add_argument("--workload", choices=sorted(WORKLOADS), default="burst")
    c.add_argument("--requests", type=int, default=500)
    c.add_argument("--load", type=float, default=0.8, help="arrival rate as a share of static batching's capacity")
    c.add_argument("--hardware", choices=sorted(HARDWARE), default="h200")
    c.add_argument("--shape", choices=sorted(SHAPES), default="llada-8b")
    c.add_argument("--slots", type=int, default=64, help="max_num_seqs (the static batch size too)")
    c.add_argument("--kv-gb", type=float, default=100.0, help="KV budget in GB (H200: 141 GB less weights, headroom)")
    c.add_argument("--step-tokens", type=int, default=8192, help="the phase policy's per-step token budget")
    c.add_argument("--tokens-per-forward", type=float, default=2.5)
    c.add_argument("--constrained-share", type=float, default=0.2)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--host-us", type=float, default=None,
                   help="the engine's per-request host Python per step in microseconds (default: the hardware's)")
    c.add_argument("--head-once", action="store_true",
                   help="what-if: price one LM head read per step instead of one per request (not what the engine "
                        "does today)")
    c.add_argument("--varlen-attention", action="store_true",
                   help="what-if: one attention launch group per layer for all requests instead of the per-request "
                        "loop (not what the engine does today)")
    c.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    from dllm_constrain.sim import calibrate

    calibrate.add_commands(sub)
    args = parser.parse_args(argv)
    if args.command == "compare":
        compare(args)
    else:
        args.func(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
