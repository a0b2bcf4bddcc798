#!/usr/bin/env python3
"""The token mask's path through one denoising step, from the constraint to the kernel, on JSONSchemaBench.

    python benchmarks/bench_mask_path.py                       # 3 schemas per subset, greedy
    python benchmarks/bench_mask_path.py --n-per-subset 5 --temperature 0.7 --json out.json

Per schema (bpe128k tokenizer, JSON Schema compiled with the default options), the first valid instance is
denoised on a canvas in semi-AR blocks of --block positions, --per-step commits per step (select_commits keeps the
canvas completable; untimed), twice with the same choices: a cold walk on the fresh compile (the constraint still
computes token transitions, which dominates) and a warm walk on a new canvas state of the same compiled constraint
(what a repeated schema costs; the mask format's share of the step shows there). At every step two stages are
timed:

  mask  : `LLMEngine._allowed` for the block's open positions: the constraint's masks, the engine's base mask
          (never MASK/BOS/PAD) and the banned pairs, in the form the engine hands to the logits path;
  repeat: the same `_allowed` call again on the unchanged canvas: everything the constraint memoises is hot, so
          what remains is the per-call set walk and the writing of the rows in the engine's format;
  stats : `LogitsPath.row_stats` on random hidden states of those rows: LM-head projection, mask application and
          the per-row reductions (`kernels.masked_row_stats`, the torch reference on CPU).

The engine runs a one-layer random LLaDA whose vocabulary is the tokenizer's (128,256 ids), so the masks, the
logits and the kernel's workspace have their real width. Figures are medians (and p90) over all steps of all
schemas, in milliseconds; run under `taskset -c 1` with OMP_NUM_THREADS=1 for stable figures.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_masks import (  # noqa: E402
    DEFAULT_MIX,
    add_sample_args,
    load_sample,
    load_tokenizer,
    pct,
    write_json,
)


def build_engine(info, d_model: int):
    """An LLMEngine over a one-layer random LLaDA as wide as the tokenizer (the masks' real width)."""
    import torch

    from dllm_constrain.engine.llm_engine import LLMEngine
    from dllm_constrain.engine.models.llada import LLaDAConfig, LLaDAModel

    torch.manual_seed(0)
    cfg = LLaDAConfig(d_model=d_model, n_layers=1, n_heads=2, mlp_hidden_size=2 * d_model,
                      vocab_size=info.vocab_size, mask_token_id=info.mask_id, eos_token_id=info.eos_id,
                      pad_token_id=info.mask_id, max_sequence_length=2048)
    return LLMEngine(LLaDAModel(cfg).eval())


def walk(engine, cc, ids: list[int], eos: int, mask_id: int, args, seed: int,
         times: dict[str, list[float]]) -> bool:
    """Denoise a canvas towards `ids` (+ EOS padding); time the mask and the statistics of every step."""
    import torch

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    n = len(ids) + 4
    target = list(ids) + [eos] * (n - len(ids))
    req = SimpleNamespace(constraint=cc.new_canvas_state(n), banned=set())
    canvas = [mask_id] * n
    d_model = engine.model.config.d_model
    for b0 in range(0, n, args.block):
        blk = list(range(b0, min(n, b0 + args.block)))
        while True:
            open_pos = [p for p in blk if canvas[p] == mask_id]
            if not open_pos:
                break
            hidden = torch.randn(len(open_pos), d_model, generator=gen)
            t0 = time.perf_counter()
            allowed = engine.structured.allowed(req, canvas, open_pos)
            t1 = time.perf_counter()
            engine.structured.allowed(req, canvas, open_pos)
            t2 = time.perf_counter()
            engine.logits_path.row_stats(hidden, allowed, args.temperature, gen)
            t3 = time.perf_counter()
            times["mask"].append((t1 - t0) * 1e3)
            times["repeat"].append((t2 - t1) * 1e3)
            times["stats"].append((t3 - t2) * 1e3)
            times["step"].append((t1 - t0 + t3 - t2) * 1e3)  # one mask and the statistics
            chosen = rng.sample(open_pos, min(args.per_step, len(open_pos)))
            kept = req.constraint.select_commits(canvas, [(p, target[p], rng.random()) for p in chosen])
            if not kept:
                return False
            for p, t in kept:
                canvas[p] = t
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sample_args(ap)
    ap.add_argument("--n-per-subset", type=int, default=3, help="schemas per JSONSchemaBench subset")
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--per-step", type=int, default=4, help="commits per denoising step")
    ap.add_argument("--max-tokens", type=int, default=300, help="skip instances longer than this")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--d-model", type=int, default=64, help="hidden size of the random model (LM head [V, D])")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="compile time limit (s): generous, so a busy machine does not change the sample")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from dllm_constrain.constraints import ConstraintCompiler, clear_cache
    from dllm_constrain.errors import ConstraintError

    items = load_sample(args.data, args.seed, {k: args.n_per_subset for k in DEFAULT_MIX})
    tk, info = load_tokenizer(args.tokenizer)
    comp = ConstraintCompiler(info, timeout_s=args.timeout)
    engine = build_engine(info, args.d_model)
    stages = ("mask", "repeat", "stats", "step")
    times = {f"{k} ({w})": [] for w in ("cold", "warm") for k in stages}
    walked = failed = 0
    for r in items:
        valids = [t for t in r["tests"] if t.get("valid")]
        ids = tk.encode(json.dumps(valids[0]["data"], separators=(",", ":"), ensure_ascii=False),
                        add_special_tokens=False).ids
        if len(ids) > args.max_tokens:
            continue
        clear_cache()
        try:
            cc = comp.compile_json_schema(r["schema"])
            if not cc.accepts_tokens(ids):
                continue
            ok = all([walk(engine, cc, ids, info.eos_id, info.mask_id, args, args.seed + walked,
                           {k: times[f"{k} ({w})"] for k in stages}) for w in ("cold", "warm")])
        except ConstraintError:
            continue
        walked += 1
        failed += not ok
    steps = len(times["step (warm)"])
    out = {"schemas_walked": walked, "walks_failed": failed, "steps_per_walk": steps,
           "vocab": info.vocab_size, "temperature": args.temperature}
    print(f"{walked} schemas walked ({failed} failed), {steps} steps per walk, vocab {info.vocab_size}, "
          f"T={args.temperature}")
    print("| stage | median ms | p90 ms |\n|---|---:|---:|")
    for k, xs in times.items():
        med, p90 = (statistics.median(xs), pct(xs, 0.9)) if xs else (float("nan"), float("nan"))
        out[k] = {"median_ms": med, "p90_ms": p90}
        print(f"| {k} | {med:.3f} | {p90:.3f} |")
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
