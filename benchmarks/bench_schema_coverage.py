#!/usr/bin/env python3
"""Which JSONSchemaBench schemas compile, and which typed refusal the others get: byte automata only (no
tokenizer, no masks), so a whole dataset takes minutes; two trees compared schema by schema with --compare.

    OMP_NUM_THREADS=1 python benchmarks/bench_schema_coverage.py --data ../shared/data/jsonschemabench --out /tmp/a.json
    python benchmarks/bench_schema_coverage.py --data ../shared/data/jsonschemabench --subsets Github_hard --out /tmp/b.json
    python benchmarks/bench_schema_coverage.py --compare /tmp/a.json /tmp/b.json

Per schema (compiled with the specification's options, `--timeout` seconds each): "compiled" when every valid
instance of the dataset (compact JSON) is in the language, "compiled, a valid instance rejected" when one is not,
else the error class and the keyword it names. The evals (`python -m dllm_constrain.evals jsonschemabench`) measure
the same per token with masks; this is the quick look at what a compiler change moves. Compile times depend on
the machine's load: a refusal by CompilationTimeoutError near the limit may move between runs.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import warnings

from dllm_constrain.constraints.deadline import Deadline
from dllm_constrain.constraints.deriv import DerivDFA
from dllm_constrain.constraints.json_schema import SchemaOptions, schema_to_regex_ast


def outcome(record: dict, timeout: float) -> str:
    try:
        dfa = DerivDFA(schema_to_regex_ast(record["schema"], SchemaOptions(), Deadline(timeout)))
    except Exception as e:  # noqa: BLE001 - every refusal is an outcome to count
        return f"{type(e).__name__}:{getattr(e, 'keyword', '') or ''}"
    valid = [t["data"] for t in record.get("tests", []) if t.get("valid")]
    ok = all(dfa.matches(json.dumps(x, separators=(",", ":"), ensure_ascii=False).encode()) for x in valid)
    return "compiled" if ok else "compiled, a valid instance rejected"


def scan(data: str, subsets: list[str], timeout: float) -> dict[str, str]:
    out = {}
    for path in sorted(glob.glob(os.path.join(data, "*.jsonl"))):
        if subsets and os.path.basename(path)[:-len(".jsonl")] not in subsets:
            continue
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                out[record["id"]] = outcome(record, timeout)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data")
    ap.add_argument("--subsets", default="", help="comma-separated file stems (default: all)")
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--out", help="write {schema id: outcome} here")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="two --out files: the moves")
    args = ap.parse_args()
    if args.compare:
        a, b = (json.load(open(p)) for p in args.compare)
        moves = collections.Counter((a[k], b[k]) for k in a if k in b and a[k] != b[k])
        for (x, y), n in moves.most_common():
            print(f"{n:5d}  {x} -> {y}")
        for name, d in (("before", a), ("after", b)):
            print(name, sum(v == "compiled" for v in d.values()), "/", len(d), "compiled with every valid instance")
        return
    warnings.simplefilter("ignore")  # UnknownKeywordWarning on many dataset schemas
    res = scan(args.data, [s for s in args.subsets.split(",") if s], args.timeout)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f)
    for k, n in collections.Counter(res.values()).most_common():
        print(f"{n:5d}  {k}")


if __name__ == "__main__":
    main()
