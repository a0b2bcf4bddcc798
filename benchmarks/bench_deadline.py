#!/usr/bin/env python3
"""Per-call time bounds on the constraint path: random canvas fills of JSONSchemaBench schemas under the per-call
deadline (`constraint_timeout`), in both semantics (strict: generate()'s default options; spec: strict=False).

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/bench_deadline.py --limit 200 --timeout 0.5 --progress

Per schema and semantics (cold compiler cache): compile (own limit, --compile-timeout), new_canvas_state(n) for a
random n in [16, 128], then a random denoising: semi-AR blocks of 32, each step asks allowed_tokens() for the
block's open positions, proposes up to 4 random allowed tokens (the left frontier always among them), verifies
them with select_commits(); with none kept it commits the best one as the engine does and asks is_completable()
(undo on False). Every constraint call is timed (new_canvas_state, allowed_tokens, select_commits,
is_completable; min_tokens and compile too, compile apart since it has its own limit). Reported: max / p99 / p50
per-call time over all request-time calls and per call kind, how often the deadline fired (calls answering from
what they had, and runs ended by ConstraintTimeoutError), the slowest calls with their schema, and invalid outputs
(a filled canvas that the compiled automaton or jsonschema rejects). A run is cut after --run-cap seconds (counted;
never an output). --offset/--count run a chunk of the sample and --merge joins the --json files of chunks;
--ids runs named schemas (profiling).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_masks import DEFAULT_MIX, add_sample_args, load_sample, load_tokenizer, pct  # noqa: E402


class CallLog:
    """Per-call times by kind ("compile", "min_tokens", "new_canvas_state", "allowed_tokens", "select_commits",
    "is_completable"), the deadline firings by kind, and the slowest calls with their schema (for profiling)."""

    def __init__(self, keep_worst: int = 25):
        self.times: dict[str, list[float]] = {}
        self.fired: Counter = Counter()
        self.worst: list[tuple[float, str, str]] = []
        self.keep_worst = keep_worst
        self.schema = ""
        self.current: list[float] = []  # this schema's request-time calls (--progress)

    def add(self, kind: str, secs: float, fired: bool = False) -> None:
        self.times.setdefault(kind, []).append(secs)
        if kind != "compile":
            self.current.append(secs)
        if fired:
            self.fired[kind] += 1
        if len(self.worst) < self.keep_worst or secs > self.worst[-1][0]:
            self.worst.append((secs, kind, self.schema))
            self.worst.sort(reverse=True)
            del self.worst[self.keep_worst:]

    def call(self, kind: str, st, fn, *args):
        """fn(*args), timed; `st` (a canvas state or None) tells whether the call's deadline fired."""
        h0 = st.deadline_hits if st is not None else 0
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.add(kind, time.perf_counter() - t0, st is not None and st.deadline_hits > h0)

    def all_times(self, skip: tuple[str, ...] = ("compile",)) -> list[float]:
        return [t for k, ts in self.times.items() if k not in skip for t in ts]


def fill(cc, st, n, eos, mask_id, rng, log: CallLog, stats, run_cap, mask_api: str = "bool"):
    """One random canvas fill; returns the token ids (None if it did not finish)."""
    import numpy as np
    import torch

    from dllm_constrain.errors import ConstraintTimeoutError
    from dllm_constrain.kernels.bitmask import allocate_token_bitmask, unpack_bitmask

    def masks_of(canvas, positions):
        if mask_api == "bool":
            return log.call("allowed_tokens", st, st.allowed_tokens, canvas, positions).numpy()
        bm = allocate_token_bitmask(len(positions), cc.vocab_size)
        log.call("fill_token_bitmask", st, st.fill_token_bitmask, canvas, positions, bm)
        return unpack_bitmask(bm, cc.vocab_size).numpy()

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
            masks = masks_of(canvas, positions)
            cand = []
            for j, p in enumerate(positions):
                row = masks[j]
                toks = np.flatnonzero(row)
                gone = [t for q, t in banned if q == p]
                if gone:
                    toks = toks[~np.isin(toks, gone)]
                if len(toks):
                    cand.append((p, int(toks[rng.randrange(len(toks))])))
            if not cand:
                stats["no_candidate"] += 1
                return None
            front = [c for c in cand if c[0] == open_pos[0]]
            rest = [c for c in cand if c[0] != open_pos[0]]
            picks = front + rng.sample(rest, min(len(rest), 4 - len(front)))
            proposals = [(p, t, 1.0 - 0.01 * k) for k, (p, t) in enumerate(picks)]
            kept = log.call("select_commits", st, st.select_commits, canvas, proposals)
            blind = not kept
            if blind:
                kept = [proposals[0][:2]]
            for p, t in kept:
                canvas[p] = t
            ok = log.call("is_completable", st, st.is_completable, canvas)
            if not ok:
                for p, t in kept:
                    canvas[p] = mask_id
                    banned.add((p, t))
                stats["backtracks"] += 1
        except ConstraintTimeoutError:
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


