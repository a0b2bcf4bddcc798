#!/usr/bin/env python3
"""Do a constraint's masks follow the machine? Seeded canvas walks (masks of every open position at each step, then a
few commits the seed picks among the allowed tokens) on JSON schemas, compared with the same walk run first, alone,
on a freshly compiled constraint (cold cache):

  warm      the same walks on a constraint that other walks explored first (the shared automaton, warm);
  threads   the walks from 4 threads at once on one compiled constraint, beside 3 busy threads (a loaded machine).

Prints, per condition, how many walks gave the reference's masks at every step (and how many ended with an error).

    python benchmarks/bench_determinism.py                       # bpe128k tokenizer, 6 schemas x 4 seeds
    python benchmarks/bench_determinism.py --tokenizer bundled   # the bundled model's 4K tokenizer
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                      "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}}},
     "required": ["name", "age", "tags"]},
    {"oneOf": [{"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
                "additionalProperties": False},
               {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
                "required": ["n", "ok"], "additionalProperties": False}]},
    {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"},
                                                                 "email": {"type": "string", "format": "email"}},
                                "required": ["id", "email"]}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {f"field_{i}": {"type": ["string", "number", "null"]} for i in range(8)},
     "required": ["field_0", "field_3"]},
    {"type": "object", "properties": {"date": {"type": "string", "format": "date"},
                                      "amount": {"type": "number", "minimum": 0, "maximum": 1000}},
     "required": ["date", "amount"], "additionalProperties": False},
    {"anyOf": [{"type": "string", "enum": ["north", "south", "east", "west"]},
               {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                "required": ["lat", "lon"]}]},
]


def walk(compiled, seed: int, n: int = 32, steps: int = 12) -> tuple:
    """The masks of every open position at each step of a seeded walk (or the error that ended it)."""
    from dllm_constrain.errors import DllmConstrainError

    rng = random.Random(seed)
    st = compiled.new_canvas_state(n)
    canvas = [compiled.mask_id] * n
    out = []
    try:
        for _ in range(steps):
            open_pos = [i for i, t in enumerate(canvas) if t == compiled.mask_id]
            if not open_pos:
                break
            rows = st.allowed_tokens(canvas, open_pos)
            out.append(rows.numpy().tobytes())
            proposals = [(p, rng.choice(toks), rng.random()) for j, p in enumerate(open_pos)
                         if (toks := rows[j].nonzero().flatten().tolist())]
            for p, t in st.select_commits(canvas, proposals[:4]):
                canvas[p] = t
    except DllmConstrainError as e:
        out.append(type(e).__name__)
    return tuple(out)


def spin(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        x = (x * 31 + 7) % 1_000_003


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="bpe128k", help="bpe128k (../shared/data/tokenizers) or bundled")
    ap.add_argument("--seeds", type=int, default=4)
    args = ap.parse_args()
    from dllm_constrain.constraints.compiler import ConstraintCompiler

    if args.tokenizer == "bundled":
        import dllm_constrain as dc

        info = dc.LLM().tokenizer_info()
    else:
        from bench_masks import SHARED, load_tokenizer

        _, info = load_tokenizer(os.path.join(SHARED, "data", "tokenizers", args.tokenizer))

    def fresh(schema):
        return ConstraintCompiler(info, cache=False).compile_json_schema(schema)

    jobs = [(k, s) for k in range(len(SCHEMAS)) for s in range(args.seeds)]
    reference = {(k, s): walk(fresh(SCHEMAS[k]), s) for k, s in jobs}
    shared = [fresh(schema) for schema in SCHEMAS]
    for k, schema in enumerate(SCHEMAS):  # other walks explore the automaton first
        for s in range(100, 104):
            walk(shared[k], s)
    warm = {(k, s): walk(shared[k], s) for k, s in jobs}
    loaded = [fresh(schema) for schema in SCHEMAS]
    stop = threading.Event()
    hogs = [threading.Thread(target=spin, args=(stop,), daemon=True) for _ in range(3)]
    for h in hogs:
        h.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            threaded = dict(zip(jobs, pool.map(lambda j: walk(loaded[j[0]], j[1]), jobs)))
    finally:
        stop.set()
    errors = sum(isinstance(r[-1], str) for r in reference.values() if r)
    print(f"tokenizer {args.tokenizer}: {len(jobs)} walks, reference errors {errors}")
    for name, got in (("warm", warm), ("threads", threaded)):
        same = sum(got[j] == reference[j] for j in jobs)
        errs = sum(bool(got[j]) and isinstance(got[j][-1], str) for j in jobs)
        print(f"{name:8s} equal to the reference: {same}/{len(jobs)}  (ended with an error: {errs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
