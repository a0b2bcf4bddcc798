"""Property tests of the grammar constraint on grammars drawn from a family (nested brackets, lists with
separators, keyword statements, expressions with precedence) and small vocabularies (tokens of 1-3 bytes):

* random canvases, random commit orders and random logits through a loop that mirrors the engine's step
  (masks -> proposals -> joint verification -> undo on an uncompletable canvas): the output always parses
  with Lark's own parser, within the engine's step bound;
* the mask at the frontier equals the brute-force set (every assignment of the open positions checked with
  Lark), and is_completable equals the brute-force answer.
"""
from __future__ import annotations

import itertools
import os
import random

import lark
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lark_reference import lark_accepts

from dllm_constrain.constraints import TokenizerInfo
from dllm_constrain.constraints.compiler import GrammarCompiler
from dllm_constrain.errors import ConstraintTooLongError

EOS, MASK = 0, 1
SCALE = float(os.environ.get("GRAMMAR_PROPERTY_SCALE", "1"))  # > 1 for a longer hypothesis run


@st.composite
def grammar_cases(draw):
    """(grammar text, vocabulary strings)."""
    kind = draw(st.sampled_from(["brackets", "list", "keywords", "expr"]))
    spaces = draw(st.booleans())
    if kind == "brackets":
        o, c = draw(st.sampled_from([("(", ")"), ("[", "]"), ("{", "}")]))
        atom = draw(st.sampled_from(['"a"', "NAME"]))
        rep = draw(st.sampled_from(["*", "+"]))
        g = f'start: x{rep}\nx: "{o}" x* "{c}" | {atom}\nNAME: /[a-b]+/\n'
        alphabet = o + c + "ab"
    elif kind == "list":
        o, c = draw(st.sampled_from([("[", "]"), ("(", ")")]))
        sep = draw(st.sampled_from([",", ";"]))
        g = f'start: "{o}" [item ("{sep}" item)*] "{c}"\n?item: NUM | NAME | start\nNUM: /[0-9]+/\nNAME: /[a-b]+/\n'
        alphabet = o + c + sep + "1a"
    elif kind == "keywords":
        kws = draw(st.lists(st.sampled_from(["if", "do", "go"]), min_size=1, max_size=2, unique=True))
        alts = " | ".join(f'"{k}" NAME ";"' for k in kws)
        g = f'start: stmt+\nstmt: {alts} | NAME "=" NAME ";"\nNAME: /[a-z]+/\n'
        spaces = True
        alphabet = "".join(sorted(set("".join(kws)))) + "x=; "
    else:
        lo, hi = draw(st.sampled_from([("+", "*"), ("-", "/"), ("+", "^")]))
        g = (f'?start: sum\n?sum: sum "{lo}" prod | prod\n?prod: prod "{hi}" atom | atom\n'
             f'?atom: NUM | "(" sum ")"\nNUM: /[0-9]+/\n')
        alphabet = lo + hi + "()12"
    if spaces:
        g += '%ignore " "\n'
        if " " not in alphabet:
            alphabet += " "
    singles = list(dict.fromkeys(alphabet))
    multi = draw(st.lists(st.text(alphabet=alphabet, min_size=2, max_size=3), max_size=4, unique=True))
    vocab = list(dict.fromkeys(singles + multi))
    return g, vocab


def make_tok(strings: list[str]) -> TokenizerInfo:
    return TokenizerInfo([None, None] + [s.encode() for s in strings], eos_id=EOS, mask_id=MASK)


def decode(info: TokenizerInfo, canvas: list[int]) -> str:
    ids = canvas[: canvas.index(EOS)] if EOS in canvas else canvas
    return b"".join(info.token_bytes[t] for t in ids).decode()


def lark_ok(lk: lark.Lark, text: str, cache: dict) -> bool:
    r = cache.get(text)
    if r is None:
        r = cache[text] = lark_accepts(lk, text)
    return r


