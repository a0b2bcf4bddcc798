"""A regular over-approximation of the grammar for positions right of open gaps.

State (q, p): q the exact lexer state (pending lexeme), p the last emitted non-ignored terminal type (BOS at
the start). A lexeme of type t may follow p iff (p, t) is a bigram of the grammar: t can come right after p in
some sentential form (LAST(X_i) x FIRST(X_j) for X_i ... X_j in a rule with only nullable symbols between).
Every sentence's terminal sequence has only such bigrams, so the language of this automaton contains the
grammar's language: it ignores the stack (nesting, counts) but is exact about lexing, adjacency and lengths.

Ids: a = q * P + p, with P = number of types + 1 (the last one is BOS).
"""
from __future__ import annotations

import numpy as np

from .frontend import GrammarSpec
from .lexer import DEAD, START, Lexer


class ApproxTrans:
    __slots__ = ("a", "lt", "g_target", "succ", "targets", "tidx")

    def __init__(self, a: int, lt, g_target: np.ndarray):
        self.a = a
        self.lt = lt  # the LexTrans of q
        self.g_target = g_target  # int64 [n_groups]: target approx id or -1
        u, inv = np.unique(g_target, return_inverse=True)
        self.targets = u.tolist()  # distinct targets (-1 first when present)
        self.tidx = inv.reshape(-1)  # group -> index into targets
        self.succ = frozenset(t for t in self.targets if t >= 0)

    def select(self, allowed_targets) -> np.ndarray:
        """bool [n_groups]: groups whose target is in allowed_targets (a set; None = any live target)."""
        ok = np.array([t >= 0 and (allowed_targets is None or t in allowed_targets) for t in self.targets],
                      dtype=bool)
        return ok[self.tidx] if ok.size else np.zeros(0, dtype=bool)


