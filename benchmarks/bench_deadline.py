#!/usr/bin/env python3
"""Per-call time bounds on the constraint path: random canvas fills of JSONSchemaBench schemas under the per-call
deadline (`constraint_timeout`), in both semantics (strict: generate()'s default options; spec: strict=False).

    python benchmarks/bench_deadline.py --limit 40 --timeout 0.5

Per schema and semantics (cold compiler cache): compile (own limit, --compile-timeout), new_canvas_state(n) for a
random n in [16, 128], then a random denoising: semi-AR blocks of 32, each step asks allowed_tokens() for the
block's open positions, proposes up to 4 random allowed tokens (the left frontier always among them), verifies
them with select_commits(); with none kept it commits the best one as the engine does and asks is_completable()
(undo on False). Every constraint call is timed (new_canvas_state, allowed_tokens, select_commits,
is_completable). Reported: max / p99 / p50 per-call time, how often the deadline fired (calls answering from what
they had, and runs ended by ConstraintTimeoutError), and invalid outputs (a filled canvas that the compiled
automaton or jsonschema rejects). A run is cut after --run-cap seconds (counted; never an output).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_masks import DEFAULT_MIX, add_sample_args, load_sample, load_tokenizer, pct  # noqa: E402


def fill(cc, st, n, eos, mask_id, rng, times, stats, run_cap):
    """One random canvas fill; returns the token ids (None if it did not finish)."""
    import numpy as np

    from dllm_constrain.errors import ConstraintTimeoutError

    canvas = [mask_id] * n
    banned: set[tuple[int, int]] = set()
    t_run = time.perf_counter()
    block = 32
    for _step in range(4 * n + 64):
        if time.perf_counter() - t_run > run_cap:
            stats["runs_cut"] += 1
            return None
        if eos in canvas:
            k = canvas.index(eos)
            if all(c != mask_id for c in canvas[:k]):
                canvas[k:] = [eos] * (n - k)
        open_pos = [i for i, c in enumerate(canvas) if c == mask_id]
        if not open_pos:
            return canvas
        b0 = (open_pos[0] // block) * block
        positions = [p for p in open_pos if p < b0 + block]
        try:
            t0 = time.perf_counter()
            masks = st.allowed_tokens(canvas, positions).numpy()
            times.append(time.perf_counter() - t0)
            cand = []
            for j, p in enumerate(positions):
                row = masks[j]
                toks = [t for t in np.flatnonzero(row).tolist() if (p, t) not in banned]
                if toks:
                    cand.append((p, rng.choice(toks)))
            if not cand:
                stats["no_candidate"] += 1
                return None
            front = [c for c in cand if c[0] == open_pos[0]]
            rest = [c for c in cand if c[0] != open_pos[0]]
            picks = front + rng.sample(rest, min(len(rest), 4 - len(front)))
            proposals = [(p, t, 1.0 - 0.01 * k) for k, (p, t) in enumerate(picks)]
            t0 = time.perf_counter()
            kept = st.select_commits(canvas, proposals)
            times.append(time.perf_counter() - t0)
            blind = not kept
            if blind:
                kept = [proposals[0][:2]]
            for p, t in kept:
                canvas[p] = t
            t0 = time.perf_counter()
            ok = st.is_completable(canvas)
            times.append(time.perf_counter() - t0)
            if not ok:
                for p, t in kept:
                    canvas[p] = mask_id
                    banned.add((p, t))
                stats["backtracks"] += 1
        except ConstraintTimeoutError:
            times.append(time.perf_counter() - t0)
            stats["runs_timeout_error"] += 1
            return None
    stats["step_bound"] += 1
    return None


def valid(cc, schema, ids, eos) -> bool | None:
    if not cc.accepts_tokens(ids):
        return False
    k = ids.index(eos) if eos in ids else len(ids)
    data = b"".join(cc.tokenizer_info.token_bytes[t] for t in ids[:k])
    try:
        inst = json.loads(data.decode("utf-8"))
    except Exception:  # noqa: BLE001
        return False
    try:
        import jsonschema

        cls = jsonschema.validators.validator_for(schema)
        return cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(inst)
    except Exception:  # noqa: BLE001 - a schema jsonschema itself cannot handle: unchecked
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sample_args(ap)
    ap.add_argument("--limit", type=int, default=40, help="schemas (spread over the 200-schema sample)")
    ap.add_argument("--timeout", type=float, default=0.5, help="per-call constraint_timeout (s)")
    ap.add_argument("--compile-timeout", type=float, default=10.0)
    ap.add_argument("--run-cap", type=float, default=30.0, help="wall seconds per canvas fill")
    ap.add_argument("--semantics", default="strict,spec")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from dllm_constrain.api import STRICT_SCHEMA_OPTIONS
    from dllm_constrain.constraints import ConstraintCompiler, clear_cache
    from dllm_constrain.errors import ConstraintError, ConstraintTimeoutError

    items = load_sample(args.data, args.seed, DEFAULT_MIX)
    step = max(1, len(items) // args.limit)
    items = items[::step][: args.limit]
    _, info = load_tokenizer(args.tokenizer)
    pad = info.mask_id
    comp = ConstraintCompiler(info, timeout_s=args.compile_timeout)
    eos = info.eos_id
    report = {}
    for sem in args.semantics.split(","):
        opts = STRICT_SCHEMA_OPTIONS if sem == "strict" else {}
        rng = random.Random(args.seed)
        times: list[float] = []
        compile_times: list[float] = []
        ttfm: list[float] = []
        stats: Counter = Counter()
        hits = 0
        for r in items:
            clear_cache()
            t0 = time.perf_counter()
            try:
                cc = comp.compile_json_schema(r["schema"], **opts)
            except ConstraintError as e:
                compile_times.append(time.perf_counter() - t0)
                stats["compile_timeout" if "Timeout" in type(e).__name__ else "compile_refused"] += 1
                continue
            compile_times.append(time.perf_counter() - t0)
            n = rng.randint(16, 128)
            t0 = time.perf_counter()
            try:
                st = cc.new_canvas_state(n, timeout_s=args.timeout)
            except ConstraintError as e:
                times.append(time.perf_counter() - t0)
                stats["too_long" if not isinstance(e, ConstraintTimeoutError) else "runs_timeout_error"] += 1
                continue
            t_new = time.perf_counter() - t0
            times.append(t_new)
            k0 = len(times)
            ids = fill(cc, st, n, eos, pad, rng, times, stats, args.run_cap)
            if len(times) > k0:
                ttfm.append(t_new + times[k0])
            hits += st.deadline_hits
            stats["runs"] += 1
            if ids is not None:
                v = valid(cc, r["schema"], ids, eos)
                stats["outputs"] += 1
                stats["invalid" if v is False else ("valid" if v else "unchecked")] += 1
                if v is False:
                    print("INVALID", r["id"], sem, file=sys.stderr)
        row = {
            "schemas": len(items), "calls": len(times), "max_call_ms": 1e3 * max(times, default=0),
            "p99_call_ms": 1e3 * pct(times, 0.99), "p50_call_ms": 1e3 * pct(times, 0.5),
            "calls_over_1s": sum(t > 1.0 for t in times), "deadline_fired_calls": hits,
            "ttfm_max_ms": 1e3 * max(ttfm, default=0), "compile_max_ms": 1e3 * max(compile_times, default=0),
            **dict(stats),
        }
        report[sem] = row
        print(sem, json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
