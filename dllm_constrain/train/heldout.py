"""Held-out figures of a checkpoint: requests the training never saw, the README demos, and prompt fit.

python -m dllm_constrain.train.heldout [--model DIR] [--n 200] [--seed 10007] [--schema-constrained]
    [--block-length N] [--phrasing heldout|train]
python -m dllm_constrain.train.heldout --demos | --copy-probe [--n 60] | --loss [--loss-batches 16]
python -m dllm_constrain.train.heldout --prompt-fit ../shared/data/jsonschemabench [--max-new-tokens 256]

Held-out requests come from the generator's held-out split (phrasings the training split never produces) at a
seed training never used, so every stated value is new too. Reports: valid-JSON and schema-valid rates (Draft
2020-12 with its format checker), field-value recall (stated values that appear, exactly, under the right key),
mean NFE, tokens committed per forward, seconds per sample. Unconstrained: the prompt carries the schema's field
sketch, as in training, and nothing constrains the output; `--schema-constrained` passes each schema as the
constraint. `--copy-probe`: for each stated value of a held-out request the reference answer goes in whole but
that value's tokens (masked), and one forward's argmax must give them back. `--demos` prints the README
examples' answers; `--prompt-fit` counts the JSONSchemaBench schemas whose prompt plus a canvas of
`--max-new-tokens` fits the context (no PromptTooLongError); `--loss` prints the held-out diffusion loss (LLaDA
noise only, over `--loss-batches` fixed batches of 32; training evaluates the first 4). Figures:
docs/bundled_model.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jsonschema

from dllm_constrain.train.data import ExampleGenerator

HELDOUT_SEED = 10007  # training uses seeds 0 (answers) and 1 (tokenizer corpus)
# examples/person.json, the README's first example
PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "city": {"type": "string"}, "email": {"type": "string", "format": "email"},
                                           "active": {"type": "boolean"}},
          "required": ["name", "age", "city"], "additionalProperties": False}
DEMOS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("Create a record with name Ada Lovelace; age 36; city London.", {"schema": "person"}),
    ("What is 3 plus 4?", {"regex": r"[0-9]+\."}),
    ("List users older than 30", {"grammar": "sql"}),
    ("Write the expression: x times 3 plus 4.", {"grammar": "arithmetic"}),
    ("A 4-column table.", {"grammar": "csv:4"}),
    ("Write CSV with columns name, age and rows Ada, 36; Alan, 41.", {"grammar": "csv:2"}),
)


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
    validator = jsonschema.Draft202012Validator(example["schema"],
                                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    schema_ok = validator.is_valid(value)
    hits = sum(1 for k, v in example["stated"].items() if isinstance(value, dict) and value.get(k) == v)
    return True, schema_ok, hits, len(example["stated"])


def evaluate(model: str | None = None, n: int = 200, seed: int = HELDOUT_SEED, constrained: bool = False,
             batch_size: int = 8, phrasing: str = "heldout", sample_seed: int | None = None,
             **generate_kwargs: Any) -> tuple[HeldoutReport, list[dict[str, Any]]]:
    """Generate for n held-out schema requests and score them. phrasing="train" states the same kind of requests in
    the training split's phrasings (values still new at a seed training never used): the gap to "heldout" is what
    unseen phrasings cost. `seed` draws the requests' values; every request is also sampled at `sample_seed` (default:
    `seed`), so a sampled evaluation (temperature > 0) gives the same answers in every process."""
    from dllm_constrain.api import LLM

    llm = LLM(model)
    # unconstrained: the prompt as formatted, fed raw, with the checkpoint's decoding defaults (generation_config.json)
    raw = LLM.from_model(llm.model, llm.tokenizer, prompt_format="raw", path=llm.path) if not constrained else None
    examples = ExampleGenerator(seed, plain_text_share=0.0, split=phrasing).examples(n)
    generate_kwargs["seed"] = seed if sample_seed is None else sample_seed
    records: list[dict[str, Any]] = []
    start = time.perf_counter()
    for i in range(0, n, batch_size):
        chunk = examples[i:i + batch_size]
        if constrained:
            results = [llm.generate([e["request"]], schema=e["schema"], **generate_kwargs)[0] for e in chunk]
        else:  # the field sketch is in the prompt, as in training, but nothing constrains the output
            results = raw.generate([llm.format(e["request"], e["schema"]) for e in chunk], **generate_kwargs)
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


def copy_probe(model: str | None = None, n: int = 60, seed: int = HELDOUT_SEED) -> dict[str, Any]:
    """Teacher-forced copy accuracy: each stated scalar value of n held-out requests masked alone in the
    reference answer, predicted in one forward (argmax), compared token by token; and decoded left to right
    (one forward per token, each argmax committed before the next: how the threshold policy usually meets a
    value once its first token is in), counted as whole values; in that pass every position is then given its
    reference token (teacher forcing), so each value's first token and its later ones are scored apart (a first token
    needs the key found in the request; a later one only its left neighbour followed)."""
    import torch

    from dllm_constrain.api import LLM

    llm = LLM(model)
    net, backend = llm.model, llm.tokenizer.backend
    mask_id, eos_id = llm.tokenizer.mask_id, llm.tokenizer.eos_id
    tokens_hit = tokens_total = values_hit = values_total = left_to_right_hit = 0
    first = [0, 0]  # teacher-forced hits / total at a value's first token
    later = [0, 0]  # ... at its later tokens
    for e in ExampleGenerator(seed, plain_text_share=0.0, split="heldout").examples(n):
        prompt = llm.encode(llm.format(e["request"], e["schema"]))
        encoded = backend.encode(e["answer"], add_special_tokens=False)
        ids = torch.tensor([prompt + encoded.ids + [eos_id] * 4])
        for value in e["stated"].values():
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                continue
            text = value if isinstance(value, str) else json.dumps(value)
            start = e["answer"].find(text)
            if start < 0:
                continue
            span = [len(prompt) + j for j, (a, b) in enumerate(encoded.offsets) if a < start + len(text) and b > start]
            noisy = ids.clone()
            noisy[0, span] = mask_id
            with torch.inference_mode():
                hidden = net.hidden_states(noisy)
                guess = net.logits(hidden[0, span]).argmax(-1)
            right = guess == ids[0, span]
            tokens_hit += int(right.sum())
            tokens_total += len(span)
            values_hit += bool(right.all())
            values_total += 1
            ok = True
            with torch.inference_mode():
                for i, p in enumerate(span):
                    right_here = int(net.logits(net.hidden_states(noisy)[0, p]).argmax()) == int(ids[0, p])
                    ok = ok and right_here
                    score = first if i == 0 else later
                    score[0] += right_here
                    score[1] += 1
                    noisy[0, p] = ids[0, p]  # the argmax while all are right; the reference after a miss
            left_to_right_hit += ok
    return {"n": n, "values": values_total, "value_tokens": tokens_total,
            "token_accuracy": tokens_hit / max(1, tokens_total), "whole_value_accuracy": values_hit / max(1, values_total),
            "left_to_right_value_accuracy": left_to_right_hit / max(1, values_total),
            "first_token_accuracy": first[0] / max(1, first[1]), "later_token_accuracy": later[0] / max(1, later[1])}


def demos(model: str | None = None) -> list[tuple[str, str, str]]:
    """(prompt, constraint, answer) for each README demo, generated with the checkpoint's defaults."""
    from dllm_constrain.api import LLM

    llm = LLM(model)
    rows = []
    for prompt, constraint in DEMOS:
        kwargs = {"schema": PERSON} if constraint.get("schema") == "person" else dict(constraint)
        [result] = llm.generate([prompt], **kwargs)
        rows.append((prompt, json.dumps(constraint), result.text))
    return rows


