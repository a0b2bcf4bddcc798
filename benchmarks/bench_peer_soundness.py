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
import copy
import json
import os
import random
import re
import signal
import sys
import time
import traceback
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
sys.path.insert(0, ROOT)

MUTATION_CHARS = ["a", "b", "0", "9", " ", "\n", "-", "x", "é", "\\", ".", "{", "\"", "A", "_",
                  "\u0663", "\u00a0", "\u212a", "\t"]  # Arabic-Indic 3, no-break space, Kelvin sign: Unicode classes


class Timeout(Exception):
    pass


class time_limit:
    """SIGALRM-based limit for one item (main thread only)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __enter__(self):
        def handler(*_a):
            raise Timeout()

        self.old = signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.old)
        return False


class Tally:
    def __init__(self, name: str):
        self.name = name
        self.items = 0
        self.compiled = 0
        self.refused: Counter = Counter()
        self.crashes: list[str] = []
        self.cases = 0
        self.agree = 0
        self.unsound: list[dict] = []
        self.gaps: list[dict] = []
        self.notes: Counter = Counter()

    def judge(self, item: str, text, ours: bool, reader: bool, why: str = "", known: str = "") -> None:
        self.cases += 1
        if ours == reader:
            self.agree += 1
        elif ours:
            self.unsound.append({"item": item, "text": text, "why": why, "known": known})
        else:
            self.gaps.append({"item": item, "text": text, "why": why})


def compile_or_tally(T: Tally, label: str, build, seconds: float, note=None, suffix: str = ""):
    """build() under the time limit; a typed refusal (noted by `note(e)` when given), a timeout or an untyped
    exception (a crash, named by `label`) is tallied on T and gives None."""
    from dllm_constrain.errors import ConstraintError

    try:
        with time_limit(seconds):
            return build()
    except ConstraintError as e:
        T.refused[type(e).__name__ + suffix] += 1
        if note is not None:
            T.notes[note(e)] += 1
    except Timeout:
        T.refused["timeout" + suffix] += 1
    except Exception:  # noqa: BLE001
        T.crashes.append(f"{label}: {traceback.format_exc(limit=1).splitlines()[-1]}")
    return None


def str_mutations(s: str, rng: random.Random, k: int) -> list[str]:
    out = {"", s + s}
    if s:
        out |= {s[:-1], s[1:], s + s[-1]}
    for _ in range(k):
        c = rng.choice(MUTATION_CHARS)
        i = rng.randint(0, len(s))
        r = rng.random()
        if r < 0.35 or not s:
            out.add(s[:i] + c + s[i:])
        elif r < 0.7:
            i = min(i, len(s) - 1)
            out.add(s[:i] + c + s[i + 1:])
        else:
            i = min(i, len(s) - 1)
            out.add(s[:i] + s[i + 1:])
    out.discard(s)
    return sorted(out)


def dfa_samples(dfa, rng: random.Random, k: int, max_len: int = 40) -> list[bytes]:
    """Random members of a lazy byte DFA: a random walk over live bytes, stopping at accepting states with
    some probability, finished by a shortest path to acceptance."""
    from dllm_constrain.constraints.deriv import DEAD, START

    out = []
    for _ in range(k):
        s = START
        buf = bytearray()
        limit = rng.randint(0, max_len)
        while len(buf) < limit:
            if dfa.accepting[s] and rng.random() < 0.15:
                break
            dfa.expand(s)
            row = dfa.T[s]
            live = [b for b in range(256) if row[b] != DEAD]
            if not live:
                break
            pr = [b for b in live if 0x20 <= b < 0x7F]
            b = rng.choice(pr if pr and rng.random() < 0.8 else live)
            buf.append(b)
            s = int(row[b])
        guard = 0
        while not dfa.accepting[s] and guard < 100_000:
            dfa.expand(s)
            row = dfa.T[s]
            d = int(dfa.dist[s])
            nxt = [b for b in range(256) if row[b] != DEAD and int(dfa.dist[row[b]]) == d - 1]
            if not nxt:
                break
            b = rng.choice(nxt)
            buf.append(b)
            s = int(row[b])
            guard += 1
        if dfa.accepting[s]:
            out.append(bytes(buf))
    return out


def byte_info():
    from dllm_constrain.constraints import TokenizerInfo

    toks = [bytes([b]) for b in range(256)]
    return TokenizerInfo(toks + [None, None], eos_id=256, mask_id=257)


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
    from dllm_constrain.constraints.cfg import GrammarCompiler
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


# ---------------------------------------------------------------------------------------------- JSONSchemaBench
def json_mutants(v, schema, rng: random.Random) -> list:
    """Simple mutants: a value's type changed, a required key dropped, a key added, a number perturbed."""
    import copy

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
    import jsonschema

    from dllm_constrain.constraints import ConstraintCompiler, clear_cache

    tk = None
    tok_dir = os.path.join(SHARED, "data", "tokenizers", "bpe32k")
    if os.path.isdir(tok_dir):
        from tokenizers import Tokenizer

        from dllm_constrain.constraints import TokenizerInfo

        tk = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
        info = TokenizerInfo.from_tokenizer(tok_dir, mask_id=tk.token_to_id("<|pad|>"))
    else:
        print("jsb: no bpe32k tokenizer; judging with a byte tokenizer", file=sys.stderr)
        info = byte_info()
    comp = ConstraintCompiler(info, timeout_s=args.compile_timeout)
    opts = {}
    if args.strict:
        from dllm_constrain.api import STRICT_SCHEMA_OPTIONS

        opts = dict(STRICT_SCHEMA_OPTIONS)
    recs = []
    for fn in sorted(os.listdir(args.data)):
        if fn.endswith(".jsonl"):
            with open(os.path.join(args.data, fn)) as f:
                recs += [json.loads(ln) for ln in f]
    srng = random.Random(args.seed)
    recs = srng.sample(recs, min(args.schemas, len(recs)))
    T = Tally("JSONSchemaBench (python-jsonschema, formats on)" + (" strict" if args.strict else ""))
    hyp_fail = 0
    t_end = time.time() + args.jsb_seconds
    for r in recs:
        if time.time() > t_end:
            T.notes["schemas not reached within --jsb-seconds"] += 1
            continue
        T.items += 1
        schema = r["schema"]
        clear_cache()
        try:
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            cls.check_schema(schema)
            validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
        except Exception as e:  # noqa: BLE001
            T.refused["reader refuses the schema"] += 1
            T.notes[f"reader refuses: {type(e).__name__}"] += 1
            continue
        cc = compile_or_tally(T, r["id"], lambda: comp.compile_json_schema(copy.deepcopy(schema), **opts),
                              args.item_timeout)
        if cc is None:
            continue
        T.compiled += 1
        values = []
        try:
            with time_limit(args.item_timeout):
                # a deep copy: hypothesis-jsonschema rewrites the schema it is given in place (canonical forms),
                # which would change what the reader (sharing the dict) validates against
                values += hypothesis_instances(copy.deepcopy(schema), 4 if args.quick else 10, args.seed)
        except Exception:  # noqa: BLE001 (Timeout included: hypothesis-jsonschema's own limits)
            hyp_fail += 1
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
        try:
            with time_limit(args.item_timeout * 2):
                for s in sorted(texts, key=lambda x: (len(x), x)):
                    if len(s) > 4000:
                        continue
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
                                T.crashes.append(f"{r['id']}: accepts_tokens {ours} != accepts_text {by_text} "
                                                 f"on {s[:80]!r}")
                    try:
                        inst = json.loads(s)
                        errs = list(validator.iter_errors(inst))
                        reader = not errs
                    except (ValueError, RecursionError):
                        errs, reader = [], False
                    T.judge(r["id"], s, ours, reader, why="; ".join(f"{e.validator}: {e.message[:80]}" for e in errs[:2]),
                            known=known_json(schema, s, errs) if (ours and not reader) else "")
        except Timeout:
            T.notes["schemas whose strings ran past the item time limit"] += 1
    T.notes[f"schemas where hypothesis-jsonschema produced no instance: {hyp_fail}"] += 1
    return T


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
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
    print("| material | items compiled / total | refused (typed) | cases | agree | soundness disagreements "
          "(we accept, reader rejects) | of them known | coverage gaps (reader accepts, we reject) | crashes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for T in tallies:
        known = sum(1 for d in T.unsound if d["known"])
        print(f"| {T.name} | {T.compiled} / {T.items} | {sum(T.refused.values())} | {T.cases} | {T.agree} | "
              f"{len(T.unsound)} | {known} | {len(T.gaps)} | {len(T.crashes)} |")
    for T in tallies:
        print(f"\n## {T.name} ({T.seconds:.0f} s)")
        if T.refused:
            print("refused:", ", ".join(f"{k} x{v}" for k, v in T.refused.most_common()))
        for k, v in T.notes.most_common():
            print(f"note: {k}" + (f" x{v}" if v > 1 else ""))
        for c in T.crashes[: args.examples]:
            print("CRASH:", c)
        by_item = Counter(d["item"] for d in T.unsound)
        if T.unsound:
            print(f"soundness disagreements on {len(by_item)} items; first ones:")
            seen = set()
            shown = 0
            for d in T.unsound:
                if d["item"] in seen:
                    continue  # one example per item
                seen.add(d["item"])
                print(f"  UNSOUND [{d['known'] or 'new'}] {str(d['item'])[:90]!s}: ours accepts {str(d['text'])[:160]!r}"
                      + (f"  reader: {d['why'][:160]}" if d["why"] else ""))
                shown += 1
                if shown >= args.examples:
                    break
        if T.gaps:
            print(f"coverage gaps on {len({d['item'] for d in T.gaps})} items; first ones:")
            seen = set()
            shown = 0
            for d in T.gaps:
                if d["item"] in seen:
                    continue
                seen.add(d["item"])
                print(f"  GAP {str(d['item'])[:90]}: reader accepts {str(d['text'])[:120]!r}")
                shown += 1
                if shown >= args.examples:
                    break
    if args.json:
        with open(args.json, "w") as f:
            json.dump({T.name: {"unsound": T.unsound, "gaps": T.gaps, "crashes": T.crashes} for T in tallies}, f,
                      indent=1, default=str)
    return 1 if any(T.unsound for T in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
