#!/usr/bin/env python3
"""Grammar-constraint benchmark: per-step constraint cost, remasks/backtracks per generation, total time
constrained vs unconstrained, and an ETH-style ablation (gaps treated as unbounded) without any fill-in.

    python benchmarks/bench_grammars.py                  # everything (a few minutes on 2 cores)
    python benchmarks/bench_grammars.py --quick          # fewer runs
    python benchmarks/bench_grammars.py --only steps     # one section: steps | generate | eth
    python benchmarks/bench_grammars.py --json out.json

Sections (single thread):
  steps    : ../shared/data/tokenizers/bpe128k. Per shipped grammar: compile time, the first mask of an all-open
             canvas (cold), then a valid string (the grammar's examples and random sentences) is committed into
             a canvas of 64 positions in random order inside semi-AR blocks of 32 positions, --per-step commits
             per step; one step = forced_tokens + allowed_tokens(every open position of the block, <= 32) +
             select_commits + is_completable. Median and p95 step time, warm (second pass over the same strings:
             the compiled grammar's caches are shared across requests, as in serving) and cold (first pass). Also: how often a still-open position's true token was masked out (must be
             0: the masks are sound) and how often select_commits refused a commit consistent with the string
             (witness search incompleteness).
  generate : the bundled model (dllm_constrain/bundled) when present, else a random LLaDA with the bundled
             config (d_model 256, 6 layers, 4096-token byte-level BPE trained here on the bundled model's data
             generator) - said so in the output. Per grammar: P prompts, constrained and unconstrained; total
             wall time ratio, parse rate (Lark), remasks/backtracks/witness-forced per generation.
  eth      : the same generations with an ETH-style checker (Muendler et al. 2025: additive infilling, a gap
             may hold any string, decided by CFG/regular intersection; here: our exact parser with gaps of
             0..8 tokens whatever their length and an unbounded tail), taking the final canvas as is: the share
             of outputs that parse without a fill-in step.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from dllm_constrain.constraints import TokenizerInfo  # noqa: E402
from dllm_constrain.constraints.compiler import GrammarCompiler, clear_cache  # noqa: E402
from dllm_constrain.constraints.cfg.canvas import GrammarCanvasState  # noqa: E402
from dllm_constrain.constraints.cfg.sample import random_sentence  # noqa: E402
from dllm_constrain.errors import DllmConstrainError  # noqa: E402
from dllm_constrain.grammars import examples, list_grammars, load_grammar  # noqa: E402


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))]


def ms(x: float) -> str:
    return f"{1000 * x:.1f}"


# ----------------------------------------------------------------------------------------- steps
def tokenizer_128k(path: str):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    info = TokenizerInfo.from_tokenizer(path)
    # the shared tokenizer has no mask token: use an id past its vocabulary (as a padded model embedding would)
    info = TokenizerInfo(info.token_bytes, eos_id=info.eos_id, mask_id=len(info.token_bytes),
                         special_ids=sorted(info.special_ids), vocab_size=len(info.token_bytes) + 1)
    return tok, info


def walk(cg, ids: list[int], n: int, block: int, per_step: int, rng: random.Random, out: dict) -> None:
    eos, mask = cg.eos_id, cg.mask_id
    target = list(ids) + [eos] * (n - len(ids))
    st = cg.new_canvas_state(n)
    canvas = [mask] * n
    for b0 in range(0, n, block):
        blk = list(range(b0, min(n, b0 + block)))
        while True:
            t0 = time.perf_counter()
            for p, t in st.forced_tokens(canvas).items():
                canvas[p] = t
                if t != target[p]:
                    out["forced_mismatch"] += 1
                    return
            open_pos = [p for p in blk if canvas[p] == mask]
            if not open_pos:
                out["step_s"].append(time.perf_counter() - t0)
                break
            m = st.allowed_tokens(canvas, open_pos)
            for j, p in enumerate(open_pos):
                if not bool(m[j, target[p]]):
                    out["masked_true_token"] += 1
            chosen = rng.sample(open_pos, min(per_step, len(open_pos)))
            props = [(p, target[p], rng.random()) for p in chosen]
            kept = st.select_commits(canvas, props)
            out["refused_consistent"] += len(props) - len(kept)
            if not kept:
                kept = [props[0][:2]]
            for p, t in kept:
                canvas[p] = t
            if not st.is_completable(canvas):
                for p, _t in kept:
                    canvas[p] = mask
                out["backtracks"] += 1
            out["step_s"].append(time.perf_counter() - t0)
            out["steps"] += 1
    ok = st.is_completable(canvas) and canvas == target
    out["completed"] += int(ok)
    out["runs"] += 1
    out["witness_forced"] += st.stats["witness_forced"]


def section_steps(args, report: dict) -> None:
    path = args.tokenizer
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        print(f"[steps] skipped: no tokenizer at {path}")
        return
    tok, info = tokenizer_128k(path)
    info.prepare()
    print(f"\n## Per-step constraint cost ({os.path.basename(path)}, {info.vocab_size} tokens; canvas = string + 4 "
          f"(>= {args.block}), blocks of {args.block}, {args.per_step} commits/step)\n")
    print("| grammar | compile s | first mask ms | strings (mean tokens) | steps | step median ms | step p95 ms |"
          " cold median / p95 ms | true token masked | consistent commit refused | backtracks | witness forced |"
          " runs ok |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = {}
    for name in args.grammars:
        clear_cache()
        text = load_grammar(name)
        t0 = time.perf_counter()
        cg = GrammarCompiler(info).compile(text, name=name)
        t_compile = time.perf_counter() - t0
        t0 = time.perf_counter()
        st = cg.new_canvas_state(args.n)
        st.allowed_tokens([cg.mask_id] * args.n, list(range(min(args.block, args.n))))
        t_first = time.perf_counter() - t0
        rng = random.Random(args.seed)
        strings = list(examples(name))
        for _ in range(args.runs):
            s = random_sentence(cg, rng, max_depth=rng.randint(5, 9))
            if s:
                strings.append(s)
        out = {"step_s": [], "steps": 0, "masked_true_token": 0, "refused_consistent": 0, "backtracks": 0,
               "witness_forced": 0, "completed": 0, "runs": 0, "forced_mismatch": 0}
        lens = []
        cold = []
        for rep in range(2):  # pass 1 warms the grammar's caches (vocabulary walks); pass 2 is the steady state
            if rep == 1:
                cold = out["step_s"]
                out = {k: (0 if isinstance(v, int) else []) for k, v in out.items()}
            for s in strings:
                ids = tok.encode(s, add_special_tokens=False).ids
                if len(ids) > args.n:
                    continue
                if rep == 0:
                    lens.append(len(ids))
                walk(cg, ids, max(args.block, len(ids) + 4), args.block, args.per_step, random.Random(len(lens)), out)
        out["mean_tokens"] = statistics.mean(lens) if lens else 0
        row = {"compile_s": t_compile, "first_mask_s": t_first, "steps": out["steps"],
               "step_median_ms": 1000 * statistics.median(out["step_s"]) if out["step_s"] else None,
               "step_p95_ms": 1000 * pct(out["step_s"], 0.95),
               "cold_step_median_ms": 1000 * statistics.median(cold) if cold else None,
               "cold_step_p95_ms": 1000 * pct(cold, 0.95), **{k: v for k, v in out.items() if k != "step_s"}}
        rows[name] = row
        print(f"| {name} | {t_compile:.2f} | {ms(t_first)} | {out['runs']} ({out['mean_tokens']:.0f}) | "
              f"{out['steps']} | {row['step_median_ms']:.1f} | "
              f"{row['step_p95_ms']:.1f} | {row['cold_step_median_ms']:.1f} / {row['cold_step_p95_ms']:.1f} | "
              f"{out['masked_true_token']} | {out['refused_consistent']} | "
              f"{out['backtracks']} | {out['witness_forced']} | {out['completed']}/{out['runs']} |")
    report["steps"] = rows


# ----------------------------------------------------------------------------------------- models
def bundled_or_stand_in(args):
    """(LLM, description). The bundled checkpoint when present, else a random LLaDA with its config."""
    import dllm_constrain as dc
    from dllm_constrain.api import bundled_model_path

    path = bundled_model_path()
    if (path / "config.json").is_file():
        return dc.LLM(), f"bundled model ({path})"
    from dllm_constrain.train.data import ExampleGenerator
    from dllm_constrain.train.tokenizer import train_tokenizer
    from dllm_constrain.train.trainer import TrainConfig, build_model

    cfg = TrainConfig()
    gen = ExampleGenerator(0)
    corpus = [e["prompt"] + e["answer"] for e in gen.examples(args.tokenizer_corpus)]
    for name in list_grammars():
        corpus += examples(name) * 20
    tok = train_tokenizer(corpus, cfg.vocab_size)
    cfg.vocab_size = tok.get_vocab_size()
    model = build_model(cfg).eval()
    from dllm_constrain.engine.tokenizer import Tokenizer as EngineTokenizer  # noqa: F401

    llm = dc.LLM.from_model(model, tok)
    return llm, (f"RANDOM stand-in: the bundled model is absent, so a random LLaDA with the bundled config "
                 f"(d_model {cfg.d_model}, {cfg.n_layers} layers, vocab {cfg.vocab_size}; byte-level BPE trained "
                 f"on {args.tokenizer_corpus} generator examples)")


PROMPTS = {
    "json": "Give a JSON object describing a book.",
    "arithmetic": "Write an arithmetic expression.",
    "sql": "List the names of users older than 30.",
    "c_like": "Write a loop that sums the numbers 1 to 10.",
    "smiles": "Give the SMILES of aspirin.",
    "csv": "A table of three cities: name, country, population.",
    "tsv": "A table of three cities: name, country, population.",
}


def parses(lk, text: str) -> bool:
    try:
        lk.parse(text)
        return True
    except Exception:  # noqa: BLE001
        return False


def section_generate(args, report: dict, eth: bool) -> None:
    import lark

    llm, desc = bundled_or_stand_in(args)
    print(f"\n## Generation: {desc}\n")
    print(f"max_new_tokens {args.max_new_tokens}, block_length {args.gen_block}, policy quota, temperature "
          f"{args.temperature}, {args.prompts} prompts x {len(args.grammars)} grammars, batch of 1.\n")
    cols = ("| grammar | unconstrained s | constrained s | ratio | s/forward ratio | parses (constrained) |"
            " parses (unconstrained) | remasks/gen | backtracks/gen | witness forced/gen |")
    if eth:
        cols += " ETH-style parses w/o fill-in | ETH-style s |"
    print(cols)
    print("|" + "---|" * (cols.count("|") - 1))
    rows = {}
    tot_u = tot_c = 0.0
    tot_nu = tot_nc = 0
    for name in args.grammars:
        text = load_grammar(name)
        lk = lark.Lark(text, parser="lalr", lexer="basic")
        cg = llm.compile(grammar=name)
        # warm-up (compile + first vocabulary walks), excluded from the timings like model loading
        run(llm, PROMPTS[name], GrammarCanvasState(cg, args.max_new_tokens), args, 999)
        t_u = t_c = t_e = 0.0
        ok_c = ok_u = ok_e = 0
        rem = back = wf = 0
        nfe_u = nfe_c = 0
        to_e = 0
        for i in range(args.prompts):
            prompt = PROMPTS[name] + (f" Variant {i}." if i else "")
            t0 = time.perf_counter()
            ru = run(llm, prompt, None, args, i)
            t_u += time.perf_counter() - t0
            ok_u += parses(lk, ru.text)
            nfe_u += ru.nfe
            t0 = time.perf_counter()
            state = GrammarCanvasState(cg, args.max_new_tokens)  # what generate(grammar=...) attaches
            rc = run(llm, prompt, state, args, i)
            t_c += time.perf_counter() - t0
            ok_c += parses(lk, rc.text)
            nfe_c += rc.nfe
            rem += rc.remasks
            back += rc.backtracks
            wf += state.stats["witness_forced"]
            if eth:
                t0 = time.perf_counter()
                try:
                    re_ = run(llm, prompt, EthStyleState(cg, args.max_new_tokens), args, i)
                    ok_e += parses(lk, re_.text)
                except DllmConstrainError:  # e.g. the engine's step bound: no termination argument there
                    to_e += 1
                t_e += time.perf_counter() - t0
        P = args.prompts
        row = {"unconstrained_s": t_u, "constrained_s": t_c, "ratio": t_c / t_u if t_u else None,
               "parse_rate": ok_c / P, "parse_rate_unconstrained": ok_u / P, "remasks_per_gen": rem / P,
               "backtracks_per_gen": back / P, "witness_forced_per_gen": wf / P}
        per_fwd = (t_c / max(1, nfe_c)) / (t_u / max(1, nfe_u))
        row["per_forward_ratio"] = per_fwd
        row["nfe"] = {"unconstrained": nfe_u / P, "constrained": nfe_c / P}
        line = (f"| {name} | {t_u:.2f} | {t_c:.2f} | {t_c / t_u:.2f}x | {per_fwd:.2f}x | {ok_c}/{P} | {ok_u}/{P} | "
                f"{rem / P:.1f} | "
                f"{back / P:.1f} | {wf / P:.1f} |")
        if eth:
            row.update({"eth_parse_rate": ok_e / P, "eth_s": t_e, "eth_errors": to_e})
            line += f" {ok_e}/{P}{f' ({to_e} errors)' if to_e else ''} | {t_e:.2f} |"
        print(line)
        rows[name] = row
        tot_u += t_u
        tot_c += t_c
        tot_nu += nfe_u
        tot_nc += nfe_c
    pf = (tot_c / max(1, tot_nc)) / (tot_u / max(1, tot_nu))
    print(f"\nTotal: unconstrained {tot_u:.2f} s ({tot_nu} forwards), constrained {tot_c:.2f} s ({tot_nc} forwards), "
          f"ratio {tot_c / tot_u:.2f}x, per forward {pf:.2f}x")
    report["generate"] = {"model": desc, "rows": rows, "total_ratio": tot_c / tot_u, "per_forward_ratio": pf}


# ----------------------------------------------------------------------------------------- ETH-style
class EthStyleState(GrammarCanvasState):
    """Completability as in additive infilling: a gap may hold any number of tokens (0..max_gap here, not its
    length), the tail is unbounded, EOS is not reasoned about; masks: prefix-viable tokens at the frontier
    (no length check), everything elsewhere. The final canvas is taken as is (no fill-in)."""

    max_gap = 8

    def _frontier_row(self, c, an):
        cg = self.cg
        row = np.zeros(self.vocab_size, dtype=bool)
        lt, succ = cg.successors(an.cfg)
        sel = np.zeros(lt.n_groups, dtype=bool)
        for g, _nxt in succ:
            sel[g] = True
        if sel.any():
            row[lt.tokens[sel[lt.group_of]]] = True
        if cg.accepts_end(an.cfg):
            row[self.eos] = True
        return row

    def _approx_row(self, an, p):
        row = self.cg.text_row.copy()
        row[self.eos] = True
        return row

    def forced_tokens(self, canvas):
        return {}

    def _completable(self, c):
        ok, e_star, last = self._structure(c)
        if not ok:
            return False
        f, cfg = self._prefix(c)
        if cfg is None:
            return False
        # committed runs after f, in order
        runs, cur = [], []
        for i in range(f, e_star):
            if c[i] is None:
                if cur:
                    runs.append(cur)
                    cur = []
            else:
                cur.append(c[i])
        if cur:
            runs.append(cur)
        return self._bridge(cfg, runs, 0, [2000])

    def _bridge(self, cfg, runs, k, budget) -> bool:
        cg = self.cg
        if k == len(runs):
            return cg.complete_tokens(cfg) is not None
        layer = [cfg]
        seen = {cfg}
        for _depth in range(self.max_gap + 1):
            for x in layer:
                y = x
                for t in runs[k]:
                    y = cg.step(y, t) if y is not None else None
                if y is not None and self._bridge(y, runs, k + 1, budget):
                    return True
            nxt = []
            for x in layer:
                budget[0] -= 1
                if budget[0] < 0:
                    return False
                for _g, z in cg.successors(x)[1][:64]:
                    if z not in seen:
                        seen.add(z)
                        nxt.append(z)
            layer = nxt[:256]
            if not layer:
                break
        return False


def run(llm, prompt: str, state, args, seed: int):
    """One generation through the engine, as LLM.generate does it (same prompt format and parameters), with an
    explicit constraint state (None: unconstrained) so its counters can be read."""
    from dllm_constrain.engine.state import Request, SamplingParams

    params = SamplingParams(max_new_tokens=args.max_new_tokens, steps=None, block_length=args.gen_block,
                            temperature=args.temperature, seed=seed, policy="quota")
    ids = llm.encode(llm.format(prompt))
    return llm.engine.generate([Request(ids, params, state)])[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default=os.path.join(SHARED, "data", "tokenizers", "bpe128k"))
    ap.add_argument("--grammars", default=",".join(list_grammars()))
    ap.add_argument("--only", default="", help="steps | generate | eth (default: all)")
    ap.add_argument("--n", type=int, default=96, help="longest string (in tokens) of the step walk")
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--per-step", type=int, default=2)
    ap.add_argument("--runs", type=int, default=6, help="random sentences per grammar (plus the examples)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gen-block", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--tokenizer-corpus", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    args.grammars = [g for g in args.grammars.split(",") if g]
    if args.quick:
        args.runs, args.prompts = 2, 2
    report: dict = {"args": vars(args)}
    if args.only in ("", "steps"):
        section_steps(args, report)
    if args.only in ("", "generate", "eth"):
        section_generate(args, report, eth=args.only in ("", "eth"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
