"""The JSONSchemaBench material of bench_peer_soundness.py: schemas judged by python-jsonschema.

Strings: hypothesis-jsonschema instances, the dataset's own instances, simple mutants of them and random members
of our automaton, as compact JSON text. Ours: accepts_tokens on the bpe32k tokenization (a byte tokenizer without
../shared), cross-checked with accepts_text.
"""
from __future__ import annotations

import copy
import json
import os
import random
import sys
import time

from _peer_common import SHARED, Tally, Timeout, byte_info, compile_or_tally, dfa_samples, time_limit

def json_mutants(v, schema, rng: random.Random) -> list:
    """Simple mutants: a value's type changed, a required key dropped, a key added, a number perturbed."""
    paths = []

    def walk(x, path):
        paths.append(path)
        if isinstance(x, dict):
            for k, y in x.items():
                walk(y, path + (k,))
        elif isinstance(x, list):
            for i, y in enumerate(x):
                walk(y, path + (i,))

    walk(v, ())

    def get(x, path):
        for p in path:
            x = x[p]
        return x

    def put(root, path, val):
        if not path:
            return val
        root = copy.deepcopy(root)
        get(root, path[:-1])[path[-1]] = val
        return root

    out = []
    # a value's type changed
    for path in rng.sample(paths, min(3, len(paths))):
        x = get(v, path)
        alts = [None, True, 0, -1, 1.5, "x", "", [], {}, [x], {"k": x}, str(x)[:20]]
        alts = [a for a in alts if type(a) is not type(x)]
        out.append(put(v, path, rng.choice(alts)))
    # a required key dropped, a key added
    objs = [p for p in paths if isinstance(get(v, p), dict)]
    for path in rng.sample(objs, min(2, len(objs))):
        o = get(v, path)
        if o:
            k = rng.choice(sorted(o))
            o2 = {kk: vv for kk, vv in o.items() if kk != k}
            out.append(put(v, path, o2))
        o3 = dict(o)
        o3[rng.choice(["extra", "zz", "", "id", "name", "type"])] = rng.choice([1, "x", None, {}])
        out.append(put(v, path, o3))
    # a number perturbed
    nums = [p for p in paths if isinstance(get(v, p), (int, float)) and not isinstance(get(v, p), bool)]
    for path in rng.sample(nums, min(3, len(nums))):
        x = get(v, path)
        d = rng.choice([1, -1, 0.5, -0.5, 1e-9, -1e-9, 10, x, -2 * x if x else -1])
        y = x + d
        if rng.random() < 0.3:
            y = float(x) + (1e-7 if rng.random() < 0.5 else -1e-7)
        out.append(put(v, path, y))
    return out


def hypothesis_instances(schema, k: int, seed: int) -> list:
    from hypothesis import HealthCheck, given, settings
    from hypothesis_jsonschema import from_schema

    got = []
    strat = from_schema(schema)

    @settings(max_examples=k, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strat)
    def draw(x):
        got.append(x)

    draw()
    return got


