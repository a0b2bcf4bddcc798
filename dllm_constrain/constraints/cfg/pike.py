"""A terminal regex with Python's own match semantics (`re.match`: the first match in priority order, not the
longest), as a lazy byte DFA: a Pike VM made deterministic, a state the ordered tuple of live NFA threads.

The lexer (lexer.py) ends a lexeme only where the terminal's state is accepting and no thread survives the next
byte, so every lexeme accepted is exactly what `re.match` returns there. docs/grammars.md, "Terminals with Python's
match semantics", has the construction and what is refused (InvalidGrammarError, by the caller).
"""
from __future__ import annotations

import re._constants as C  # type: ignore[import-not-found]
import re._parser as P  # type: ignore[import-not-found]

import numpy as np

from ...errors import CompilationTimeoutError
from .. import regex_ast as A
from ..utf8 import utf8_sequences
from ..regex_parser import _unicode_class
from ..regex_ast import ranges_complement, ranges_difference, ranges_union

DEAD = 0
START = 1
MAX_NFA = 60_000

# NFA node kinds
_CHAR, _SPLIT, _EPS, _MATCH = 0, 1, 2, 3
_SURROGATES: A.Ranges = ((0xD800, 0xDFFF),)


class Unsupported(Exception):
    """The regex uses something this matcher does not model (the message names it)."""


def _category(cat) -> A.Ranges:
    table = {C.CATEGORY_DIGIT: ("d", False), C.CATEGORY_NOT_DIGIT: ("d", True),
             C.CATEGORY_SPACE: ("s", False), C.CATEGORY_NOT_SPACE: ("s", True),
             C.CATEGORY_WORD: ("w", False), C.CATEGORY_NOT_WORD: ("w", True)}
    if cat not in table:
        raise Unsupported(f"character category {cat}")
    kind, neg = table[cat]
    s = _unicode_class(kind)
    return ranges_complement(s) if neg else s


