"""Lazy byte-level DFA by subset construction over the NFA.

A DFA state is the epsilon-closed set of NFA states; it is created on first use and its 256-byte row
is computed only when something walks through it (`ensure_rows`). Sets from which the NFA final state
is unreachable collapse into the single DEAD state (id 0), so every live DFA state is co-reachable:
"not dead" means "some continuation is accepted". The start state has id 1.

The transition table is a numpy int32 array [capacity, 256] (row-major, so `T.ravel()[s*256+b]` is one
gather for the vectorised token-trie walk); `expanded[s]` says whether row s is filled.
"""
from __future__ import annotations

import numpy as np

from .bounds import INF
from .byte_dfa import DEAD, START, LazyByteDFA
from .deadline import Deadline
from .nfa import NFA

__all__ = ["DEAD", "START", "LazyDFA"]


class LazyDFA(LazyByteDFA):
    def __init__(self, nfa: NFA, deadline: Deadline | None = None, max_states: int = 1_000_000):
        self.nfa = nfa
        self.deadline = deadline  # only used during compilation; cleared after
        self.max_states = max_states
        self._nfa_dist = nfa.distances()
        self._closure_cache: dict[int, frozenset[int]] = {}
        # byte classes: maximal intervals not split by any edge boundary
        cuts = {0, 256}
        for es in nfa.edges:
            for lo, hi, _ in es:
                cuts.add(lo)
                cuts.add(hi + 1)
        cuts_sorted = sorted(cuts)
        class_map = np.zeros(256, dtype=np.int32)
        for k in range(len(cuts_sorted) - 1):
            class_map[cuts_sorted[k]:cuts_sorted[k + 1]] = k
        self.n_classes = len(cuts_sorted) - 1
        self.class_map = class_map
        cm = class_map.tolist()
        # per NFA state: edges as class-index intervals
        self._cedges: list[list[tuple[int, int, int]] | None] = [
            [(cm[lo], cm[hi], t) for lo, hi, t in es] if es else None for es in nfa.edges
        ]
        cap = 64
        self.T = np.zeros((cap, 256), dtype=np.int32)
        self.expanded = np.zeros(cap, dtype=bool)
        self.accepting = np.zeros(cap, dtype=bool)
        self.dist = np.zeros(cap, dtype=np.int64)  # min bytes to accept
        self.sets: list[frozenset[int]] = []
        self.index: dict[frozenset[int], int] = {}
        # DEAD
        self._add(frozenset(), INF)
        self.expanded[DEAD] = True  # row of zeros
        self.dist[DEAD] = INF
        start_set = self._closure_of([nfa.start]) if nfa.final >= 0 else frozenset()
        sid = self.intern(start_set)
        if sid == DEAD:
            # empty language: keep START distinct but dead-equivalent (never accepting, row zeros)
            self._add(frozenset({-1}), INF)
            self.expanded[START] = True
            self.accepting[START] = False
        assert len(self.sets) == 2

    # ------------------------------------------------------------------ states
    @property
    def n_states(self) -> int:
        return len(self.sets)

    @property
    def empty_language(self) -> bool:
        return self.nfa.final < 0 or self.dist[START] >= INF

    def _add(self, s: frozenset[int], d: int) -> int:
        sid = len(self.sets)
        if sid >= self.T.shape[0]:
            cap = self.T.shape[0] * 2
            T = np.zeros((cap, 256), dtype=np.int32)
            T[:sid] = self.T[:sid]
            self.T = T
            for name in ("expanded", "accepting", "dist"):
                old = getattr(self, name)
                new = np.zeros(cap, dtype=old.dtype)
                new[:sid] = old[:sid]
                setattr(self, name, new)
        self.sets.append(s)
        self.index[s] = sid
        self.dist[sid] = d
        self.accepting[sid] = self.nfa.final in s
        if sid > self.max_states:
            from ..errors import CompilationTimeoutError

            raise CompilationTimeoutError(f"automaton too large (> {self.max_states} DFA states)")
        return sid

    def intern(self, s: frozenset[int]) -> int:
        sid = self.index.get(s)
        if sid is not None:
            return sid
        dist = self._nfa_dist
        d = min((dist[q] for q in s), default=INF)
        if d >= INF:
            self.index[s] = DEAD
            return DEAD
        return self._add(s, d)

    def _closure_one(self, q: int) -> frozenset[int]:
        c = self._closure_cache.get(q)
        if c is not None:
            return c
        eps = self.nfa.eps
        seen = {q}
        stack = [q]
        while stack:
            x = stack.pop()
            for y in eps[x]:
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        # keep only states that matter: with byte edges, or the final state
        cedges = self._cedges
        fin = self.nfa.final
        dist = self._nfa_dist
        c = frozenset(x for x in seen if (cedges[x] is not None or x == fin) and dist[x] < INF)
        self._closure_cache[q] = c
        return c

    def _closure_of(self, qs) -> frozenset[int]:
        co = self._closure_one
        parts = [co(q) for q in qs]
        if len(parts) == 1:
            return parts[0]
        return frozenset().union(*parts)

    # ------------------------------------------------------------------ rows
    def expand(self, sid: int) -> None:
        if self.expanded[sid]:
            return
        if self.deadline is not None:
            self.deadline.check()
        nc = self.n_classes
        targets: list[set[int] | None] = [None] * nc
        cedges = self._cedges
        for q in self.sets[sid]:
            es = cedges[q]
            if es is None:
                continue
            for clo, chi, t in es:
                for c in range(clo, chi + 1):
                    tc = targets[c]
                    if tc is None:
                        targets[c] = {t}
                    else:
                        tc.add(t)
        row_cls = np.zeros(nc, dtype=np.int32)
        memo: dict[frozenset[int], int] = {}
        for c in range(nc):
            tc = targets[c]
            if not tc:
                continue
            key = frozenset(tc)
            r = memo.get(key)
            if r is None:
                r = self.intern(self._closure_of(key))
                memo[key] = r
            row_cls[c] = r
        self.T[sid] = row_cls[self.class_map]
        self.expanded[sid] = True

    def ensure_rows(self, ids: np.ndarray) -> None:
        """Expand every state in `ids` (an int array)."""
        if ids.size == 0:
            return
        exp = self.expanded
        if ids.max() < exp.shape[0] and exp[ids].all():
            return
        for s in np.unique(ids).tolist():
            if s >= self.expanded.shape[0] or not self.expanded[s]:
                self.expand(s)