class Approx:
    def __init__(self, spec: GrammarSpec, lexer: Lexer):
        self.spec = spec
        self.lexer = lexer
        nt = len(spec.type_names)
        self.NT = nt
        self.P = nt + 1
        self.BOS = nt
        self.bigram, self.can_end, self.start_nullable = self._bigrams(spec)
        self._seqp: dict[tuple[int, int], int] = {}
        self._trans: dict[int, ApproxTrans] = {}
        self._ptypes: dict[int, frozenset[int]] = {}
        self._live: dict[int, bool] = {}
        self._prow: dict[int, np.ndarray] = {}
        self._delta: dict[tuple[int, int], int] = {}

    # ------------------------------------------------------------------ grammar relations
    @staticmethod
    def _bigrams(spec: GrammarSpec):
        nt_n = len(spec.nt_names)
        NT = len(spec.type_names)
        nullable = [False] * nt_n
        first: list[set[int]] = [set() for _ in range(nt_n)]
        last: list[set[int]] = [set() for _ in range(nt_n)]

        def f(sym):
            is_t, x = sym
            return {x} if is_t else first[x]

        def l_(sym):
            is_t, x = sym
            return {x} if is_t else last[x]

        def nul(sym):
            is_t, x = sym
            return (not is_t) and nullable[x]

        changed = True
        while changed:
            changed = False
            for lhs, rhs in spec.rules:
                if not nullable[lhs] and all(nul(s) for s in rhs):
                    nullable[lhs] = True
                    changed = True
                acc: set[int] = set()
                for s in rhs:
                    acc |= f(s)
                    if not nul(s):
                        break
                if not acc <= first[lhs]:
                    first[lhs] |= acc
                    changed = True
                acc = set()
                for s in reversed(rhs):
                    acc |= l_(s)
                    if not nul(s):
                        break
                if not acc <= last[lhs]:
                    last[lhs] |= acc
                    changed = True
        P = NT + 1
        bg = np.zeros((P, NT), dtype=bool)
        for lhs, rhs in spec.rules:
            for i in range(len(rhs)):
                left = l_(rhs[i])
                if not left:
                    continue
                for j in range(i + 1, len(rhs)):
                    right = f(rhs[j])
                    for a in left:
                        for b in right:
                            bg[a, b] = True
                    if not nul(rhs[j]):
                        break
        start_nt = spec.nt_names.index(spec.start) if spec.start in spec.nt_names else None
        can_end = np.zeros(P, dtype=bool)
        start_nullable = False
        if start_nt is not None:
            for b in first[start_nt]:
                bg[NT, b] = True
            for a in last[start_nt]:
                can_end[a] = True
            start_nullable = nullable[start_nt]
            if start_nullable:
                can_end[NT] = True
        return bg, can_end, start_nullable

    # ------------------------------------------------------------------ ids
    def aid(self, q: int, p: int) -> int:
        return q * self.P + p

    def split(self, a: int) -> tuple[int, int]:
        return divmod(a, self.P)

    def seq_p(self, p: int, s: int) -> int:
        """Last type after emitting seq s from last type p (-1 if some bigram fails)."""
        if s == 0:
            return p
        k = (p, s)
        r = self._seqp.get(k)
        if r is not None:
            return r
        lx = self.lexer
        pp = self.seq_p(p, lx.seq_parent[s])
        t = lx.seq_type[s]
        r = t if (pp >= 0 and self.bigram[pp, t]) else -1
        self._seqp[k] = r
        return r

    def possible_types(self, q: int) -> frozenset[int]:
        """Types (-1 = ignored) the pending lexeme of q can still be emitted as."""
        r = self._ptypes.get(q)
        if r is not None:
            return r
        lx = self.lexer
        seen = {q}
        stack = [q]
        out: set[int] = set()
        while stack:
            x = stack.pop()
            et = lx.lexeme_type(x)
            if et >= -1:
                out.add(et)
            lx.expand(x)
            row_t = lx.T[x]
            row_e = lx.E[x]
            cont = np.unique(row_t[(row_e == -1) & (row_t != DEAD)]).tolist()
            for y in cont:
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        r = frozenset(out)
        self._ptypes[q] = r
        return r

    def ptype_row(self, q: int) -> np.ndarray:
        """bool [types + 1]: the types the pending lexeme of q can still become (last column: ignored)."""
        r = self._prow.get(q)
        if r is None:
            r = np.zeros(self.NT + 1, dtype=bool)
            for t in self.possible_types(q):
                r[self.NT if t == -1 else t] = True
            self._prow[q] = r
        return r

    def end_ptypes(self, lt) -> np.ndarray:
        m = lt.end_ptypes
        if m is None:
            ends = lt.g_end.tolist()
            m = np.zeros((lt.n_groups, self.NT + 1), dtype=bool)
            for g, e in enumerate(ends):
                m[g] = self.ptype_row(e)
            lt.end_ptypes = m
        return m

    def lex_ok(self, q: int, p: int) -> bool:
        """The pending lexeme can end with a type that may follow p."""
        if q == START:
            return p == self.BOS
        for t in self.possible_types(q):
            if t == -1 or self.bigram[p, t]:
                return True
        return False

    # ------------------------------------------------------------------ transitions
    def trans(self, a: int) -> ApproxTrans:
        tr = self._trans.get(a)
        if tr is not None:
            return tr
        q, p = divmod(a, self.P)
        lt = self.lexer.trans(q)
        useq = np.unique(lt.g_seq)
        pmap = {int(s): self.seq_p(p, int(s)) for s in useq.tolist()}
        p2 = np.array([pmap[int(s)] for s in lt.g_seq.tolist()], dtype=np.int64) if lt.n_groups else np.zeros(0, np.int64)
        tgt = np.where(p2 >= 0, lt.g_end * self.P + p2, -1)
        # drop targets whose pending lexeme cannot end well
        if tgt.size:
            ut = np.unique(tgt[tgt >= 0])
            bad = [int(x) for x in ut.tolist() if not self.lex_ok(*divmod(int(x), self.P))]
            if bad:
                tgt = np.where(np.isin(tgt, np.array(bad, dtype=np.int64)), -1, tgt)
        tr = ApproxTrans(a, lt, tgt)
        self._trans[a] = tr
        return tr

    def succ(self, a: int) -> frozenset[int]:
        return self.trans(a).succ

    def delta(self, a: int, t: int) -> int:
        k = (a, t)
        r = self._delta.get(k)
        if r is None:
            r = self._delta_uncached(a, t)
            if len(self._delta) > 500_000:
                self._delta.clear()
            self._delta[k] = r
        return r

    def _delta_uncached(self, a: int, t: int) -> int:
        q, p = divmod(a, self.P)
        q2, s = self.lexer.delta(q, t)
        if q2 == DEAD:
            return -1
        p2 = self.seq_p(p, s)
        if p2 < 0 or not self.lex_ok(q2, p2):
            return -1
        return q2 * self.P + p2

    def accepting(self, a: int) -> bool:
        q, p = divmod(a, self.P)
        if q == START:
            return p == self.BOS and self.start_nullable
        t = self.lexer.lexeme_type(q)
        if t == -2:
            return False
        if t == -1:
            return bool(self.can_end[p])
        return bool(self.bigram[p, t] and self.can_end[t])
