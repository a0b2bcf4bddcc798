"""Regex AST -> byte-level Thompson NFA.

States are ints; `eps[q]` lists epsilon successors, `edges[q]` lists (lo, hi, target) byte ranges.
Code-point sets are encoded as UTF-8 byte-range sequences (utf8.py), so the NFA, and every automaton
built from it, works on bytes: tokens that split a multi-byte character are handled exactly.

With dfa.py (lazy subset construction) this is the second regex engine beside the derivative DFA
(deriv.py): formats.py determinises small format languages with it (faster there), and the tests compare
the two engines.

Construction invariant (makes sharing a start state safe): `build(node, s)` never adds an edge *into*
`s`; loops always go through a fresh state.
"""
from __future__ import annotations

from collections import deque

from ..errors import CompilationTimeoutError
from . import object_members
from . import regex_ast as A
from .bounds import INF
from .deadline import Deadline
from .utf8 import utf8_sequences


class NFA:
    __slots__ = ("eps", "edges", "start", "final", "deadline", "max_states", "_dist")

    def __init__(self, deadline: Deadline | None = None, max_states: int = 2_000_000):
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int, int]]] = []
        self.deadline = deadline
        self.max_states = max_states
        self.start = self.new()
        self.final = -1
        self._dist: list[int] | None = None

    def new(self) -> int:
        self.eps.append([])
        self.edges.append([])
        n = len(self.eps)
        if n & 1023 == 0:
            if n > self.max_states:
                raise CompilationTimeoutError(f"automaton too large (> {self.max_states} NFA states)")
            if self.deadline is not None:
                self.deadline.check()
        return n - 1

    @property
    def n_states(self) -> int:
        return len(self.eps)

    # ------------------------------------------------------------------ construction
    def build(self, node: A.Node, s: int) -> int:
        """Add `node` starting at state s; return its end state (INF-free: -1 if the node is NOTHING)."""
        t = type(node)
        if t is A.Lit:
            cur = s
            for b in node.data:
                nxt = self.new()
                self.edges[cur].append((b, b, nxt))
                cur = nxt
            return cur
        if t is A.Bytes:
            e = self.new()
            for lo, hi in node.ranges:
                self.edges[s].append((lo, hi, e))
            return e
        if t is A.Chars:
            return self._build_chars(node.ranges, s)
        if t is A.Seq:
            cur = s
            for it in node.items:
                cur = self.build(it, cur)
                if cur < 0:
                    return -1
            return cur
        if t is A.Alt:
            if not node.items:
                return -1
            e = self.new()
            any_ok = False
            for it in node.items:
                end = self.build(it, s)
                if end >= 0:
                    self.eps[end].append(e)
                    any_ok = True
            return e if any_ok else -1
        if t is A.Rep:
            return self._build_rep(node, s)
        if t is A.Graph:
            return self._build_graph(node, s)
        if t is A.Members:
            g = object_members.members_to_graph(node)
            return -1 if A.is_nothing(g) else self._build_graph(g, s)
        raise TypeError(f"unknown regex node {node!r}")

    def _build_chars(self, ranges: A.Ranges, s: int) -> int:
        if not ranges:
            return -1
        e = self.new()
        # share prefixes between the UTF-8 sequences (a small byte trie)
        trie: dict[tuple, int] = {}
        for sq in utf8_sequences(ranges):
            cur = s
            for k, (lo, hi) in enumerate(sq):
                if k == len(sq) - 1:
                    self.edges[cur].append((lo, hi, e))
                else:
                    key = (cur, lo, hi)
                    nxt = trie.get(key)
                    if nxt is None:
                        nxt = self.new()
                        trie[key] = nxt
                        self.edges[cur].append((lo, hi, nxt))
                    cur = nxt
        return e

    def _build_rep(self, node: A.Rep, s: int) -> int:
        item, lo, hi = node.item, node.lo, node.hi
        cur = s
        for _ in range(lo):
            cur = self.build(item, cur)
            if cur < 0:
                return -1
        if hi is None:
            loop = self.new()
            self.eps[cur].append(loop)
            inner = self.new()
            self.eps[loop].append(inner)
            end = self.build(item, inner)
            if end >= 0:
                self.eps[end].append(loop)
            out = self.new()
            self.eps[loop].append(out)
            return out
        if hi == lo:
            return cur
        out = self.new()
        for _ in range(hi - lo):
            self.eps[cur].append(out)
            nxt_start = self.new()
            self.eps[cur].append(nxt_start)
            cur = self.build(item, nxt_start)
            if cur < 0:
                return out
        self.eps[cur].append(out)
        return out

    def _build_graph(self, g: A.Graph, s: int) -> int:
        ids = [self.new() for _ in range(g.n)]
        self.eps[s].append(ids[g.start])
        for u, lab, v in g.edges:
            if lab is None:
                self.eps[ids[u]].append(ids[v])
                continue
            st = self.new()
            self.eps[ids[u]].append(st)
            end = self.build(lab, st)
            if end >= 0:
                self.eps[end].append(ids[v])
        if not g.finals:
            return -1
        e = self.new()
        for f in g.finals:
            self.eps[ids[f]].append(e)
        return e

    # ------------------------------------------------------------------ analysis
    def distances(self) -> list[int]:
        """Minimal number of bytes from each state to the final state (INF if none)."""
        if self._dist is not None:
            return self._dist
        n = len(self.eps)
        rev_eps: list[list[int]] = [[] for _ in range(n)]
        rev_byte: list[list[int]] = [[] for _ in range(n)]
        for q in range(n):
            for r in self.eps[q]:
                rev_eps[r].append(q)
            for _, _, r in self.edges[q]:
                rev_byte[r].append(q)
        dist = [INF] * n
        if self.final >= 0:
            dist[self.final] = 0
            dq = deque([self.final])
            while dq:
                q = dq.popleft()
                d = dist[q]
                for p in rev_eps[q]:
                    if dist[p] > d:
                        dist[p] = d
                        dq.appendleft(p)
                for p in rev_byte[q]:
                    if dist[p] > d + 1:
                        dist[p] = d + 1
                        dq.append(p)
        self._dist = dist
        return dist


def build_nfa(node: A.Node, deadline: Deadline | None = None, max_states: int = 2_000_000) -> NFA:
    nfa = NFA(deadline, max_states)
    end = nfa.build(node, nfa.start)
    nfa.final = end  # -1: empty language
    return nfa
