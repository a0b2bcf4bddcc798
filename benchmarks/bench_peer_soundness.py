#!/usr/bin/env python3
"""Soundness against readers nobody here wrote: material from other projects run through the constraint
layer, each string judged by our compiled constraint and by that project's own reader.

    python benchmarks/bench_peer_soundness.py --quick        # a small sample of each material (~1 min)
    python benchmarks/bench_peer_soundness.py                # the full re_tests table, every grammar, 150 schemas
    python benchmarks/bench_peer_soundness.py --materials re,lark --examples 10

Materials (a row each):
  re        CPython's regex test table (Lib/test/re_tests.py, imported as `test.re_tests`). Each pattern that
            Python compiles goes through ConstraintCompiler.compile_regex (full match); strings: the table's
            subject, the span re.search finds in it, mutations of both, and random members of our automaton.
            Reader: re.fullmatch(pattern, s).
  lark      Lark grammars: those shipped with the lark package that have a `start` rule, our grammars/ folder
            (and csv/tsv), lark's examples when installed. Strings: our random sentences (unfiltered), random
            byte walks through our compiled grammar finished by its completion, the grammars' examples, and
            mutations. Reader: lark.Lark(text, parser="lalr", lexer="basic").parse (the parser our grammars
            are documented against).
  jsb       JSONSchemaBench schemas (../shared/data/jsonschemabench; skipped with a message when absent):
            hypothesis-jsonschema instances, the dataset's own instances, simple mutants of them (a value's type
            changed, a required key dropped, a key added, a number perturbed) and random members of our
            automaton, as compact JSON text. Reader: python-jsonschema, the validator class of the schema's
            $schema (default 2020-12) with its format checker on, as the compiler itself and the tests use.
            Ours: accepts_tokens on the bpe32k tokenization (a byte tokenizer without ../shared), cross-checked
            with accepts_text.

Per string: agree; soundness disagreement (we accept, the reader rejects: a bug); coverage gap (the reader
accepts, we reject: a documented narrowing or a missing feature). Patterns/grammars/schemas our compiler
refuses are counted as refused with their typed error; an untyped exception is reported as a crash.
Exit code 1 when there is any soundness disagreement.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
import traceback

from _peer_common import ROOT, SHARED, Tally, Timeout, byte_info, compile_or_tally, dfa_samples, str_mutations, time_limit
from _peer_jsb import run_jsb

# ---------------------------------------------------------------------------------------------- re_tests
def refusal_reason(e: Exception) -> str:
    """The refusal message without its pattern and positions (to group refusals by cause)."""
    msg = str(e)
    m = re.search(r"unsupported group construct '(\(\?.?)", msg)
    if m:
        return f"unsupported group construct {m.group(1)}"
    msg = re.sub(r" in regex .*", "", msg)
    return re.sub(r"\d+", "N", msg)[:80]


def run_re(args, rng: random.Random) -> Tally | None:
    try:
        from test import re_tests
    except ImportError:
        print("re: CPython's test.re_tests is not installed with this Python (Lib/test is absent); skipped",
              file=sys.stderr)
        return None
    from dllm_constrain.constraints import ConstraintCompiler
    from dllm_constrain.errors import ConstraintError

    comp = ConstraintCompiler(byte_info(), timeout_s=args.compile_timeout)
    T = Tally("CPython re_tests (re.fullmatch)")
    rows = list(re_tests.tests)
    if args.quick:
        rows = rows[:: max(1, len(rows) // 80)]
    by_pattern: dict[str, list[str]] = {}
    syntax_both = syntax_we_accept = 0
    for row in rows:
        pattern, subject, outcome = row[0], row[1], row[2]
        if isinstance(pattern, bytes) or isinstance(subject, bytes):
            T.notes["bytes rows skipped"] += 1
            continue
        try:
            re.compile(pattern)
        except re.error:
            # re refuses the pattern: we should refuse it too
            try:
                with time_limit(args.item_timeout):
                    comp.compile_regex(pattern)
                syntax_we_accept += 1
                T.notes[f"re refuses, we compile: {pattern!r}"] += 1
            except (ConstraintError, Timeout):
                syntax_both += 1
            except Exception:  # noqa: BLE001
                T.crashes.append(f"compile_regex({pattern!r}): {traceback.format_exc(limit=1).splitlines()[-1]}")
            continue
        by_pattern.setdefault(pattern, []).append(subject)
    T.notes[f"patterns re refuses: also refused by us {syntax_both}, compiled by us {syntax_we_accept}"] += 1
    for pattern, subjects in by_pattern.items():
        T.items += 1
        cc = compile_or_tally(T, f"compile_regex({pattern!r})", lambda: comp.compile_regex(pattern), args.item_timeout,
                              note=lambda e: f"refused: {refusal_reason(e)}")
        if cc is None:
            continue
        T.compiled += 1
        rx = re.compile(pattern)
        cases: set[str] = set()
        for s in subjects:
            cases.add(s)
            m = rx.search(s)
            if m:
                cases.add(m.group(0))
                cases.update(str_mutations(m.group(0), rng, 3))
            cases.update(str_mutations(s, rng, 3))
        try:
            with time_limit(args.item_timeout):
                for b in dfa_samples(cc.dfa, rng, 3 if args.quick else 6):
                    try:
                        cases.add(b.decode("utf-8"))
                    except UnicodeDecodeError:
                        T.notes["our sample not UTF-8"] += 1
                        T.unsound.append({"item": pattern, "text": b, "why": "our automaton accepts non-UTF-8 bytes",
                                          "known": ""})
                for s in sorted(cases):
                    try:
                        data = s.encode("utf-8")
                    except UnicodeEncodeError:
                        continue  # lone surrogates: not text
                    ours = cc.accepts_text(data)
                    reader = rx.fullmatch(s) is not None
                    T.judge(pattern, s, ours, reader)
        except Timeout:
            T.notes["patterns whose strings ran past the item time limit"] += 1
    return T


# ---------------------------------------------------------------------------------------------- lark
def lark_grammar_sources(examples_dir: list[str] | None = None) -> list[tuple[str, str | None, str]]:
    """(name, text, start) of standalone grammars: lark's shipped ones with a start rule, ours, examples."""
    import lark

    out = []
    gdir = os.path.join(os.path.dirname(lark.__file__), "grammars")
    for fn in sorted(os.listdir(gdir)) if os.path.isdir(gdir) else []:
        if fn.endswith(".lark"):
            text = open(os.path.join(gdir, fn)).read()
            if re.search(r"^\s*[?!]?start\s*:", text, re.M):
                out.append((f"lark/grammars/{fn}", text, "start"))
            else:
                out.append((f"lark/grammars/{fn}", None, "no start rule"))
    ours = os.path.join(ROOT, "grammars")
    for fn in sorted(os.listdir(ours)) if os.path.isdir(ours) else []:
        if fn.endswith(".lark"):
            out.append((f"grammars/{fn}", open(os.path.join(ours, fn)).read(), "start"))
    try:
        from dllm_constrain.grammars import load_grammar

        for name in ("csv:3", "tsv:2"):
            out.append((f"grammars {name}", load_grammar(name), "start"))
    except Exception:  # noqa: BLE001
        pass
    dirs = [d for d in (*(examples_dir or []), os.path.join(os.path.dirname(os.path.dirname(lark.__file__)), "examples"))
            if d and os.path.isdir(d)]
    if not dirs:
        print("lark: lark's examples are not installed (the wheel ships lark/grammars only; pass --lark-examples "
              "with a lark source checkout's examples/ or tests/grammars/); using lark/grammars and grammars/",
              file=sys.stderr)
    for ex in dirs:
        for dp, _dn, fns in sorted(os.walk(ex)):
            for fn in sorted(fns):
                if not fn.endswith(".lark"):
                    continue
                rel = os.path.relpath(os.path.join(dp, fn), ex)
                text = open(os.path.join(dp, fn)).read()
                if re.search(r"^\s*%import\s+\.", text, re.M) or not re.search(r"^\s*[?!]?start\s*:", text, re.M):
                    out.append((f"lark examples {rel}", None, "relative import or no start rule"))
                    continue
                out.append((f"lark examples {rel}", text, "start"))
    return out


