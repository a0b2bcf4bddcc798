"""Helpers shared by the constraint tests: tiny vocabularies, random members of a DFA's language, a random
regex grammar for hypothesis, brute-force oracles of canvas masks, a greedy tokenizer for byte strings, and the
native core's test doubles (a lazy table DFA, a token automaton's transitions in comparable form).

A plain module (not test_*.py) beside the tests, as checkpoints.py and engine_fakes.py: pytest puts this folder
on sys.path, so `from constraint_support import ...` works from any test file."""
from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable, Sequence

import os
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import strategies as st

from dllm_constrain.constraints import TokenizerInfo
from dllm_constrain.constraints._cwalk import NO_C_ENV
from dllm_constrain.constraints import token_automaton
from dllm_constrain.constraints.token_automaton import TokenAutomaton
from dllm_constrain.constraints.deriv import DEAD, START, DerivDFA

# ---------------------------------------------------------------------------------- tiny vocabularies
# "é" is two UTF-8 bytes (c3 a9): vocabularies below contain tokens that split it.
TINY_ALPHABET = [b"a", b"b", b"c", b"\xc3", b"\xa9"]


class DeadlineAfter:
    """A deadline that expires at its n-th check (and counts down below zero if it never does: -1 - n checks)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def check(self) -> None:
        from dllm_constrain.errors import CompilationTimeoutError

        self.n -= 1
        if self.n == 0:
            raise CompilationTimeoutError("deadline expired")


def tiny_info(tokens: Sequence[bytes]) -> TokenizerInfo:
    """Text tokens 0..k-1, then EOS = k, MASK = k+1."""
    k = len(tokens)
    return TokenizerInfo(list(tokens) + [None, None], eos_id=k, mask_id=k + 1)


@st.composite
def tiny_vocabularies(draw, min_size: int = 4, max_size: int = 10) -> list[bytes]:
    """Distinct tokens of 1-3 bytes over TINY_ALPHABET (always with the single bytes a and b)."""
    pool = [b"".join(p) for n in (1, 2, 3) for p in itertools.product(TINY_ALPHABET, repeat=n)]
    extra = draw(st.lists(st.sampled_from(pool), min_size=min_size - 2, max_size=max_size - 2, unique=True))
    out = [b"a", b"b"] + [t for t in extra if t not in (b"a", b"b")]
    return out


# ---------------------------------------------------------------------------------- language walks
def random_members(dfa: DerivDFA, rng: random.Random, n: int, max_len: int, stop: float) -> list[bytes]:
    """Random members of the language: random byte walks that always keep a completion, stopping at
    accepting states with probability `stop` (always once past max_len // 2, where the walk also heads
    towards acceptance); walks that end unaccepted are dropped."""
    out = []
    for _ in range(n):
        s, buf = START, bytearray()
        for _ in range(max_len):
            if dfa.accepting[s] and (rng.random() < stop or len(buf) > max_len // 2):
                break
            dfa.expand(s)
            live = [b for b in range(256) if dfa.T[s, b] != DEAD]
            if not live:
                break
            if len(buf) > max_len // 2:
                live.sort(key=lambda b: int(dfa.dist[dfa.T[s, b]]))
                live = live[:2]
            b = rng.choice(live)
            buf.append(b)
            s = int(dfa.T[s, b])
        if dfa.accepting[s]:
            out.append(bytes(buf))
    return out


# ---------------------------------------------------------------------------------- regex grammar
_ATOMS = ["a", "b", "c", "é", "[ab]", "[^a]", "[a-c]", r"\d", "(?:ab|c)", "(?:é|b)", "."]


@st.composite
def small_regexes(draw, depth: int = 2) -> str:
    """Regexes from a small grammar: atoms, concatenation, alternation, groups, quantifiers."""
    if depth == 0:
        return draw(st.sampled_from(_ATOMS))
    kind = draw(st.sampled_from(["atom", "cat", "alt", "quant", "group"]))
    if kind == "atom":
        return draw(st.sampled_from(_ATOMS))
    if kind == "cat":
        return draw(small_regexes(depth - 1)) + draw(small_regexes(depth - 1))
    if kind == "alt":
        return "(?:" + draw(small_regexes(depth - 1)) + "|" + draw(small_regexes(depth - 1)) + ")"
    if kind == "group":
        return "(" + draw(small_regexes(depth - 1)) + ")"
    q = draw(st.sampled_from(["?", "*", "+", "{2}", "{0,2}", "{1,3}", "{2,}", "*?"]))
    return "(?:" + draw(small_regexes(depth - 1)) + ")" + q


# ---------------------------------------------------------------------------------- oracles
def canvas_text(canvas: Sequence[int], tokens: Sequence[bytes], eos: int) -> bytes | None:
    """Bytes up to the first EOS, or None when a non-EOS follows an EOS."""
    out = b""
    ended = False
    for t in canvas:
        if ended:
            if t != eos:
                return None
            continue
        if t == eos:
            ended = True
            continue
        out += tokens[t]
    return out


def regex_accepts(pattern: str) -> Callable[[bytes], bool]:
    rx = re.compile(pattern)

    def ok(data: bytes) -> bool:
        try:
            s = data.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return rx.fullmatch(s) is not None

    return ok


def brute_force_allowed(canvas: Sequence[int], tokens: Sequence[bytes], eos: int, mask: int,
                        accepts: Callable[[bytes], bool]) -> dict[int, set[int]]:
    """For every open position: the tokens that appear in some valid completion (enumerates them all)."""
    opens = [i for i, c in enumerate(canvas) if c == mask]
    allowed: dict[int, set[int]] = {i: set() for i in opens}
    choices = list(range(len(tokens))) + [eos]
    for assign in itertools.product(choices, repeat=len(opens)):
        c = list(canvas)
        for i, t in zip(opens, assign):
            c[i] = t
        text = canvas_text(c, tokens, eos)
        if text is not None and accepts(text):
            for i, t in zip(opens, assign):
                allowed[i].add(t)
    return allowed


def brute_force_completable(canvas: Sequence[int], tokens: Sequence[bytes], eos: int, mask: int,
                            accepts: Callable[[bytes], bool]) -> bool:
    opens = [i for i, c in enumerate(canvas) if c == mask]
    if not opens:
        text = canvas_text(canvas, tokens, eos)
        return text is not None and accepts(text)
    return any(brute_force_allowed(canvas, tokens, eos, mask, accepts).values())


def greedy_tokenize(data: bytes, tokens: Sequence[bytes | None]) -> list[int]:
    """Longest-match tokenization (every byte must be a token on its own or inside a longer one)."""
    by_bytes = {b: i for i, b in enumerate(tokens) if b}
    maxlen = max(len(b) for b in by_bytes)
    out = []
    i = 0
    while i < len(data):
        for n in range(min(maxlen, len(data) - i), 0, -1):
            t = by_bytes.get(data[i:i + n])
            if t is not None:
                out.append(t)
                i += n
                break
        else:
            raise ValueError(f"byte {data[i]!r} has no token")
    return out


def json_test_vocabulary() -> list[bytes]:
    """All 256 single bytes plus common JSON pieces: a stand-in for a byte-level BPE vocabulary."""
    pieces = [b'{"', b'":', b'":"', b'","', b'"}', b'},{', b'"]', b'["', b'":[', b'":{', b'null', b'true',
              b'false', b'00', b'10', b'20', b'.5', b'-1', b'name', b'id', b'type', b'value', b'data', b' ',
              b'ing', b'tion', b'er', b'\xc3\xa9', b'e', b'le', b'an', b'20', b'-0', b'T1', b':00', b'Z"']
    toks = [bytes([b]) for b in range(256)]
    for p in pieces:
        if p not in toks:
            toks.append(p)
    return toks


# ---------------------------------------------------------------------------------- the native core
try:
    from dllm_constrain.constraints import _native
except ImportError:  # built without a C compiler: only the fallback tests apply
    _native = None

# tests of the native core need it built and selected (a run of the suite under DLLM_CONSTRAIN_NO_C=1 checks the
# numpy and Python paths everywhere else)
needs_native = pytest.mark.skipif(_native is None or bool(os.environ.get(NO_C_ENV)),
                                  reason="the native extension is not built (no C compiler at install time) or "
                                         "DLLM_CONSTRAIN_NO_C is set: the numpy walker is the only one")


@dataclass
class LazyTableDFA:
    """A lazy byte DFA over a hidden complete table (state 0 = DEAD): a row becomes visible in T only when expand()
    computes it, and every `replace_every`-th expansion replaces the tables by larger copies, as DerivDFA does when
    it grows, so a walk must read the tables afresh after expanding."""

    full: np.ndarray  # int32 [n_states, 256]
    replace_every: int = 0
    T: np.ndarray = field(init=False)
    expanded: np.ndarray = field(init=False)
    accepting: np.ndarray = field(init=False)
    expansions: int = 0

    def __post_init__(self) -> None:
        n = self.full.shape[0]
        self.T = np.zeros((n, 256), dtype=np.int32)
        self.expanded = np.zeros(n, dtype=bool)
        self.expanded[0] = True
        self.accepting = np.zeros(n, dtype=bool)
        self.dist = np.zeros(n, dtype=np.int64)

    def expand(self, s: int) -> None:
        if self.expanded[s]:
            return
        self.expansions += 1
        if self.replace_every and self.expansions % self.replace_every == 0:
            T = np.zeros((self.T.shape[0] + 3, 256), dtype=np.int32)
            expanded = np.zeros(T.shape[0], dtype=bool)
            T[: self.T.shape[0]] = self.T
            expanded[: self.expanded.shape[0]] = self.expanded
            self.T, self.expanded = T, expanded
            self.accepting = np.zeros(T.shape[0], dtype=bool)
            self.dist = np.zeros(T.shape[0], dtype=np.int64)
        self.T[s] = self.full[s]
        self.expanded[s] = True

    def walk(self, s: int, data: bytes) -> int:
        for b in data:
            if s == 0:
                return 0
            self.expand(s)
            s = int(self.T[s, b])
        return s

    def ensure_rows(self, ids: np.ndarray) -> None:
        for s in np.unique(ids[~self.expanded[ids]]).tolist():
            self.expand(s)


def trans_fields(ta: TokenAutomaton, s: int) -> dict:
    """A state's token transitions in comparable form (interned rows by content, not by row number)."""
    tt = ta.trans(s)
    return {"n": tt.n_allowed, "targets": tt.targets, "succ_bits": tt.succ_bits,
            "sparse": {u: a.tolist() for u, a in tt.sparse.items()},
            "dense": {u: ta.allp[k].tobytes() for u, k in tt.dense.items()},
            "all_row": None if tt.all_row < 0 else ta.allp[tt.all_row].tobytes(),
            "all_sparse": None if tt.all_sparse is None else tt.all_sparse.tolist()}


def table_automaton(full: np.ndarray, toks: list[bytes | None], use_c: bool, replace_every: int = 0) -> TokenAutomaton:
    """The token automaton of a LazyTableDFA over `toks` (its last two ids: EOS, mask)."""
    info = TokenizerInfo(toks, eos_id=len(toks) - 2, mask_id=len(toks) - 1)
    return TokenAutomaton(LazyTableDFA(full, replace_every), info, use_c=use_c)


@contextmanager
def grouping_thresholds(dense_min: int, small: int):
    """Small grouping thresholds for the block, so that packed groups, the row of every token and the sorted ids
    all occur in tiny vocabularies."""
    saved = token_automaton.DENSE_MIN, token_automaton.SMALL
    token_automaton.DENSE_MIN, token_automaton.SMALL = dense_min, small
    try:
        yield
    finally:
        token_automaton.DENSE_MIN, token_automaton.SMALL = saved
