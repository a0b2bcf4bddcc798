"""SIMULATED serving comparison: continuous phase-aware, continuous FCFS slots and static batches on the same
arrivals, for several workloads, as one markdown table (figures from dllm_constrain.sim, see docs/serving.md).

    python benchmarks/bench_sim_serving.py --workloads burst osc --requests 500 --load 0.8 --hardware h200

Each workload: static batching's capacity first (every request at once), then the three policies at `--load` times
that capacity. The ratios are against static batching (targets: throughput >= 1.6x, p99 <= 1/3).
"""
from __future__ import annotations

import argparse
import contextlib
import io

from dllm_constrain.sim.__main__ import POLICIES, compare
from dllm_constrain.sim.cost import HARDWARE, SHAPES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["burst", "osc"])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--hardware", choices=sorted(HARDWARE), default="h200")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llada-8b")
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--kv-gb", type=float, default=100.0)
    parser.add_argument("--step-tokens", type=int, default=8192)
    parser.add_argument("--tokens-per-forward", type=float, default=2.5)
    parser.add_argument("--constrained-share", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--head-once", action="store_true", help="what-if: one LM head read per step")
    parser.add_argument("--varlen-attention", action="store_true", help="what-if: one attention launch per layer")
    parser.add_argument("--host-us", type=float, default=None, help="per-request host Python per step (us)")
    args = parser.parse_args()
    print("| workload | policy | req/s | p50 s | p99 s | TTFT p50 s | busy s | largest step | KV peak GB | "
          "thr x static | p99 x static |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for workload in args.workloads:
        ns = argparse.Namespace(**vars(args), workload=workload, policies=list(POLICIES))
        with contextlib.redirect_stdout(io.StringIO()):
            rows = compare(ns)
        ratios = {r["run"].split("/")[0]: r for r in rows if "/" in r["run"]}
        for r in rows:
            if "/" in r["run"] or r["run"] == "static-capacity":
                continue
            x = ratios.get(r["run"], {"throughput_x": 1.0, "p99_x": 1.0})
            print(f"| {workload} | {r['run']} | {r['throughput_rps']:.2f} | {r['p50_s']:.2f} | {r['p99_s']:.2f} | "
                  f"{r['ttft_p50_s']:.3f} | {r['device_busy_s']:.1f} | {r['peak_step_tokens']} | "
                  f"{r['peak_kv_gb']:.1f} | {x['throughput_x']:.2f} | {x['p99_x']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