def run_loop(state, info: TokenizerInfo, n: int, rng: random.Random, k_max: int) -> list[int]:
    """The engine's step with random logits: forced tokens, masks, proposals by random scores, joint
    verification, undo + ban when the canvas became uncompletable. Returns the final canvas."""
    canvas = [MASK] * n
    banned: set[tuple[int, int]] = set()
    for _step in range(4 * n + 64):
        for p, t in state.forced_tokens(canvas).items():
            canvas[p] = t
        if EOS in canvas:
            e = canvas.index(EOS)
            if MASK not in canvas[:e]:
                return canvas[:e] + [EOS] * (n - e)
        if MASK not in canvas:
            return canvas
        opens = [i for i in range(n) if canvas[i] == MASK]
        rows = state.allowed_tokens(canvas, opens).numpy()
        proposals = []
        for j, p in enumerate(opens):
            ids = [int(t) for t in np.flatnonzero(rows[j]) if (p, int(t)) not in banned]
            if ids:
                proposals.append((p, rng.choice(ids), rng.random()))
        proposals.sort(key=lambda x: -x[2])
        proposals = proposals[: rng.randint(1, k_max)]
        assert proposals, "no open position has an allowed token"
        accepted = state.select_commits(canvas, proposals) or [proposals[0][:2]]
        for p, t in accepted:
            canvas[p] = t
        if not state.is_completable(canvas):
            for p, t in accepted:
                canvas[p] = MASK
                banned.add((p, t))
    raise AssertionError("the loop did not finish within the engine's step bound")


@settings(max_examples=int(40 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=grammar_cases(), n=st.integers(1, 10), seed=st.integers(0, 2**32 - 1), k_max=st.integers(1, 4))
def test_outputs_always_parse_with_lark(case, n, seed, k_max) -> None:
    g, vocab = case
    info = make_tok(vocab)
    cg = GrammarCompiler(info).compile(g)
    lk = lark.Lark(g, parser="lalr", lexer="basic")
    try:
        state = cg.new_canvas_state(n)
    except ConstraintTooLongError:
        return
    canvas = run_loop(state, info, n, random.Random(seed), k_max)
    text = decode(info, canvas)
    assert lark_ok(lk, text, {}), (g, vocab, canvas, text)
    if EOS in canvas:
        assert all(t == EOS for t in canvas[canvas.index(EOS):])


def brute_force(lk, info, canvas, cache) -> list[tuple[int, ...]]:
    """Every valid completion of the canvas (open positions over the whole vocabulary and EOS)."""
    n = len(canvas)
    opens = [i for i in range(n) if canvas[i] == MASK]
    toks = list(range(2, len(info.token_bytes))) + [EOS]
    out = []
    for combo in itertools.product(toks, repeat=len(opens)):
        c = list(canvas)
        for i, t in zip(opens, combo):
            c[i] = t
        if EOS in c and any(x != EOS for x in c[c.index(EOS):]):
            continue
        if lark_ok(lk, decode(info, c), cache):
            out.append(tuple(c))
    return out


@settings(max_examples=int(60 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=grammar_cases(), n=st.integers(1, 6), data=st.data())
def test_frontier_masks_equal_the_brute_force_set(case, n, data) -> None:
    g, vocab = case
    info = make_tok(vocab)
    cg = GrammarCompiler(info).compile(g)
    lk = lark.Lark(g, parser="lalr", lexer="basic")
    try:
        state = cg.new_canvas_state(n)
    except ConstraintTooLongError:
        return
    choices = [MASK] * 3 + list(range(2, len(info.token_bytes))) + [EOS]
    canvas = data.draw(st.lists(st.sampled_from(choices), min_size=n, max_size=n))
    opens = [i for i in range(n) if canvas[i] == MASK]
    max_open = 4 if len(vocab) <= 7 else 3
    if not opens:
        canvas[data.draw(st.integers(0, n - 1))] = MASK
        opens = [i for i in range(n) if canvas[i] == MASK]
    for i in opens[max_open:]:
        canvas[i] = data.draw(st.sampled_from(choices[3:]))
    valid = brute_force(lk, info, canvas, {})
    assert state.is_completable(canvas) == bool(valid), (g, vocab, canvas)
    if not valid:
        return
    f = canvas.index(MASK)
    expected = {v[f] for v in valid}
    got = set(np.flatnonzero(state.allowed_tokens(canvas, [f])[0].numpy()).tolist())
    assert got == expected, (g, vocab, canvas, f, sorted(got - expected), sorted(expected - got))
