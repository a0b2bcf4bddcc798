#!/usr/bin/env python3
"""Constraint-layer benchmark on JSONSchemaBench: compile time, time to first mask, per-step canvas mask
cost for a block of 32 open positions, and coverage (valid instances accepted, invalid rejected).

    python benchmarks/bench_masks.py                      # 200 schemas (same sample as anchors_mask_bench)
    python benchmarks/bench_masks.py --n-per-subset 3     # quick
    python benchmarks/bench_masks.py --json out.json      # also write per-schema rows

Sampling: the 10 JSONSchemaBench subsets in the same mix and with the same seed logic as
../shared/tools/anchors_mask_bench.py (schemas with at least one valid instance), so figures compare with
its anchors table (tools/anchors-jsb200-bpe128k.md).

Per schema (single thread, cold compiler cache):
  compile      : schema -> CompiledConstraint (our JSON Schema compiler, lazy DFA start state);
  TTFM (AR)    : compile + the first left-to-right next-token mask (what the anchors measure);
  TTFM (canvas): compile + new_canvas_state(n) + masks for the first 32 positions of an all-open canvas;
  step         : one allowed_tokens() call for the <= 32 open positions of the current block while the
                 first valid instance is committed in random order, a few tokens per step, semi-AR blocks
                 of 32 (the instance's own tokens must be allowed at every step: a strong exactness check);
  valid        : the first valid instance is accepted (the walk above ends completable), up to
                 --max-instances valid instances per schema;
  invalid      : every invalid instance's token sequence is rejected by the compiled automaton.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED = os.path.join(os.path.dirname(ROOT), "shared")

DEFAULT_MIX = {
    "Glaiveai2K": 25, "Github_trivial": 15, "Github_easy": 30, "Github_medium": 30,
    "Github_hard": 25, "Github_ultra": 10, "Kubernetes": 20, "Snowplow": 20,
    "WashingtonPost": 10, "JsonSchemaStore": 15,
}


def load_sample(data_dir: str, seed: int, mix: dict[str, int]) -> list[dict]:
    recs = {}
    for fn in sorted(os.listdir(data_dir)):
        if fn.endswith(".jsonl"):
            with open(os.path.join(data_dir, fn)) as f:
                for ln in f:
                    r = json.loads(ln)
                    recs[r["id"]] = r
    has_valid = [r for r in recs.values() if any(t.get("valid") for t in r.get("tests", []))]
    rng = random.Random(seed)
    out = []
    for sub, n in mix.items():
        pool = sorted([r for r in has_valid if r["subset"] == sub], key=lambda r: r["id"])
        out += rng.sample(pool, min(n, len(pool)))
    return out


def add_sample_args(ap: argparse.ArgumentParser) -> None:
    """--data (JSONSchemaBench directory), --tokenizer (tokenizer folder), --seed: the sample's arguments."""
    ap.add_argument("--data", default=os.path.join(SHARED, "data", "jsonschemabench"))
    ap.add_argument("--tokenizer", default=os.path.join(SHARED, "data", "tokenizers", "bpe128k"))
    ap.add_argument("--seed", type=int, default=0)


def load_tokenizer(tokenizer_dir: str):
    """(tokenizers.Tokenizer, TokenizerInfo) of the tokenizer folder, its per-tokenizer tables built (setup, not a
    schema's time), the pad token as the canvas mask id (never produced by a constraint)."""
    from tokenizers import Tokenizer

    from dllm_constrain.constraints import TokenizerInfo

    tk = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    info = TokenizerInfo.from_tokenizer(tokenizer_dir, mask_id=tk.token_to_id("<|pad|>"))
    info.prepare()
    return tk, info


def write_json(path: str | None, figures: object) -> None:
    """Write `figures` to `path` (the --json argument) when one was given: every benchmark here writes its
    figures the same way, so a reader of one file reads them all."""
    if path:
        with open(path, "w") as fh:
            json.dump(figures, fh, indent=1)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[k]


