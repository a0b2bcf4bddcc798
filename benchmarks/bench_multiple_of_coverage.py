#!/usr/bin/env python3
"""How many two-decimal values a `multipleOf: 0.01` schema admits, under each `multiple_of` reading, next to
how many python-jsonschema accepts.

    OMP_NUM_THREADS=1 python benchmarks/bench_multiple_of_coverage.py
    python benchmarks/bench_multiple_of_coverage.py --samples 50000 --seed 1

For each schema, `--samples` values k/100 drawn uniformly from its range (from [-100000, 100000] where a side
is open), spelled canonically (no trailing zeros: the spelling the automaton generates). Columns: the share
python-jsonschema accepts, the share the compiled automaton admits, the share of jsonschema's values the
automaton admits, and the count it admits that jsonschema rejects (0 for the default "float" reading; the
"decimal" reading admits every k/100 and so every value jsonschema's float test rejects). Compile time: one
compile, milliseconds (a shared, loaded machine: compare only side by side).
"""
from __future__ import annotations

import argparse
import json
import random
import time
from decimal import Decimal

import jsonschema

from dllm_constrain.constraints.deriv import DerivDFA
from dllm_constrain.constraints.json_schema import SchemaOptions, schema_to_regex_ast

SCHEMAS = [
    {"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 1000},
    {"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 100000},
    {"type": "number", "multipleOf": 0.01, "minimum": 0},
    {"type": "number", "multipleOf": 0.01},
]


def canonical(cents: int) -> str:
    return format((Decimal(cents) / 100).normalize(), "f")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print("| schema | reading | jsonschema accepts | admitted | of jsonschema's | admitted, jsonschema rejects "
          "| compile ms |")
    print("|---|---|---|---|---|---|---|")
    for s in SCHEMAS:
        rng = random.Random(args.seed)
        lo, hi = s.get("minimum", -100000), s.get("maximum", 100000)
        texts = [canonical(rng.randint(int(lo * 100), int(hi * 100))) for _ in range(args.samples)]
        v = jsonschema.Draft202012Validator(s)
        valid = [v.is_valid(json.loads(t)) for t in texts]
        for reading in ("float", "decimal"):
            try:  # (a tree without the option: the default reading only, to compare)
                opts = SchemaOptions() if reading == "float" else SchemaOptions(multiple_of=reading)
            except TypeError:
                continue
            t0 = time.perf_counter()
            dfa = DerivDFA(schema_to_regex_ast(s, opts))
            ms = (time.perf_counter() - t0) * 1e3
            got = [dfa.matches(t.encode()) for t in texts]
            both = sum(g and ok for g, ok in zip(got, valid))
            wrong = sum(g and not ok for g, ok in zip(got, valid))
            n = len(texts)
            print(f"| `{json.dumps({k: x for k, x in s.items() if k != 'type'})}` | {reading} | "
                  f"{sum(valid) / n:.1%} | {sum(got) / n:.1%} | {both / max(sum(valid), 1):.1%} | {wrong} | {ms:.0f} |")


if __name__ == "__main__":
    main()