class PikeNFA:
    """Byte-level NFA with ordered splits. Node i: kind[i]; CHAR: mask[i] (bool[256]) and out1[i];
    SPLIT: out1 (preferred) and out2; EPS: out1; MATCH."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        self.kind: list[int] = []
        self.out1: list[int] = []
        self.out2: list[int] = []
        self.mask: list[np.ndarray | None] = []
        try:
            tree = P.parse(pattern)
        except Exception as e:  # noqa: BLE001
            raise Unsupported(f"regex does not parse: {e}") from None
        if tree.state.flags & ~(C.SRE_FLAG_UNICODE):
            raise Unsupported("inline flags")
        self.match = self._new(_MATCH)
        try:
            self.start = self._build(list(tree), self.match)
        except RecursionError:
            raise Unsupported("regex nested too deeply") from None
        self._coreach()

    # ------------------------------------------------------------------ construction (right to left)
    def _new(self, kind: int, out1: int = -1, out2: int = -1, mask=None) -> int:
        if len(self.kind) >= MAX_NFA:
            raise Unsupported(f"regex too large (> {MAX_NFA} NFA states)")
        self.kind.append(kind)
        self.out1.append(out1)
        self.out2.append(out2)
        self.mask.append(mask)
        return len(self.kind) - 1

    def _chars(self, ranges: A.Ranges, nxt: int) -> int:
        ranges = ranges_difference(ranges, _SURROGATES)
        seqs = utf8_sequences(tuple(ranges))
        if not seqs:
            raise Unsupported("an empty character set")
        one = np.zeros(256, dtype=bool)
        starts: list[int] = []
        for sq in seqs:
            if len(sq) == 1:
                one[sq[0][0]:sq[0][1] + 1] = True
                continue
            cur = nxt
            for lo, hi in reversed(sq):
                m = np.zeros(256, dtype=bool)
                m[lo:hi + 1] = True
                cur = self._new(_CHAR, cur, mask=m)
            starts.append(cur)
        if one.any():
            starts.insert(0, self._new(_CHAR, nxt, mask=one))
        # the byte sequences of distinct code points are disjoint: their order does not matter
        cur = starts[-1]
        for s in reversed(starts[:-1]):
            cur = self._new(_SPLIT, s, cur)
        return cur

    def _set(self, op, av) -> A.Ranges:
        if op == C.LITERAL:
            return ((av, av),)
        if op == C.NOT_LITERAL:
            return ranges_complement(((av, av),))
        if op == C.ANY:
            return ranges_complement(((0x0A, 0x0A),))
        if op == C.IN:
            neg = False
            parts: list[A.Ranges] = []
            for iop, iav in av:
                if iop == C.NEGATE:
                    neg = True
                elif iop == C.LITERAL:
                    parts.append(((iav, iav),))
                elif iop == C.RANGE:
                    parts.append(((iav[0], iav[1]),))
                elif iop == C.CATEGORY:
                    parts.append(_category(iav))
                else:
                    raise Unsupported(f"class item {iop}")
            u = ranges_union(*parts) if parts else ()
            return ranges_complement(u) if neg else u
        raise Unsupported(str(op))

    def _nullable(self, items) -> bool:
        for op, av in items:
            if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
                return False
            if op == C.BRANCH:
                if not any(self._nullable(b) for b in av[1]):
                    return False
            elif op == C.SUBPATTERN:
                if not self._nullable(av[-1]):
                    return False
            elif op in (C.MAX_REPEAT, C.MIN_REPEAT):
                if av[0] > 0 and not self._nullable(av[2]):
                    return False
        return True

    def _build(self, items, nxt: int) -> int:
        for op, av in reversed(items):
            nxt = self._build_one(op, av, nxt)
        return nxt

    def _build_one(self, op, av, nxt: int) -> int:
        if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
            return self._chars(self._set(op, av), nxt)
        if op == C.SUBPATTERN:
            _group, add_flags, del_flags, sub = av
            if add_flags or del_flags:
                raise Unsupported("inline flags")
            return self._build(list(sub), nxt)
        if op == C.BRANCH:
            starts = [self._build(list(b), nxt) for b in av[1]]
            cur = starts[-1]
            for s in reversed(starts[:-1]):
                cur = self._new(_SPLIT, s, cur)
            return cur
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            lo, hi, sub = av
            greedy = op == C.MAX_REPEAT
            sub = list(sub)
            unbounded = hi == C.MAXREPEAT
            if (unbounded or hi > 1) and self._nullable(sub):
                raise Unsupported("a repeated group that can match the empty string")
            if not unbounded and hi > 1000 or lo > 1000:
                raise Unsupported("a counted repetition above 1000")
            if unbounded:
                # loop: L = split(body -> L, nxt) (greedy) / split(nxt, body -> L) (lazy)
                loop = self._new(_SPLIT)
                body = self._build(sub, loop)
                if greedy:
                    self.out1[loop], self.out2[loop] = body, nxt
                else:
                    self.out1[loop], self.out2[loop] = nxt, body
                cur = loop
            else:
                cur = nxt
                for _ in range(hi - lo):
                    body = self._build(sub, cur)
                    # each optional iteration may stop; stopping goes straight to nxt
                    cur = self._new(_SPLIT, body, nxt) if greedy else self._new(_SPLIT, nxt, body)
            for _ in range(lo):
                cur = self._build(sub, cur)
            return cur
        raise Unsupported(str(op).lower().replace("_", " "))

    def _coreach(self) -> None:
        """live[i]: node i can reach MATCH."""
        n = len(self.kind)
        preds: list[list[int]] = [[] for _ in range(n)]
        for i in range(n):
            for o in (self.out1[i], self.out2[i]):
                if o >= 0:
                    preds[o].append(i)
        live = [False] * n
        live[self.match] = True
        stack = [self.match]
        while stack:
            x = stack.pop()
            for p in preds[x]:
                if not live[p]:
                    live[p] = True
                    stack.append(p)
        self.live = live


class PikeDFA:
    """Lazy DFA over ordered thread tuples (the part of deriv.DerivDFA's interface the lexer and cfg/sample
    use: T, expanded, accepting, expand; state 0 is dead, 1 the start)."""

    def __init__(self, nfa: PikeNFA, max_states: int = 100_000):
        self.nfa = nfa
        self.max_states = max_states
        cap = 64
        self.T = np.zeros((cap, 256), dtype=np.int32)
        self.expanded = np.zeros(cap, dtype=bool)
        self.accepting = np.zeros(cap, dtype=bool)
        self.keys: list[tuple[int, ...]] = []
        self.index: dict[tuple[int, ...], int] = {}
        self._add(())
        self.expanded[DEAD] = True
        start = self._closure([nfa.start])
        if not start:
            self._add(None)  # matches nothing: a start state that behaves like DEAD
            self.expanded[START] = True
        else:
            self._add(start)

    @property
    def n_states(self) -> int:
        return len(self.keys)

    def _closure(self, pcs) -> tuple[int, ...]:
        nfa = self.nfa
        kind, out1, out2, live = nfa.kind, nfa.out1, nfa.out2, nfa.live
        seen: set[int] = set()
        out: list[int] = []
        for pc0 in pcs:
            stack = [pc0]
            while stack:
                pc = stack.pop()
                if pc in seen or not live[pc]:
                    continue
                seen.add(pc)
                k = kind[pc]
                if k == _SPLIT:
                    stack.append(out2[pc])
                    stack.append(out1[pc])  # preferred branch explored first
                elif k == _EPS:
                    stack.append(out1[pc])
                else:
                    out.append(pc)
                    if k == _MATCH:
                        return tuple(out)  # lower-priority threads can never win
        return tuple(out)

    def _add(self, key) -> int:
        sid = len(self.keys)
        if sid > self.max_states:
            raise CompilationTimeoutError(f"terminal automaton too large (> {self.max_states} states)")
        if sid >= self.T.shape[0]:
            cap = self.T.shape[0] * 2
            T = np.zeros((cap, 256), dtype=np.int32)
            ex = np.zeros(cap, dtype=bool)
            acc = np.zeros(cap, dtype=bool)
            T[:sid], ex[:sid], acc[:sid] = self.T[:sid], self.expanded[:sid], self.accepting[:sid]
            self.T, self.expanded, self.accepting = T, ex, acc
        self.T[sid] = 0
        self.expanded[sid] = False
        self.accepting[sid] = bool(key) and self.nfa.kind[key[-1]] == _MATCH
        self.keys.append(key)
        if key is not None:
            self.index[key] = sid
        return sid

    def _state(self, key: tuple[int, ...]) -> int:
        if not key:
            return DEAD
        s = self.index.get(key)
        return s if s is not None else self._add(key)

    def expand(self, sid: int) -> None:
        if self.expanded[sid]:
            return
        nfa = self.nfa
        key = self.keys[sid]
        chars = [pc for pc in key if nfa.kind[pc] == _CHAR]
        row = np.zeros(256, dtype=np.int32)
        if chars:
            M = np.stack([nfa.mask[pc] for pc in chars])  # [threads, 256]
            # bytes with the same set of surviving threads share a row entry
            cols, inv = np.unique(M.T, axis=0, return_inverse=True)
            inv = inv.reshape(-1)
            for c in range(cols.shape[0]):
                alive = [nfa.out1[pc] for pc, on in zip(chars, cols[c].tolist()) if on]
                row[inv == c] = self._state(self._closure(alive)) if alive else DEAD
        self.T[sid] = row
        self.expanded[sid] = True

    def step(self, s: int, b: int) -> int:
        if not self.expanded[s]:
            self.expand(s)
        return int(self.T[s, b])

    def match_len(self, data: bytes) -> int | None:
        """Length of Python's re.match of the regex on data (None: no match); for tests."""
        s = START
        best = 0 if self.accepting[s] else None
        for i, b in enumerate(data):
            s = self.step(s, b)
            if s == DEAD:
                break
            if self.accepting[s]:
                best = i + 1
        return best