def canvas_walk(cc, ids: list[int], eos: int, mask_id: int, block: int, per_step: int, rng: random.Random,
                step_times: list[float], commit_times: list[float], misses: list[int],
                bitmask=None) -> tuple[bool, str]:
    """Denoise a canvas towards `ids` (+EOS padding) in semi-AR blocks: each step asks the masks of every
    open position of the block (timed; into the preallocated token bitmask `bitmask` with `fill_token_bitmask`,
    as the engine asks them, or as bool rows from `allowed_tokens` when it is None), then commits up to
    `per_step` random positions among those whose instance token is allowed, through select_commits (all must
    be kept). Fails if no open position of the block allows its instance token. misses[0] counts open
    positions whose instance token was not allowed at some step (masks narrowed by the per-call expansion
    budget, or a missed instance)."""
    from dllm_constrain.kernels.bitmask import bitmask_bytes, row_allows

    n = len(ids) + 4
    target = list(ids) + [eos] * (n - len(ids))
    st = cc.new_canvas_state(n)
    canvas = [mask_id] * n
    for b0 in range(0, n, block):
        blk = list(range(b0, min(n, b0 + block)))
        while True:
            open_pos = [p for p in blk if canvas[p] == mask_id]
            if not open_pos:
                break
            for _attempt in range(20):
                t0 = time.perf_counter()
                if bitmask is None:
                    m = st.allowed_tokens(canvas, open_pos).numpy()
                else:
                    st.fill_token_bitmask(canvas, open_pos, bitmask)
                    m = bitmask_bytes(bitmask)
                step_times.append(time.perf_counter() - t0)
                ok_pos = [p for j, p in enumerate(open_pos) if row_allows(m[j], target[p])]
                misses[0] += len(open_pos) - len(ok_pos)
                if ok_pos:
                    break
                misses[2] += 1  # ask again: each call extends the known part of the automaton
            if not ok_pos:
                return False, f"no open position of the block allows its instance token (first open {open_pos[0]})"
            chosen = rng.sample(ok_pos, min(per_step, len(ok_pos)))
            props = [(p, target[p], rng.random()) for p in chosen]
            t0 = time.perf_counter()
            kept = st.select_commits(canvas, props)
            commit_times.append(time.perf_counter() - t0)
            if not kept:
                return False, "select_commits kept nothing"
            misses[1] += len(props) - len(kept)  # remasked: not certified jointly within the budget
            for p, t in kept:
                canvas[p] = t
    ok = st.is_completable(canvas)
    misses[3] += st.exact_fallbacks
    if not ok:
        return False, "final canvas not valid"
    return True, ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sample_args(ap)
    ap.add_argument("--n-per-subset", type=int, default=0, help="override the mix: N schemas per subset")
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--per-step", type=int, default=4, help="commits per denoising step in the walk")
    ap.add_argument("--max-instances", type=int, default=2, help="valid instances walked on the canvas per schema")
    ap.add_argument("--max-tokens", type=int, default=600, help="skip canvas walks of longer instances")
    ap.add_argument("--timeout", type=float, default=10.0, help="compile time limit (s)")
    ap.add_argument("--json", default=None, help="write per-schema rows here")
    ap.add_argument("--ids-file", default=None, help="only these schema ids (one per line)")
    ap.add_argument("--verbose", action="store_true", help="one line per schema on stderr")
    ap.add_argument("--no-walk", action="store_true",
                    help="coverage only: a valid instance counts as accepted when it is in the compiled language "
                         "(no canvas TTFM, no canvas walk; the walk is exact, so the counts agree up to its budget)")
    ap.add_argument("--schema-option", action="append", default=[], metavar="NAME=VALUE",
                    help="a json_schema.SchemaOptions field for every compile, e.g. any_json_depth=5 (repeatable)")
    ap.add_argument("--masks", choices=("bitmask", "bool"), default="bitmask",
                    help="step masks into one preallocated int32 token bitmask (fill_token_bitmask, the engine's "
                         "path; default) or as a new bool tensor per call (allowed_tokens)")
    ap.add_argument("--strict", action="store_true",
                    help="compile with generate()'s default options (api.STRICT_SCHEMA_OPTIONS: no undeclared "
                         "properties, declared order, free-form depth 3, ...); --schema-option overrides them")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from dllm_constrain.constraints import ConstraintCompiler, clear_cache
    from dllm_constrain.errors import ConstraintError
    from dllm_constrain.kernels.bitmask import allocate_token_bitmask

    if not os.path.isdir(args.data):
        print(f"no JSONSchemaBench data at {args.data}", file=sys.stderr)
        return 2
    mix = DEFAULT_MIX if not args.n_per_subset else {k: args.n_per_subset for k in DEFAULT_MIX}
    items = load_sample(args.data, args.seed, mix)
    if args.ids_file:
        want = {x.strip() for x in open(args.ids_file) if x.strip()}
        items = [r for r in items if r["id"] in want]
    t0 = time.perf_counter()
    tk, info = load_tokenizer(args.tokenizer)
    pad = info.mask_id
    setup_s = time.perf_counter() - t0
    comp = ConstraintCompiler(info, timeout_s=args.timeout)
    eos, mask_id = info.eos_id, pad
    gc.collect()
    gc.freeze()  # the tokenizer tables are long-lived: keep them out of every later GC pass

    bitmask = allocate_token_bitmask(args.block, info.vocab_size) if args.masks == "bitmask" else None
    rows = []
    step_times: list[float] = []
    commit_times: list[float] = []
    per_sub: dict[str, Counter] = defaultdict(Counter)
    errors: Counter = Counter()
    rng = random.Random(args.seed)
    misses = [0, 0, 0, 0]
    schema_options = {k: int(v) if v.lstrip("-").isdigit() else v
                      for k, v in (o.split("=", 1) for o in args.schema_option)}
    if args.strict:
        from dllm_constrain.api import STRICT_SCHEMA_OPTIONS

        schema_options = {**STRICT_SCHEMA_OPTIONS, **schema_options}
    # warm-up (first-use costs: imports, jsonschema, GC) on a trivial schema
    comp.compile_json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}).matcher().fill_mask()
    for k, r in enumerate(items):
        sub = r["subset"]
        t_schema = time.perf_counter()
        row = {"id": r["id"], "subset": sub}
        per_sub[sub]["n"] += 1
        clear_cache()
        t0 = time.perf_counter()
        try:
            cc = comp.compile_json_schema(r["schema"], **schema_options)
        except ConstraintError as e:
            row["compile_error"] = f"{type(e).__name__}: {e}"[:300]
            errors[f"{type(e).__name__}: {getattr(e, 'keyword', '')}"] += 1
            rows.append(row)
            continue
        t1 = time.perf_counter()
        m = cc.matcher()
        m.fill_mask()
        t2 = time.perf_counter()
        row["compile_ms"] = (t1 - t0) * 1e3
        row["ttfm_ar_ms"] = (t2 - t0) * 1e3
        per_sub[sub]["compiled"] += 1
        valids = [t for t in r["tests"] if t.get("valid")]
        invalids = [t for t in r["tests"] if not t.get("valid")]
        enc = lambda t: tk.encode(json.dumps(t["data"], separators=(",", ":"), ensure_ascii=False),  # noqa: E731
                                  add_special_tokens=False).ids
        # TTFM on the canvas: a fresh compile (the matcher above warmed the automaton)
        first_ids = enc(valids[0]) if valids else []
        n = max(len(first_ids) + 4, args.block)
        clear_cache()
        t0 = time.perf_counter()
        try:
            if args.no_walk:
                raise ConstraintError("--no-walk")
            cc2 = comp.compile_json_schema(r["schema"], **schema_options)
            st = cc2.new_canvas_state(n)
            st.allowed_tokens([mask_id] * n, list(range(min(n, args.block))))
            row["ttfm_canvas_ms"] = (time.perf_counter() - t0) * 1e3
        except ConstraintError as e:
            row["ttfm_canvas_error"] = str(e)[:200]
        cc = cc2 if "ttfm_canvas_ms" in row else cc
        # valid instances on the canvas
        acc = 0
        tried = 0
        for t in valids[: args.max_instances]:
            ids = enc(t)
            if len(ids) > args.max_tokens:
                per_sub[sub]["valid_skipped_long"] += 1
                continue
            tried += 1
            if not cc.accepts_tokens(ids):
                # outside the (narrowed) language: e.g. keys not in the declared order, see docs/constraints.md
                per_sub[sub]["valid_outside_language"] += 1
                row.setdefault("valid_fail", []).append("outside the compiled language (a documented narrowing)")
                continue
            try:
                ok, why = (True, "") if args.no_walk else canvas_walk(cc, ids, eos, mask_id, args.block, args.per_step,
                                                                      rng, step_times, commit_times, misses,
                                                                      bitmask)
            except ConstraintError as e:
                ok, why = False, f"{type(e).__name__}: {e}"
            if ok:
                acc += 1
            else:
                row.setdefault("valid_fail", []).append(why[:200])
        per_sub[sub]["valid_tried"] += tried
        per_sub[sub]["valid_ok"] += acc
        if tried and acc == tried:
            per_sub[sub]["schemas_all_valid_ok"] += 1
        # invalid instances: the automaton must reject them
        rej = 0
        for t in invalids:
            if not cc.accepts_tokens(enc(t)):
                rej += 1
            else:
                row.setdefault("invalid_accepted", []).append(json.dumps(t["data"])[:200])
        per_sub[sub]["invalid"] += len(invalids)
        per_sub[sub]["invalid_rej"] += rej
        row["dfa_states"] = cc.dfa.n_states
        rows.append(row)
        if args.verbose:
            print(f"  {k + 1}/{len(items)} {r['id'][:50]:50s} compile {row.get('compile_ms', 0):8.1f} ms  "
                  f"canvas TTFM {row.get('ttfm_canvas_ms', 0):9.1f} ms  states {row.get('dfa_states')}  "
                  f"walk {time.perf_counter() - t_schema:6.1f} s", file=sys.stderr, flush=True)
        elif (k + 1) % 20 == 0:
            print(f"  {k + 1}/{len(items)} schemas", file=sys.stderr)

    comp_ms = [r["compile_ms"] for r in rows if "compile_ms" in r]
    ttfm_ar = [r["ttfm_ar_ms"] for r in rows if "ttfm_ar_ms" in r]
    ttfm_cv = [r["ttfm_canvas_ms"] for r in rows if "ttfm_canvas_ms" in r]
    steps_us = [x * 1e6 for x in step_times]
    commits_us = [x * 1e6 for x in commit_times]
    print(f"\n# bench_masks: {len(items)} schemas, tokenizer {os.path.basename(os.path.normpath(args.tokenizer))} "
          f"(vocab {info.vocab_size}), setup {setup_s:.2f} s, torch threads 1, step masks as {args.masks}, "
          f"schema options {schema_options or 'none'}\n")
    print("| metric | p50 | p95 | p99 | max | n |")
    print("|---|---|---|---|---|---|")
    for name, xs, unit in (("compile (ms)", comp_ms, ""), ("TTFM left-to-right (ms)", ttfm_ar, ""),
                           ("TTFM canvas, 32 positions (ms)", ttfm_cv, ""),
                           ("step mask, <=32 open positions (us)", steps_us, ""),
                           ("select_commits per step (us)", commits_us, "")):
        if xs:
            cells = " | ".join(f"{v:.1f}" for v in (pct(xs, .5), pct(xs, .95), pct(xs, .99), max(xs)))
            print(f"| {name} | {cells} | {len(xs)} |")
    print(f"\nopen positions whose instance token was not (yet) allowed at a step: {misses[0]}; proposals remasked "
          f"by select_commits: {misses[1]}; steps repeated because no block position allowed its instance "
          f"token yet: {misses[2]} (over {len(step_times)} steps; masks narrowed by the per-call expansion budget); "
          f"calls redone without the budget because it left them inconclusive: {misses[3]}")
    over = sum(1 for x in comp_ms if x > 10_000)
    print(f"\nschemas over 10 s: {over};  compiled {len(comp_ms)}/{len(items)}")
    print("\n| subset | schemas | compiled | valid accepted (instances) | outside the narrowed language | "
          "schemas with all valid accepted | invalid rejected |")
    print("|---|---|---|---|---|---|---|")
    tot = Counter()
    for sub in mix:
        c = per_sub[sub]
        tot.update(c)
        print(f"| {sub} | {c['n']} | {c['compiled']} | {c['valid_ok']}/{c['valid_tried']} | "
              f"{c['valid_outside_language']} | {c['schemas_all_valid_ok']} | {c['invalid_rej']}/{c['invalid']} |")
    print(f"| **total** | {tot['n']} | {tot['compiled']} | {tot['valid_ok']}/{tot['valid_tried']} | "
          f"{tot['valid_outside_language']} | {tot['schemas_all_valid_ok']} | {tot['invalid_rej']}/{tot['invalid']} |")
    if errors:
        print("\ncompile refusals:", ", ".join(f"{k} x{v}" for k, v in errors.most_common()))
    fails = Counter(w.split(" at ")[0] for r in rows for w in r.get("valid_fail", []))
    if fails:
        print("valid-instance failures:", ", ".join(f"{k} x{v}" for k, v in fails.most_common()))
    bad = [r["id"] for r in rows if r.get("invalid_accepted")]
    print(f"invalid instances accepted: {sum(len(r.get('invalid_accepted', [])) for r in rows)} {bad[:10]}")
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
