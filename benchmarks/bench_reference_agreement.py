"""How often the fast default answers what preset="reference" answers (the authors' generate() / diffusion_generate()).

preset="reference" reproduces the authors' greedy decoding token for token (tests/test_checkpoint_reference.py);
the default trades that for speed (DualCache KV reuse; on the bundled model also its checkpoint's Fast-dLLM
confidence threshold). This prints, per section, for the same requests (greedy):

  identical   share of answers that are token for token the same
  tokens      share of answer positions (up to the longer answer) holding the same token
  fields      share of the reference answer's top-level JSON fields whose value the fast answer repeats (schema-
              constrained requests; "-" for unconstrained ones)
  nfe, wall   forwards per request and wall time, fast / reference, measured side by side in the same run

Sections:
  bundled  the bundled model on held-out requests (ExampleGenerator(10007), schema-constrained, its own prompt format)
  llada    a random mid-size LLaDA-Instruct layout (d_model 256, 4 layers) built in a temporary folder, chat template,
           random prompts; unconstrained and schema-constrained rows
  dream    the same for a random mid-size Dream-Instruct layout (linspace schedule, entropy order, whole answer)

    python benchmarks/bench_reference_agreement.py                       # all sections, --n 16
    python benchmarks/bench_reference_agreement.py --sections bundled --n 32

Random checkpoints are a stress case: their distributions are nearly flat, so a small change in the logits (what
KV reuse causes) flips more decisions than on a trained model.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 130},
                                           "city": {"type": "string", "maxLength": 12}},
          "required": ["name", "age", "city"]}
WORDS = "name age city record person Ada London Paris tell me about the quick brown fox numbers list".split()


class Tally:
    """Agreement counters of one row."""

    def __init__(self) -> None:
        self.n = self.same = self.pos = self.pos_same = self.fields = self.fields_same = 0
        self.nfe = [0, 0]
        self.wall = [0.0, 0.0]

    def add(self, fast: Any, ref: Any, constrained: bool) -> None:
        self.n += 1
        self.same += fast.token_ids == ref.token_ids
        width = max(len(fast.token_ids), len(ref.token_ids))
        self.pos += width
        self.pos_same += sum(a == b for a, b in zip(fast.token_ids, ref.token_ids))
        self.nfe[0] += fast.nfe
        self.nfe[1] += ref.nfe
        if constrained:
            want, got = _json(ref.text), _json(fast.text)
            if isinstance(want, dict):
                self.fields += len(want)
                self.fields_same += sum(isinstance(got, dict) and k in got and got[k] == v for k, v in want.items())

    def row(self, label: str) -> str:
        fields = f"{self.fields_same / self.fields:6.1%}" if self.fields else "     -"
        return (f"{label:<34} n={self.n:<3} identical {self.same / self.n:6.1%}  tokens "
                f"{self.pos_same / max(1, self.pos):6.1%}  fields {fields}  nfe {self.nfe[0] / self.n:6.1f} / "
                f"{self.nfe[1] / self.n:6.1f}  wall {self.wall[0]:6.1f}s / {self.wall[1]:6.1f}s "
                f"({self.wall[0] / max(1e-9, self.wall[1]):.2f}x)")


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def compare(llm: Any, prompts: list[Any], schemas: list[Any], tally: Tally, **options: Any) -> None:
    """Each request once with the defaults and once with preset="reference" (greedy), alternating, side by side."""
    for prompt, schema in zip(prompts, schemas):
        extra = {"schema": schema} if schema is not None else {}
        if schema is not None:
            llm.compile(schema=schema)  # compiled before either run is timed
        [fast], t_fast = _timed(lambda: llm.generate(prompt, temperature=0.0, **extra, **options))
        [ref], t_ref = _timed(lambda: llm.generate(prompt, temperature=0.0, preset="reference", **extra, **options))
        tally.wall[0] += t_fast
        tally.wall[1] += t_ref
        tally.add(fast, ref, schema is not None)


def bundled(n: int) -> None:
    from dllm_constrain.api import LLM
    from dllm_constrain.train.data import ExampleGenerator

    llm = LLM()
    examples = ExampleGenerator(10007, plain_text_share=0.0).examples(n)
    prompts, schemas = [e["request"] for e in examples], [e["schema"] for e in examples]
    tally = Tally()
    compare(llm, prompts, schemas, tally)
    print(tally.row(f"bundled (default: {llm.defaults.policy}, dual)"))
    cache_only = Tally()  # the reference's ranking with the default cache: what KV reuse alone changes
    compare(llm, prompts, schemas, cache_only, policy="quota")
    print(cache_only.row("bundled (quota, dual)"))


def random_family(family: str, n: int, max_new_tokens: int) -> None:
    from checkpoints import build_dream_instruct, build_llada_instruct

    from dllm_constrain.api import LLM

    rng = random.Random(0)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]
    with tempfile.TemporaryDirectory() as folder:
        if family == "llada":
            build_llada_instruct(Path(folder), seed=11, d_model=256, n_layers=4, n_heads=8, n_kv_heads=8,
                                 mlp_hidden_size=512)
        else:
            build_dream_instruct(Path(folder), seed=11, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                                 num_key_value_heads=8, intermediate_size=512)
        llm = LLM(folder, freeze_gc_heap=False)
        d = llm.defaults
        label = f"{family} mid ({d.policy}, {d.schedule}, dual)"
        plain, constrained = Tally(), Tally()
        compare(llm, prompts, [None] * n, plain, max_new_tokens=max_new_tokens)
        print(plain.row(label + " free"))
        compare(llm, prompts, [PERSON] * n, constrained, max_new_tokens=max_new_tokens)
        print(constrained.row(label + " schema"))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sections", default="bundled,llada,dream")
    p.add_argument("--n", type=int, default=16, help="requests per row")
    p.add_argument("--max-new-tokens", type=int, default=48, help="canvas of the random checkpoints' requests")
    args = p.parse_args(argv)
    torch.set_flush_denormal(True)
    print(f"torch threads {torch.get_num_threads()}; fast = the defaults, reference = preset='reference'; "
          "nfe and wall: fast / reference")
    for section in args.sections.split(","):
        if section == "bundled":
            bundled(args.n)
        else:
            random_family(section, args.n, args.max_new_tokens)


if __name__ == "__main__":
    main()
