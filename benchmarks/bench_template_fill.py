#!/usr/bin/env python3
"""A record filled from a template vs the same record generated free under its schema (the bundled model).

    OMP_NUM_THREADS=1 python benchmarks/bench_template_fill.py --repeats 5

The schema: a person record (name, age, city, email, occupation, all required). "template": compact JSON with the keys,
quotes and punctuation pinned and the values' contents as holes (TEMPLATE); "free": the whole record generated under
the schema (compact JSON, the canvas the checkpoint's default). Per way, over --prompts prompts: forwards (NFE, summed), wall time
(median of --repeats runs of the whole prompt set, the two ways alternating), and validity (every output parses and
validates against the schema; template outputs also keep every pinned character). The bundled model's values are
not the point: the forwards, the time and the validity are.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import jsonschema
import torch

import dllm_constrain as dc

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"},
    "email": {"type": "string"}, "occupation": {"type": "string"}},
    "required": ["name", "age", "city", "email", "occupation"]}
# compact JSON (what the model was trained on): the keys, quotes and punctuation pinned, each string's content a
# hole of a fixed number of tokens (any tokenization of a value fits, so most values have one that fills it), the
# last hole free-length (it holds the end of the last string, the closing brace and the answer's end)
TEMPLATE = '{"name":"<hole:4>","age":<hole:1>,"city":"<hole:3>","email":"<hole:6>","occupation":"<hole:..6>'
PROMPTS = [
    "Create a record with name Ada Lovelace; age 36; city London; email ada@example.org; occupation writer.",
    "Create a record with name Alan Turing; age 41; city Wilmslow; email alan@example.org; occupation scientist.",
    "Create a record with name Grace Hopper; age 85; city Arlington; email grace@example.org; occupation admiral.",
    "Create a record with name Emmy Noether; age 53; city Bryn Mawr; email emmy@example.org; occupation teacher.",
]


def pinned_text_kept(text: str) -> bool:
    """Every pinned piece of TEMPLATE is in the output, in order."""
    at = 0
    for piece in TEMPLATE.replace("<hole:..8>", "<hole>").split("<hole")[0:1] + [
            p.split(">", 1)[1] for p in TEMPLATE.split("<hole")[1:]]:
        if not piece:
            continue
        found = text.find(piece, at)
        if found < 0:
            return False
        at = found + len(piece)
    return True


def run(llm: dc.LLM, way: str, prompts: list[str]) -> tuple[list, float]:
    opts = {"schema": SCHEMA, "seed": 0}
    if way == "template":
        opts["template"] = TEMPLATE
    start = time.perf_counter()
    results = llm.generate(prompts, **opts)
    return results, time.perf_counter() - start


def valid(way: str, text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return way == "free" or pinned_text_kept(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    llm = dc.LLM()
    prompts = PROMPTS[:args.prompts]
    for way in ("template", "free"):  # warm: compile both constraints, the model, the tokenizer tables
        run(llm, way, prompts[:1])
    walls: dict[str, list[float]] = {"template": [], "free": []}
    last: dict[str, list] = {}
    for _ in range(args.repeats):
        for way in ("template", "free"):
            results, wall = run(llm, way, prompts)
            walls[way].append(wall)
            last[way] = results
    print(f"{len(prompts)} prompts per run, {args.repeats} runs each (medians)")
    print(f"{'way':<9} {'forwards':>9} {'wall s':>8} {'valid':>7}  example")
    for way in ("template", "free"):
        rs = last[way]
        ok = sum(valid(way, r.text) for r in rs)
        print(f"{way:<9} {sum(r.nfe for r in rs):>9} {statistics.median(walls[way]):>8.3f} {ok:>4}/{len(rs)}  "
              f"{rs[0].text}")
    nfe = sum(r.nfe for r in last["template"]) / sum(r.nfe for r in last["free"])
    wall = statistics.median(walls["template"]) / statistics.median(walls["free"])
    print(f"template / free: forwards {nfe:.2f}x, wall time {wall:.2f}x")


if __name__ == "__main__":
    main()