def prompt_fit(folder: str, model: str | None = None, max_new_tokens: int = 256,
               request: str = "Fill in the record.") -> dict[str, Any]:
    """How many JSONSchemaBench schemas leave room for the prompt and a canvas of max_new_tokens."""
    from dllm_constrain.api import LLM

    llm = LLM(model)
    context = llm.model.max_sequence_length
    fits, total, longest = 0, 0, 0
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            tokens = len(llm.encode(llm.format(request, row["schema"])))
            longest = max(longest, tokens)
            total += 1
            fits += tokens + max_new_tokens <= context
    return {"schemas": total, "fit": fits, "fit_rate": fits / max(1, total), "context": context,
            "max_new_tokens": max_new_tokens, "longest_prompt_tokens": longest}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dllm_constrain.train.heldout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the bundled model)")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--seed", type=int, default=HELDOUT_SEED)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the checkpoint's")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--block-length", type=int, default=None,
                        help="decode with this block length instead of the checkpoint's (1: left to right)")
    parser.add_argument("--phrasing", choices=("heldout", "train"), default="heldout",
                        help="state the requests in the held-out phrasings (default) or the training split's")
    parser.add_argument("--schema-constrained", action="store_true", help="pass each schema as a constraint")
    parser.add_argument("--demos", action="store_true", help="run the README demos and print the answers")
    parser.add_argument("--copy-probe", action="store_true",
                        help="teacher-forced copy accuracy of stated values (one masked value per forward)")
    parser.add_argument("--prompt-fit", metavar="DIR", help="JSONSchemaBench folder: count prompts that fit")
    parser.add_argument("--loss", action="store_true", help="print the held-out diffusion loss of the checkpoint")
    parser.add_argument("--loss-batches", type=int, default=16, help="batches of the held-out loss (default 16)")
    parser.add_argument("--out", default=None, help="write per-request records as JSONL here")
    args = parser.parse_args(argv)
    import torch

    torch.set_flush_denormal(True)
    if args.demos:
        for prompt, constraint, answer in demos(args.model):
            print(f"{prompt!r} {constraint} -> {answer!r}")
        return
    if args.copy_probe:
        print(json.dumps(copy_probe(args.model, args.n, args.seed)))
        return
    if args.prompt_fit:
        print(json.dumps(prompt_fit(args.prompt_fit, args.model, args.max_new_tokens or 256)))
        return
    if args.loss:
        if args.loss_batches < 1:
            parser.error("--loss-batches must be at least 1")
        from dllm_constrain.api import bundled_model_path
        from dllm_constrain.train.trainer import checkpoint_heldout_loss

        folder = Path(args.model) if args.model else bundled_model_path()
        print(json.dumps({"model": str(folder), "batches": args.loss_batches,
                          "heldout_loss": checkpoint_heldout_loss(folder, args.loss_batches)}))
        return
    kwargs: dict[str, Any] = {} if args.max_new_tokens is None else {"max_new_tokens": args.max_new_tokens}
    if args.block_length is not None:
        kwargs["block_length"] = args.block_length
    report, records = evaluate(args.model, args.n, args.seed, args.schema_constrained, args.batch_size,
                               args.phrasing, **kwargs)
    if args.out:
        with open(args.out, "w") as fh:
            for r in records:
                fh.write(json.dumps(r) + "\n")
    print(report.markdown())
    print(json.dumps(asdict(report)))


if __name__ == "__main__":
    main()
