"""A batch through the request loop on the bundled model: tokens/s, and per step the head passes (`row_stats` calls)
and device-to-host reads (`to_host` calls) the loop made.

    python benchmarks/bench_head_pass.py --batch 32                  # greedy, 32 requests in one generate()
    python benchmarks/bench_head_pass.py --batch 32 --temperature 1  # sampled

Prints tokens/s (answer tokens, first EOS included, over the wall time of generate()), steps, row_stats calls and
to_host calls per step, and a digest of every request's canvas (equal digests: equal answers, e.g. before and after
a change of the loop). Counting wraps `LogitsPath.row_stats` and the engine modules' `to_host`; a tree without
them prints "n/a".
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import time

import torch

from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.state import Request, SamplingParams


def _count(module_name: str, attr: str, counter: dict[str, int], key: str) -> None:
    """Wrap `module.attr` so each call adds one to counter[key] (no-op when the module has no such attribute)."""
    module = importlib.import_module(module_name)
    real = getattr(module, attr, None)
    if real is None:
        return
    counter.setdefault(key, 0)

    def counted(*args, **kwargs):
        counter[key] += 1
        return real(*args, **kwargs)

    setattr(module, attr, counted)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--policy", default="threshold")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from dllm_constrain.api import LLM
    from dllm_constrain.engine import logits as logits_module
    from dllm_constrain.train.data import ExampleGenerator

    llm = LLM(None)
    examples = ExampleGenerator(10007, plain_text_share=0.0).examples(args.batch)
    requests = [Request(llm.encode(llm.format(e["request"], e["schema"])),
                        SamplingParams(max_new_tokens=args.max_new_tokens, block_length=args.block_length,
                                       policy=args.policy, temperature=args.temperature, seed=i))
                for i, e in enumerate(examples)]
    counter: dict[str, int] = {}
    for name in ("dllm_constrain.engine.logits", "dllm_constrain.engine.llm_engine"):
        _count(name, "to_host", counter, "to_host")
    real_row_stats = logits_module.LogitsPath.row_stats
    counter["row_stats"] = 0

    def row_stats(self, *a, **k):
        counter["row_stats"] += 1
        return real_row_stats(self, *a, **k)

    logits_module.LogitsPath.row_stats = row_stats
    engine = LLMEngine(llm.model, llm.tokenizer)
    steps = [0]
    start = time.perf_counter()
    results = engine.generate(requests, progress=lambda event: steps.__setitem__(0, steps[0] + 1))
    wall = time.perf_counter() - start
    tokens = sum(len(r.token_ids) + (1 if len(r.token_ids) < len(r.canvas_ids) else 0) for r in results)
    digest = hashlib.sha256(repr([r.canvas_ids for r in results]).encode()).hexdigest()[:16]
    per_step = {k: f"{v / steps[0]:.2f}" for k, v in counter.items()}
    print(f"batch {args.batch}, T={args.temperature}, policy {args.policy}: {tokens} tokens in {wall:.2f} s = "
          f"{tokens / wall:.1f} tokens/s; {steps[0]} steps; per step: row_stats {per_step.get('row_stats', 'n/a')}, "
          f"to_host {per_step.get('to_host', 'n/a')}; canvases {digest}")


if __name__ == "__main__":
    main()
