#!/usr/bin/env python3
"""Canvas step masks with the native trie walk (the package's C extension) against the numpy fallback walker, and
against the former run-time ctypes walker (kept here only, for the comparison), on JSONSchemaBench / bpe128k.

    python benchmarks/bench_native.py                          # 3 schemas per subset
    python benchmarks/bench_native.py --n-per-subset 1 --json out.json

Per schema (compiled afresh for every walker, in turn, so machine noise spreads over all of them): the first
valid instance is denoised on a canvas in semi-AR blocks of --block positions, --per-step commits per step at
positions whose instance token is allowed (same seed for every walker); every step asks the engine's form of the
masks, `fill_token_bitmask` for the block's <= 32 open positions into an int32 token bitmask (xgrammar layout),
and times it. The walk starts on a fresh compile, so steps compute the token transitions of the states they meet:
the work the trie walker does. `walk` is the time spent inside the walker's calls (token ids and targets of one
DFA state), a share of the step.

Walkers:
  native : dllm_constrain.constraints._native (built by `pip install`), GIL released, rows expanded by callback;
  numpy  : the fallback of token_automaton.py (DLLM_CONSTRAIN_NO_C=1 or no compiler at install time);
  ctypes : the former walker: the same C loop compiled at run time with `cc` and called through ctypes, restarted
           from the root after expanding the rows it found missing (omitted when no compiler is found).

The canvas state has the engine's per-call budgets (128 new token-transition tables, 0.5 s, a soft time limit on
rows): calls cut short by them narrow the mask and are asked again, so walkers of different speed can take
different paths (the step counts differ). Hence a second, like-for-like figure:

  walk per state: after the native walk of a schema, every DFA state whose token transitions it computed is walked
  again by each walker on that same automaton (its rows now computed, so no expansion: the walker's own cost),
  results checked equal; the thread's CPU time, best of 3 runs.
Figures: p50 / p90 / p99 / mean of the step masks in ms, wall clock and the thread's CPU time (steadier when the
core is shared); run under `taskset -c 1` with OMP_NUM_THREADS=1.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_masks import DEFAULT_MIX, add_sample_args, load_sample, load_tokenizer, pct, write_json  # noqa: E402

# The former run-time ctypes kernel, verbatim: pending rows are reported and the walk restarts from the root.
_LEGACY_SRC = r"""
#include <stdint.h>
int walk(const int32_t* parent, const uint8_t* byte, const int32_t* size, const int32_t* node_tok,
         int32_t n_nodes, const int32_t* T, const uint8_t* expanded, int32_t s, int32_t* st,
         int32_t* out_tok, int32_t* out_tgt, int32_t* pending, int32_t max_pending, int32_t* n_pending)
{
    int32_t n_out = 0, np_ = 0;
    st[0] = s;
    int32_t i = 1;
    while (i < n_nodes) {
        int32_t p = st[parent[i]];
        if (!expanded[p]) {
            if (np_ < max_pending) pending[np_++] = p;
            i += size[i];
            continue;
        }
        int32_t q = T[(int64_t)p * 256 + byte[i]];
        st[i] = q;
        if (q == 0) { i += size[i]; continue; }
        if (node_tok[i] >= 0) { out_tok[n_out] = node_tok[i]; out_tgt[n_out] = q; n_out++; }
        i++;
    }
    *n_pending = np_;
    return n_out;
}
"""


def build_legacy(tmpdir: str):
    """The former kernel compiled with the system compiler, or None when there is none."""
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        return None
    src, so = os.path.join(tmpdir, "legacy_walk.c"), os.path.join(tmpdir, "legacy_walk.so")
    with open(src, "w") as f:
        f.write(_LEGACY_SRC)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", so, src], check=True)
    lib = ctypes.CDLL(so)
    P = ctypes.c_void_p
    lib.walk.argtypes = [P, P, P, P, ctypes.c_int32, P, P, ctypes.c_int32, P, P, P, P, ctypes.c_int32, P]
    lib.walk.restype = ctypes.c_int32
    return lib


class LegacyWalker:
    """The former ctypes walker (same interface as _cwalk.CWalker.walk)."""

    def __init__(self, lib, trie, vocab_size: int):
        self.lib, self.trie = lib, trie
        self.st = np.zeros(trie.n_nodes, dtype=np.int32)
        self.out_tok = np.zeros(max(vocab_size, 1), dtype=np.int32)
        self.out_tgt = np.zeros(max(vocab_size, 1), dtype=np.int32)
        self.pending = np.zeros(4096, dtype=np.int32)
        self.n_pending = np.zeros(1, dtype=np.int32)
        self._lock = threading.Lock()

    def walk(self, dfa, s: int) -> tuple[np.ndarray, np.ndarray]:
        tr = self.trie
        with self._lock:
            for _ in range(10_000):
                exp = dfa.expanded.view(np.uint8)
                n = self.lib.walk(tr.parent.ctypes.data, tr.byte.ctypes.data, tr.size.ctypes.data,
                                  tr.node_tok.ctypes.data, tr.n_nodes, dfa.T.ctypes.data, exp.ctypes.data, int(s),
                                  self.st.ctypes.data, self.out_tok.ctypes.data, self.out_tgt.ctypes.data,
                                  self.pending.ctypes.data, self.pending.size, self.n_pending.ctypes.data)
                k = int(self.n_pending[0])
                if k == 0:
                    return self.out_tok[:n].astype(np.int64), self.out_tgt[:n].astype(np.int64)
                for p in np.unique(self.pending[:k]).tolist():
                    dfa.expand(p)
            raise RuntimeError("token walk did not converge")


def use_walker(cc, mode: str, legacy_lib, walk_times: list[float], walked_states: list[int]) -> None:
    """Point the compiled constraint's token automaton at the walker of `mode`; time its walks and list the states
    it walks from."""
    ta = cc.ta
    if mode == "numpy":
        ta._cwalker = None
    elif mode == "ctypes":
        if ta.tok.preorder_trie().dup_primary.size:
            raise SystemExit("the ctypes comparison does not handle tokenizers with duplicate token bytes")
        ta._cwalker = LegacyWalker(legacy_lib, ta.tok.preorder_trie(), ta.vocab_size)
    elif ta._cwalker is None:
        raise SystemExit("the native extension is not built (pip install -e . with a C compiler)")
    inner = ta.walk_tokens

    def timed(s: int):
        walked_states.append(s)
        t0 = time.perf_counter()
        try:
            return inner(s)
        finally:
            walk_times.append(time.perf_counter() - t0)

    ta.walk_tokens = timed


def walk_per_state(cc, states: list[int], modes: list[str], legacy_lib, per_state: dict[str, list[float]]) -> None:
    """Walk every state again with each walker on the automaton of the native run (rows computed): their own cost,
    like for like; the results must be the same."""
    ta = cc.ta
    walkers = {"native": lambda s, w=ta._cwalker: w.walk(ta.dfa, s), "numpy": ta._walk_tokens_numpy}
    if "ctypes" in modes:
        legacy = LegacyWalker(legacy_lib, ta.tok.preorder_trie(), ta.vocab_size)
        walkers["ctypes"] = lambda s: legacy.walk(ta.dfa, s)
    for s in dict.fromkeys(states):
        ref = None
        for m in modes:
            best = float("inf")
            for _ in range(3):  # the thread's CPU time, best of 3: steady on a shared core
                t0 = time.thread_time()
                tok, tgt = walkers[m](s)
                best = min(best, time.thread_time() - t0)
            per_state[m].append(best)
            got = sorted(zip(tok.tolist(), tgt.tolist()))
            if ref is None:
                ref = got
            elif got != ref:
                raise SystemExit(f"walkers disagree on state {s}: {m}")


def canvas_steps(cc, ids: list[int], eos: int, mask_id: int, args, seed: int, steps: list[float],
                 cpu: list[float]) -> bool:
    """Denoise a canvas towards `ids` (+ EOS padding); time fill_token_bitmask at every step (wall clock into
    `steps`, the thread's CPU time into `cpu`: on a shared core the second is the steadier)."""
    from dllm_constrain.kernels.bitmask import allocate_token_bitmask, bitmask_bytes, row_allows

    rng = random.Random(seed)
    n = len(ids) + 4
    target = list(ids) + [eos] * (n - len(ids))
    state = cc.new_canvas_state(n)
    canvas = [mask_id] * n
    out = allocate_token_bitmask(args.block, cc.ta.vocab_size)
    rows = bitmask_bytes(out)
    for b0 in range(0, n, args.block):
        blk = list(range(b0, min(n, b0 + args.block)))
        while True:
            open_pos = [p for p in blk if canvas[p] == mask_id]
            if not open_pos:
                break
            for _attempt in range(20):
                t0, c0 = time.perf_counter(), time.thread_time()
                state.fill_token_bitmask(canvas, open_pos, out)
                steps.append(time.perf_counter() - t0)
                cpu.append(time.thread_time() - c0)
                ok_pos = [p for j, p in enumerate(open_pos) if row_allows(rows[j], target[p])]
                if ok_pos:
                    break
            else:
                return False
            chosen = rng.sample(ok_pos, min(args.per_step, len(ok_pos)))
            kept = state.select_commits(canvas, [(p, target[p], rng.random()) for p in chosen])
            if not kept:
                return False
            for p, t in kept:
                canvas[p] = t
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sample_args(ap)
    ap.add_argument("--n-per-subset", type=int, default=3, help="schemas per JSONSchemaBench subset")
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--per-step", type=int, default=4, help="commits per denoising step")
    ap.add_argument("--max-tokens", type=int, default=300, help="skip instances longer than this")
    ap.add_argument("--timeout", type=float, default=60.0, help="compile time limit (s)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N schemas of the sample (0: all)")
    ap.add_argument("--modes", default="native,numpy,ctypes", help="walkers to compare, comma-separated")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from dllm_constrain.constraints import ConstraintCompiler, clear_cache
    from dllm_constrain.errors import ConstraintError

    if not os.path.isdir(args.data):
        print(f"no JSONSchemaBench data at {args.data}", file=sys.stderr)
        return 2
    tmpdir = tempfile.mkdtemp(prefix="bench_native_")
    modes = [m for m in args.modes.split(",") if m]
    legacy_lib = build_legacy(tmpdir) if "ctypes" in modes else None
    if "ctypes" in modes and legacy_lib is None:
        modes.remove("ctypes")
    items = load_sample(args.data, args.seed, {k: args.n_per_subset for k in DEFAULT_MIX})
    items = items[: args.limit] if args.limit else items
    tk, info = load_tokenizer(args.tokenizer)
    info.preorder_trie()
    comp = ConstraintCompiler(info, timeout_s=args.timeout)
    steps: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    per_state: dict[str, list[float]] = {m: [] for m in modes}
    walks: dict[str, list[float]] = {m: [] for m in modes}
    walked = failed = 0
    t_start = time.perf_counter()
    for r in items:
        valids = [t for t in r["tests"] if t.get("valid")]
        ids = tk.encode(json.dumps(valids[0]["data"], separators=(",", ":"), ensure_ascii=False),
                        add_special_tokens=False).ids
        if len(ids) > args.max_tokens:
            continue
        ok = True
        try:
            for m in modes:
                clear_cache()
                cc = comp.compile_json_schema(r["schema"])
                if not cc.accepts_tokens(ids):
                    raise ConstraintError("the instance is outside the compiled language")
                states: list[int] = []
                use_walker(cc, m, legacy_lib, walks[m], states)
                ok &= canvas_steps(cc, ids, info.eos_id, info.mask_id, args, args.seed + walked, steps[m],
                                   cpu[m])
                if m == "native":
                    replay = (cc, states)
        except ConstraintError:
            continue
        if "native" in modes:
            walk_per_state(*replay, modes, legacy_lib, per_state)
        walked += 1
        failed += not ok
        print(f"  {walked} schemas ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)
    shutil.rmtree(tmpdir, ignore_errors=True)
    out = {"schemas_walked": walked, "walks_failed": failed, "vocab": info.vocab_size,
           "block": args.block, "per_step": args.per_step}
    print(f"\n# bench_native: {walked} schemas walked ({failed} failed), tokenizer "
          f"{os.path.basename(os.path.normpath(args.tokenizer))} (vocab {info.vocab_size}), "
          f"engine default per-call budgets\n")
    print("| walker | clock | steps | step p50 ms | p90 ms | p99 ms | mean ms | walks | walk total s (wall) | "
          "step total s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in modes:
        out[m] = {}
        for clock, series in (("wall", steps[m]), ("cpu", cpu[m])):
            xs = [x * 1e3 for x in series]
            row = {"steps": len(xs), "p50_ms": pct(xs, .5), "p90_ms": pct(xs, .9), "p99_ms": pct(xs, .99),
                   "mean_ms": sum(xs) / max(1, len(xs)), "walks": len(walks[m]), "walk_total_s": sum(walks[m]),
                   "step_total_s": sum(xs) / 1e3}
            out[m][clock] = row
            print(f"| {m} | {clock} | {row['steps']} | {row['p50_ms']:.2f} | {row['p90_ms']:.2f} | "
                  f"{row['p99_ms']:.2f} | {row['mean_ms']:.2f} | {row['walks']} | {row['walk_total_s']:.2f} | "
                  f"{row['step_total_s']:.2f} |")
    if per_state.get("native"):
        n_states = len(per_state["native"])
        print(f"\nwalk per state: {n_states} DFA states (those the native canvas walks computed), rows computed, "
              f"each walker in turn on the same automaton, results equal; thread CPU time, best of 3\n")
        print("| walker | p50 us | p90 us | p99 us | mean us | total s |")
        print("|---|---:|---:|---:|---:|---:|")
        for m in modes:
            xs = [x * 1e6 for x in per_state[m]]
            row = {"states": len(xs), "p50_us": pct(xs, .5), "p90_us": pct(xs, .9), "p99_us": pct(xs, .99),
                   "mean_us": sum(xs) / max(1, len(xs)), "total_s": sum(xs) / 1e6}
            out[m]["walk_per_state"] = row
            print(f"| {m} | {row['p50_us']:.1f} | {row['p90_us']:.1f} | {row['p99_us']:.1f} | {row['mean_us']:.1f} | "
                  f"{row['total_s']:.3f} |")
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