def summarize(log: CallLog, stats: Counter, hits: int, n_schemas: int) -> dict:
    """The figures of one semantics: over all request-time calls, per call kind, compile separately."""
    times = log.all_times()
    ctimes = log.times.get("compile", [])
    kinds = {}
    for k, ts in sorted(log.times.items()):
        kinds[k] = {"calls": len(ts), "p50_ms": 1e3 * pct(ts, 0.5), "p99_ms": 1e3 * pct(ts, 0.99),
                    "max_ms": 1e3 * max(ts, default=0), "over_1s": sum(t > 1.0 for t in ts),
                    "deadline_fired": log.fired.get(k, 0)}
    return {
        "schemas": n_schemas, "calls": len(times), "max_call_ms": 1e3 * max(times, default=0),
        "p99_call_ms": 1e3 * pct(times, 0.99), "p50_call_ms": 1e3 * pct(times, 0.5),
        "calls_over_1s": sum(t > 1.0 for t in times), "deadline_fired_calls": hits,
        "compile_max_ms": 1e3 * max(ctimes, default=0), "compile_p99_ms": 1e3 * pct(ctimes, 0.99),
        **dict(stats), "by_kind": kinds,
        "worst": [[round(1e3 * t, 1), k, sid] for t, k, sid in log.worst],
    }


def merge(paths: list[str]) -> dict:
    """The figures of several --json runs (e.g. chunks of the sample run with --offset) as one run."""
    report = {}
    for sem in ("strict", "spec"):
        log, stats, hits, n = CallLog(), Counter(), 0, 0
        for path in paths:
            with open(path) as f:
                r = json.load(f).get(sem)
            if r is None:
                continue
            for k, ts in r["raw_times"].items():
                for t in ts:
                    log.add(k, t)
            log.fired.update(r["raw_fired"])
            for t, k, sid in r["worst"]:
                log.worst.append((t / 1e3, k, sid))
            hits += r["deadline_fired_calls"]
            n += r["schemas"]
            stats.update({k: v for k, v in r.items() if k in STAT_KEYS})
        log.worst = sorted(log.worst, reverse=True)[:log.keep_worst]
        if n:
            report[sem] = summarize(log, stats, hits, n)
    return report