def known_json(schema, inst, errors) -> str:
    kws = {e.validator for e in errors}
    if "patternProperties" in json.dumps(schema) and ({"patternProperties", "additionalProperties"} & kws or
                                                        any("patternProperties" in e.schema_path for e in errors)):
        return "patternProperties (Unicode classes)"
    if kws & {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"} and \
            any(isinstance(e.instance, float) for e in errors):
        return "float reading of a number near a bound"
    return ""


def run_jsb(args, rng: random.Random) -> Tally | None:
    if not os.path.isdir(args.data):
        print(f"jsb: no JSONSchemaBench data at {args.data}; skipped (needs ../shared/data/jsonschemabench)",
              file=sys.stderr)
        return None
    from dllm_constrain.constraints import ConstraintCompiler, clear_cache

    tk, info = judging_tokenizer()
    comp = ConstraintCompiler(info, timeout_s=args.compile_timeout)
    opts = {}
    if args.strict:
        from dllm_constrain.api import STRICT_SCHEMA_OPTIONS

        opts = dict(STRICT_SCHEMA_OPTIONS)
    T = Tally("JSONSchemaBench (python-jsonschema, formats on)" + (" strict" if args.strict else ""))
    hyp_fail = 0
    t_end = time.time() + args.jsb_seconds
    for r in sampled_records(args.data, args.schemas, args.seed):
        if time.time() > t_end:
            T.notes["schemas not reached within --jsb-seconds"] += 1
            continue
        T.items += 1
        schema = r["schema"]
        clear_cache()
        validator = schema_reader(T, schema)
        if validator is None:
            continue
        cc = compile_or_tally(T, r["id"], lambda: comp.compile_json_schema(copy.deepcopy(schema), **opts),
                              args.item_timeout)
        if cc is None:
            continue
        T.compiled += 1
        texts, hyp_ok = candidate_texts(T, r, cc, args, rng)
        hyp_fail += not hyp_ok
        try:
            with time_limit(args.item_timeout * 2):
                for s in sorted(texts, key=lambda x: (len(x), x)):
                    if len(s) <= 4000:
                        judge_text(T, r["id"], schema, validator, cc, tk, info, s)
        except Timeout:
            T.notes["schemas whose strings ran past the item time limit"] += 1
    T.notes[f"schemas where hypothesis-jsonschema produced no instance: {hyp_fail}"] += 1
    return T


def judging_tokenizer():
    """(tokenizers.Tokenizer or None, TokenizerInfo): bpe32k from ../shared, else a byte tokenizer."""
    tok_dir = os.path.join(SHARED, "data", "tokenizers", "bpe32k")
    if not os.path.isdir(tok_dir):
        print("jsb: no bpe32k tokenizer; judging with a byte tokenizer", file=sys.stderr)
        return None, byte_info()
    from tokenizers import Tokenizer

    from dllm_constrain.constraints import TokenizerInfo

    tk = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    return tk, TokenizerInfo.from_tokenizer(tok_dir, mask_id=tk.token_to_id("<|pad|>"))


def sampled_records(data_dir: str, n: int, seed: int) -> list[dict]:
    """n records (schema, id, tests) drawn from every .jsonl file of the dataset."""
    recs = []
    for fn in sorted(os.listdir(data_dir)):
        if fn.endswith(".jsonl"):
            with open(os.path.join(data_dir, fn)) as f:
                recs += [json.loads(ln) for ln in f]
    return random.Random(seed).sample(recs, min(n, len(recs)))


def schema_reader(T: Tally, schema):
    """python-jsonschema's validator of the schema's $schema (default 2020-12), formats on; None (tallied) when
    the reader refuses the schema."""
    import jsonschema

    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        return cls(schema, format_checker=cls.FORMAT_CHECKER)
    except Exception as e:  # noqa: BLE001
        T.refused["reader refuses the schema"] += 1
        T.notes[f"reader refuses: {type(e).__name__}"] += 1
        return None


def candidate_texts(T: Tally, r: dict, cc, args, rng: random.Random) -> tuple[set[str], bool]:
    """(compact JSON texts to judge, whether hypothesis-jsonschema produced instances): instances, their
    mutants, and random members of our automaton."""
    schema = r["schema"]
    values = []
    hyp_ok = True
    try:
        with time_limit(args.item_timeout):
            # a deep copy: hypothesis-jsonschema rewrites the schema it is given in place (canonical forms),
            # which would change what the reader (sharing the dict) validates against
            values += hypothesis_instances(copy.deepcopy(schema), 4 if args.quick else 10, args.seed)
    except Exception:  # noqa: BLE001 (Timeout included: hypothesis-jsonschema's own limits)
        hyp_ok = False
    values += [t["data"] for t in r.get("tests", [])]
    texts: set[str] = set()
    for v in values:
        for w in [v] + json_mutants(v, schema, rng):
            try:
                texts.add(json.dumps(w, separators=(",", ":"), ensure_ascii=False, allow_nan=False))
            except (ValueError, TypeError):
                pass
    try:
        with time_limit(args.item_timeout):
            for b in dfa_samples(cc.dfa, rng, 3 if args.quick else 8, max_len=80):
                texts.add(b.decode("utf-8", "surrogatepass"))
    except (Timeout, UnicodeDecodeError):
        T.notes["sampling our automaton ran past the limit"] += 1
    return texts, hyp_ok


def judge_text(T: Tally, item: str, schema, validator, cc, tk, info, s: str) -> None:
    """One verdict: ours (by tokens when a tokenizer is given, cross-checked by bytes) against the reader's."""
    by_text = cc.accepts_text(s.encode("utf-8", "surrogatepass"))
    ours = by_text
    if tk is not None:
        ids = tk.encode(s, add_special_tokens=False).ids
        if any(info.token_bytes[t] is None for t in ids):
            # the text spells a special token ("<|end_of_text|>"), which the tokenizer maps to its id:
            # not a text the model could write with text tokens; judged on its bytes
            T.notes["texts spelling a special token (judged on bytes only)"] += 1
        else:
            ours = cc.accepts_tokens(ids)
            if ours != by_text:
                T.crashes.append(f"{item}: accepts_tokens {ours} != accepts_text {by_text} on {s[:80]!r}")
    try:
        errs = list(validator.iter_errors(json.loads(s)))
        reader = not errs
    except (ValueError, RecursionError):
        errs, reader = [], False
    T.judge(item, s, ours, reader, why="; ".join(f"{e.validator}: {e.message[:80]}" for e in errs[:2]),
            known=known_json(schema, s, errs) if (ours and not reader) else "")
