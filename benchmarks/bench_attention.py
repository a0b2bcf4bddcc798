"""The bundled model's step forward: tokens/s at a batch size, aten ops per layer, and the answers (for before/after).

    python benchmarks/bench_attention.py --batch 32 --n 32 --runs 3          # tokens/s (median), answers' digest
    python benchmarks/bench_attention.py --ops 1,8,32                        # aten ops per forward and per layer
    python benchmarks/bench_attention.py --n 16 --dump answers.json          # greedy answers, for a diff

Held-out requests of the training generator (schema in the prompt), greedy, the checkpoint's canvas and block length,
the default engine (DualCache, refresh per block). Tokens = answer tokens up to the first EOS per second of the whole
batch loop. The op count runs one Refresh forward and one Reuse forward of B requests under a TorchDispatchMode.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def _setup(n: int):
    from dllm_constrain.api import LLM
    from dllm_constrain.train.data import ExampleGenerator

    llm = LLM()
    examples = ExampleGenerator(10007, plain_text_share=0.0).examples(n)
    prompts = [llm.encode(llm.format(e["request"], e["schema"])) for e in examples]
    return llm, prompts


def _answers(llm, prompts: list[list[int]], batch: int):
    from dllm_constrain.engine.state import Request, SamplingParams

    params = SamplingParams(max_new_tokens=llm.defaults.max_new_tokens, block_length=llm.defaults.block_length,
                            temperature=0.0)
    out = []
    for i in range(0, len(prompts), batch):
        out += llm.engine.generate([Request(p, params) for p in prompts[i:i + batch]])
    return out


def _tokens(results, eos: int) -> int:
    total = 0
    for r in results:
        ids = list(r.canvas_ids)
        total += ids.index(eos) + 1 if eos in ids else len(ids)
    return total


ATTENTION_OPS = ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu", "bmm")


def ops_per_forward(llm, prompts: list[list[int]], batch: int) -> dict[str, float]:
    """aten ops inside the model's span forward (metadata building excluded), and attention kernels per layer."""
    from dllm_constrain.engine.model_runner import ModelRunner
    from dllm_constrain.engine.state import Request, SamplingParams

    engine = llm.engine
    params = SamplingParams(max_new_tokens=llm.defaults.max_new_tokens, block_length=llm.defaults.block_length)
    states = [engine._new_state(i, Request(p, params)) for i, p in enumerate(prompts[:batch])]
    model = engine.model
    runner = ModelRunner(model, engine.special.pad_id, engine.config)
    runner.reset(states)
    layers = model.config.n_layers
    forward = model.hidden_states_cached
    mode = CountOps()

    def counted(*args, **kwargs):
        with mode:
            return forward(*args, **kwargs)

    out: dict[str, float] = {}
    model.hidden_states_cached = counted
    try:
        with torch.inference_mode():
            for phase in ("refresh", "reuse"):
                mode.ops.clear()
                runner.forward_rows(states)
                out[f"{phase}_ops_per_layer"] = sum(mode.ops.values()) / layers
                out[f"{phase}_attention_calls_per_layer"] = sum(mode.ops[op] for op in ATTENTION_OPS) / layers
    finally:
        del model.hidden_states_cached
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ops", default="")
    ap.add_argument("--dump", default="")
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    llm, prompts = _setup(max(args.n, max((int(b) for b in args.ops.split(",") if b), default=0)))
    if args.ops:
        for b in (int(x) for x in args.ops.split(",")):
            print(json.dumps({"batch": b, **ops_per_forward(llm, prompts, b)}))
        return
    prompts = prompts[:args.n]
    times, results = [], []
    with torch.inference_mode():
        for _ in range(args.runs):
            t = time.perf_counter()
            results = _answers(llm, prompts, args.batch)
            times.append(time.perf_counter() - t)
    ids = [list(r.canvas_ids) for r in results]
    digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]
    tokens = _tokens(results, llm.engine.special.eos_id)
    print(json.dumps({"batch": args.batch, "n": args.n, "tokens": tokens, "median_s": statistics.median(times),
                      "tokens_per_s": tokens / statistics.median(times), "answers_sha": digest}))
    if args.dump:
        with open(args.dump, "w") as f:
            json.dump(ids, f)


if __name__ == "__main__":
    main()