STAT_KEYS = ("runs", "outputs", "valid", "invalid", "unchecked", "runs_cut", "runs_timeout_error", "backtracks",
             "no_candidate", "step_bound", "too_long", "compile_timeout", "compile_refused")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sample_args(ap)
    ap.add_argument("--limit", type=int, default=40, help="schemas (spread over the 200-schema sample)")
    ap.add_argument("--offset", type=int, default=0, help="skip this many of the --limit schemas (run in chunks)")
    ap.add_argument("--count", type=int, default=None, help="run at most this many schemas after --offset")
    ap.add_argument("--ids", default=None, help="comma-separated schema ids: only these (profiling)")
    ap.add_argument("--timeout", type=float, default=0.5, help="per-call constraint_timeout (s)")
    ap.add_argument("--compile-timeout", type=float, default=10.0)
    ap.add_argument("--run-cap", type=float, default=30.0, help="wall seconds per canvas fill")
    ap.add_argument("--semantics", default="strict,spec")
    ap.add_argument("--mask-api", choices=("bool", "bitmask"), default="bool",
                    help="masks through allowed_tokens (bool rows) or fill_token_bitmask (packed rows)")
    ap.add_argument("--json", default=None, help="write the figures (and the raw per-call times) here")
    ap.add_argument("--progress", action="store_true", help="one line per schema on stderr")
    ap.add_argument("--merge", nargs="+", default=None, help="only merge these --json files and print the figures")
    args = ap.parse_args()

    if args.merge:
        report = merge(args.merge)
        for sem, row in report.items():
            print(sem, json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
        return 0

    import torch

    torch.set_num_threads(1)
    from dllm_constrain.api import STRICT_SCHEMA_OPTIONS
    from dllm_constrain.constraints import ConstraintCompiler, clear_cache
    from dllm_constrain.errors import ConstraintError, ConstraintTimeoutError

    items = load_sample(args.data, args.seed, DEFAULT_MIX)
    step = max(1, len(items) // args.limit)
    items = items[::step][: args.limit]
    end = None if args.count is None else args.offset + args.count
    items = items[args.offset:end]
    if args.ids:
        want = set(args.ids.split(","))
        items = [r for r in items if r["id"] in want]
    _, info = load_tokenizer(args.tokenizer)
    pad = info.mask_id
    comp = ConstraintCompiler(info, timeout_s=args.compile_timeout)
    eos = info.eos_id
    # the tokenizer's one-time tables (the token trie in the native walker's layout) are built once per tokenizer,
    # when the first constraint is compiled; build them before timing, so that no schema's compile carries them
    t0 = time.perf_counter()
    comp.compile_regex("[0-9]")
    tokenizer_setup_s = time.perf_counter() - t0
    # as bench_masks does (and a serving process should, once its model and tokenizer are loaded): the long-lived
    # objects (torch, the tokenizer tables) are kept out of later GC passes; a full pass over them costs 0.15-0.3 s,
    # and one that lands inside a constraint call was the largest outlier of a run
    gc.collect()
    gc.freeze()
    report = {}
    for sem in args.semantics.split(","):
        opts = STRICT_SCHEMA_OPTIONS if sem == "strict" else {}
        rng = random.Random(args.seed)
        log = CallLog()
        stats: Counter = Counter()
        hits = 0
        for r in items:
            log.schema = r["id"]
            t_schema, log.current = time.perf_counter(), []
            clear_cache()
            t0 = time.perf_counter()
            try:
                cc = comp.compile_json_schema(r["schema"], **opts)
            except ConstraintError as e:
                log.add("compile", time.perf_counter() - t0)
                stats["compile_timeout" if "Timeout" in type(e).__name__ else "compile_refused"] += 1
                continue
            log.add("compile", time.perf_counter() - t0)
            n = rng.randint(16, 128)
            t0 = time.perf_counter()
            try:
                m = cc.min_tokens(args.timeout)
            finally:
                log.add("min_tokens", time.perf_counter() - t0)
            if m > n:
                stats["too_long"] += 1
                continue
            try:
                st = log.call("new_canvas_state", None, cc.new_canvas_state, n, 128, None, args.timeout)
            except ConstraintError as e:
                stats["too_long" if not isinstance(e, ConstraintTimeoutError) else "runs_timeout_error"] += 1
                continue
            ids = fill(cc, st, n, eos, pad, rng, log, stats, args.run_cap, args.mask_api)
            hits += st.deadline_hits
            stats["runs"] += 1
            if ids is not None:
                v = valid(cc, r["schema"], ids, eos)
                stats["outputs"] += 1
                stats["invalid" if v is False else ("valid" if v else "unchecked")] += 1
                if v is False:
                    print("INVALID", r["id"], sem, file=sys.stderr)
            if args.progress:
                mine = log.current
                print(f"{sem} {r['id']} calls={len(mine)} max_ms={1e3 * max(mine, default=0):.1f} "
                      f"fired={st.deadline_hits} wall_s={time.perf_counter() - t_schema:.1f} "
                      f"out={'none' if ids is None else 'ok'}", file=sys.stderr, flush=True)
        row = summarize(log, stats, hits, len(items))
        row["tokenizer_setup_ms"] = 1e3 * tokenizer_setup_s
        report[sem] = {**row, "raw_times": log.times, "raw_fired": dict(log.fired)}
        print(sem, json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