def grammar_walk(cg, rng: random.Random, max_len: int = 30) -> str | None:
    """A random byte walk through our compiled grammar (each byte one the exact matcher accepts as a prefix),
    finished by the grammar's own completion."""
    cfg = cg.initial
    buf = bytearray()
    limit = rng.randint(0, max_len)
    order = list(range(0x20, 0x7F)) + [0x09, 0x0A]
    while len(buf) < limit:
        if cg.accepts_end(cfg) and rng.random() < 0.15:
            break
        cand = order[:]
        rng.shuffle(cand)
        for b in cand:
            nxt = cg.step_bytes(cfg, bytes([b]))
            if nxt is not None:
                cfg = nxt
                buf.append(b)
                break
        else:
            break
    tail = cg.complete_bytes(cfg)
    if tail is None:
        return None
    try:
        return (bytes(buf) + tail).decode("utf-8")
    except UnicodeDecodeError:
        return None


def run_lark(args, rng: random.Random) -> Tally | None:
    try:
        import lark
    except ImportError:
        print("lark: the lark package is not installed; skipped", file=sys.stderr)
        return None
    from dllm_constrain.constraints.compiler import GrammarCompiler
    from dllm_constrain.constraints.cfg.sample import render_sentence

    gc_ = GrammarCompiler(byte_info())
    T = Tally("Lark grammars (lark.Lark lalr/basic .parse)")
    examples = {}
    ex_file = os.path.join(ROOT, "grammars", "examples.json")
    if os.path.exists(ex_file):
        examples = json.load(open(ex_file))
    n_sent = 8 if args.quick else 40
    for name, text, start in lark_grammar_sources(args.lark_examples):
        T.items += 1
        if text is None:
            T.refused[f"not standalone: {start} ({name})"] += 1
            continue
        cg = compile_or_tally(T, name, lambda: gc_.compile(text, start=start, name=name), args.item_timeout * 4,
                              note=lambda e: f"{name}: {str(e)[:150]}", suffix=f" ({name})")
        if cg is None:
            continue
        try:
            reader = lark.Lark(text, parser="lalr", lexer="basic", start=start)
        except Exception as e:  # noqa: BLE001
            T.refused[f"reader refuses ({name})"] += 1
            T.notes[f"{name}: lark.Lark: {str(e)[:150]}"] += 1
            continue
        T.compiled += 1

        def parses(s: str) -> bool:
            try:
                reader.parse(s)
                return True
            except lark.exceptions.LarkError:
                return False

        base: set[str] = set()
        key = os.path.splitext(os.path.basename(name))[0].split(":")[0].replace("grammars ", "")
        for e in examples.get(key, []) if isinstance(examples, dict) else []:
            if isinstance(e, str):
                base.add(e)
        try:
            with time_limit(args.item_timeout * 6):
                for _ in range(n_sent):
                    s = render_sentence(cg, rng, 6)  # unchecked: what it renders is judged here
                    if s is not None:
                        base.add(s)
                    s = grammar_walk(cg, rng)
                    if s is not None:
                        base.add(s)
        except Timeout:
            T.notes[f"{name}: sampling ran past the time limit"] += 1
        cases = set(base)
        for s in sorted(base):
            cases.update(str_mutations(s, rng, 3 if args.quick else 6))
        try:
            with time_limit(args.item_timeout * 12):
                for s in sorted(cases, key=lambda x: (len(x), x)):
                    if len(s) > 400:
                        continue
                    T.judge(name, s, cg.accepts_text(s), parses(s))
        except Timeout:
            T.notes[f"{name}: judging ran past the time limit"] += 1
    return T


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    args = parse_args()
    import torch

    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    runners = {"re": run_re, "lark": run_lark, "jsb": run_jsb}
    tallies = []
    t0 = time.time()
    for m in args.materials.split(","):
        t1 = time.time()
        T = runners[m.strip()](args, rng)
        if T is not None:
            T.seconds = time.time() - t1
            tallies.append(T)
    print(f"\n# bench_peer_soundness{' --quick' if args.quick else ''}: seed {args.seed}, {time.time() - t0:.0f} s\n")
    print_summary(tallies)
    for T in tallies:
        print_details(T, args.examples)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({T.name: {"unsound": T.unsound, "gaps": T.gaps, "crashes": T.crashes} for T in tallies}, f,
                      indent=1, default=str)
    return 1 if any(T.unsound for T in tallies) else 0


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small sample of every material")
    ap.add_argument("--materials", default="re,lark,jsb")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=os.path.join(SHARED, "data", "jsonschemabench"))
    ap.add_argument("--schemas", type=int, default=None, help="JSONSchemaBench schemas sampled (quick 15, else 150)")
    ap.add_argument("--jsb-seconds", type=float, default=None, help="stop sampling schemas after this (quick 60, else 420)")
    ap.add_argument("--lark-examples", action="append", default=None,
                    help="(repeatable) a folder of Lark grammars (e.g. a lark source checkout's examples/) judged with the others")
    ap.add_argument("--strict", action="store_true", help="compile schemas with STRICT_SCHEMA_OPTIONS")
    ap.add_argument("--compile-timeout", type=float, default=5.0)
    ap.add_argument("--item-timeout", type=float, default=10.0, help="seconds per pattern / schema step")
    ap.add_argument("--examples", type=int, default=5, help="disagreements printed per material and kind")
    ap.add_argument("--json", default=None, help="write every disagreement here")
    args = ap.parse_args()
    if args.schemas is None:
        args.schemas = 15 if args.quick else 150
    if args.jsb_seconds is None:
        args.jsb_seconds = 60 if args.quick else 420
    return args


