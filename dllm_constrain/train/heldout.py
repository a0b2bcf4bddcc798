"""Held-out figures of a checkpoint on fresh generator requests (a seed the training never used).

python -m dllm_constrain.train.heldout [--model DIR] [--n 200] [--seed 10007] [--schema-constrained]

Reports: valid-JSON rate and schema-valid rate (jsonschema Draft 2020-12 with its format checker), field-value
recall (share of values stated in the request that appear with the right key in the answer), mean NFE,
tokens committed per forward, and seconds per sample on this machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import jsonschema

from dllm_constrain.train.data import ExampleGenerator

HELDOUT_SEED = 10007  # training uses seeds 0 (answers) and 1 (tokenizer corpus)


@dataclass
class HeldoutReport:
    n: int
    valid_json_rate: float
    schema_valid_rate: float
    field_value_recall: float
    mean_nfe: float
    tokens_per_forward: float
    seconds_per_sample: float
    constrained: bool

    def markdown(self) -> str:
        rows = [("requests", f"{self.n}"), ("constrained", "yes" if self.constrained else "no"),
                ("valid JSON", f"{self.valid_json_rate:.1%}"), ("schema-valid", f"{self.schema_valid_rate:.1%}"),
                ("field-value recall", f"{self.field_value_recall:.1%}"), ("mean NFE", f"{self.mean_nfe:.1f}"),
                ("tokens per forward", f"{self.tokens_per_forward:.2f}"),
                ("seconds per sample", f"{self.seconds_per_sample:.3f}")]
        return "| metric | value |\n|---|---|\n" + "\n".join(f"| {a} | {b} |" for a, b in rows)


def score(example: dict[str, Any], text: str) -> tuple[bool, bool, int, int]:
    """(valid JSON, schema-valid, stated values recovered, stated values) for one answer."""
    try:
        value = json.loads(text)
    except ValueError:
        return False, False, 0, len(example["stated"])
    validator = jsonschema.Draft202012Validator(example["schema"], format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    schema_ok = validator.is_valid(value)
    hits = sum(1 for k, v in example["stated"].items() if isinstance(value, dict) and value.get(k) == v)
    return True, schema_ok, hits, len(example["stated"])


def evaluate(model: str | None = None, n: int = 200, seed: int = HELDOUT_SEED, constrained: bool = False,
             batch_size: int = 8, **generate_kwargs: Any) -> tuple[HeldoutReport, list[dict[str, Any]]]:
    """Generate for n held-out schema requests and score them."""
    from dllm_constrain.api import LLM
    from dllm_constrain.engine.state import Request, SamplingParams

    llm = LLM(model)
    gen = ExampleGenerator(seed, plain_text_share=0.0)
    examples = gen.examples(n)
    records: list[dict[str, Any]] = []
    start = time.perf_counter()
    for i in range(0, n, batch_size):
        chunk = examples[i:i + batch_size]
        if constrained:
            results = [llm.generate([e["request"]], schema=e["schema"], **generate_kwargs)[0] for e in chunk]
        else:  # the schema is in the prompt, as in training, but nothing constrains the output
            params = SamplingParams(**generate_kwargs)
            params.validate()
            requests = [Request(llm.encode(llm.format(e["request"], e["schema"])), params, None) for e in chunk]
            results = llm.engine.generate(requests)
        for e, r in zip(chunk, results):
            ok_json, ok_schema, hits, stated = score(e, r.text)
            records.append({"request": e["request"], "answer": r.text, "reference": e["answer"],
                            "valid_json": ok_json, "schema_valid": ok_schema, "hits": hits, "stated": stated,
                            "nfe": r.nfe, "tokens_per_forward": r.tokens_per_forward})
    elapsed = time.perf_counter() - start
    stated_total = sum(r["stated"] for r in records)
    report = HeldoutReport(
        n=n,
        valid_json_rate=sum(r["valid_json"] for r in records) / n,
        schema_valid_rate=sum(r["schema_valid"] for r in records) / n,
        field_value_recall=sum(r["hits"] for r in records) / max(1, stated_total),
        mean_nfe=statistics.mean(r["nfe"] for r in records),
        tokens_per_forward=statistics.mean(r["tokens_per_forward"] for r in records),
        seconds_per_sample=elapsed / n,
        constrained=constrained,
    )
    return report, records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dllm_constrain.train.heldout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the bundled model)")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--seed", type=int, default=HELDOUT_SEED)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--block-length", type=int, default=32)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--policy", default="quota")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--schema-constrained", action="store_true", help="pass each schema as a constraint")
    parser.add_argument("--out", default=None, help="write per-request records as JSONL here")
    args = parser.parse_args(argv)
    import torch

    torch.set_flush_denormal(True)
    report, records = evaluate(args.model, args.n, args.seed, args.schema_constrained, args.batch_size,
                               max_new_tokens=args.max_new_tokens, block_length=args.block_length,
                               steps=args.steps, policy=args.policy)
    if args.out:
        with open(args.out, "w") as fh:
            for r in records:
                fh.write(json.dumps(r) + "\n")
    print(report.markdown())
    print(json.dumps(asdict(report)))


if __name__ == "__main__":
    main()