def print_summary(tallies: list[Tally]) -> None:
    print("| material | items compiled / total | refused (typed) | cases | agree | soundness disagreements "
          "(we accept, reader rejects) | of them known | coverage gaps (reader accepts, we reject) | crashes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for T in tallies:
        known = sum(1 for d in T.unsound if d["known"])
        print(f"| {T.name} | {T.compiled} / {T.items} | {sum(T.refused.values())} | {T.cases} | {T.agree} | "
              f"{len(T.unsound)} | {known} | {len(T.gaps)} | {len(T.crashes)} |")


def print_details(T: Tally, examples: int) -> None:
    """Refusals, notes, crashes, and the first disagreements of one material (one example per item)."""
    print(f"\n## {T.name} ({T.seconds:.0f} s)")
    if T.refused:
        print("refused:", ", ".join(f"{k} x{v}" for k, v in T.refused.most_common()))
    for k, v in T.notes.most_common():
        print(f"note: {k}" + (f" x{v}" if v > 1 else ""))
    for c in T.crashes[:examples]:
        print("CRASH:", c)
    if T.unsound:
        print(f"soundness disagreements on {len({d['item'] for d in T.unsound})} items; first ones:")
        for d in first_per_item(T.unsound, examples):
            print(f"  UNSOUND [{d['known'] or 'new'}] {str(d['item'])[:90]!s}: ours accepts {str(d['text'])[:160]!r}"
                  + (f"  reader: {d['why'][:160]}" if d["why"] else ""))
    if T.gaps:
        print(f"coverage gaps on {len({d['item'] for d in T.gaps})} items; first ones:")
        for d in first_per_item(T.gaps, examples):
            print(f"  GAP {str(d['item'])[:90]}: reader accepts {str(d['text'])[:120]!r}")


def first_per_item(disagreements: list[dict], n: int) -> list[dict]:
    """The first disagreement of each of the first n items."""
    seen: set = set()
    out = []
    for d in disagreements:
        if d["item"] not in seen and len(out) < n:
            seen.add(d["item"])
            out.append(d)
    return out

if __name__ == "__main__":
    sys.exit(main())
