"""The term algebra of the derivative DFA (deriv.py): hash-consed regex terms and their derivatives.

A term is an int id of an interned (kind, a, b, c) tuple; constructors normalise as they intern
(alternations flattened, deduplicated and sorted; sequences right-nested; nothing and empty absorbed), so
equal languages built the same way share one id and the derivatives of a term form a finite set. Per term
the algebra memoises what the DFA asks of a state: nullable, minimal word length, the byte cuts of its
first bytes, and the derivative by one byte.
"""
from __future__ import annotations

import heapq
import sys
from dataclasses import dataclass, field

from . import object_members as OM
from . import regex_ast as A
from .bounds import INF
from .deadline import Deadline, check_active
from .utf8 import utf8_sequences

# derivatives recurse along the head of nested sequences; deep schemas need more than the default
if sys.getrecursionlimit() < 20000:
    sys.setrecursionlimit(20000)

# term kinds
NOTHING_K, EMPTY_K, BYTES_K, LIT_K, CHARS_K, SEQ_K, ALT_K, REP_K, GAT_K, MEM_K = range(10)
T_NOTHING = 0
T_EMPTY = 1

AST_CHECK_EVERY = 256  # AST nodes converted between two deadline checks (about 0.1 ms of conversion)


# Memory estimate (bytes) behind `Terms.memory_bytes`, calibrated against the process's resident memory over
# compiles of distinct schemas (docs/measurements.md, "Compile cache memory"): per Python term (its tuple fields,
# intern entry and memos). The native store's are in native_terms.py.
PY_TERM_BYTES = 600

class Terms:
    """Interned terms: id -> (kind, a, b, c)."""

    @property
    def n_terms(self) -> int:
        """How many terms are interned (the store only grows: a measure of the memory it holds)."""
        return len(self.kind)

    def memory_bytes(self) -> int:
        """An estimate of the memory the interned terms and their memos hold."""
        return PY_TERM_BYTES * self.n_terms

    def __init__(self, deadline: Deadline | None = None):
        self.kind: list[int] = [NOTHING_K, EMPTY_K]
        self.a: list = [None, None]
        self.b: list = [None, None]
        self.c: list = [None, None]
        self.intern: dict = {}
        self._nullable: dict[int, bool] = {T_NOTHING: False, T_EMPTY: True}
        self._minlen: dict[int, int] = {T_NOTHING: INF, T_EMPTY: 0}
        self._seq_nest: dict[tuple[int, int], int] = {}  # seq(h, t) for a sequence h, see seq()
        self._deriv: dict[int, int] = {}  # (term << 8) | byte -> derivative (an int key hashes faster than a pair)
        self._cuts: dict[int, frozenset[int]] = {}
        self._first: dict[int, int] = {}
        self._chars_bytes: dict[int, int] = {}
        # graphs: per graph, (edges by node, finals, eps closure, expansion cache, dist)
        self.graphs: list[dict] = []
        # Members nodes: MEM(i, used, extra) is the state of self.members[i] after the entries in `used`
        # and `extra` additional members (clamped, see object_members.py)
        self.members: list[MembersTerms] = []
        self.deadline = deadline
        self._ast_memo: dict[int, tuple[A.Node, int]] = {}
        self._ast_converted = 0  # AST nodes converted: the deadline is checked every AST_CHECK_EVERY of them

    # ------------------------------------------------------------------ constructors
    def _mk(self, key: tuple, kind: int, a=None, b=None, c=None) -> int:
        t = self.intern.get(key)
        if t is None:
            # the term exists once `kind` has it (appended last); fields left by an interrupted call are dropped
            t = len(self.kind)
            if len(self.a) != t:  # `a` is appended first: any interrupted call left it longer
                del self.a[t:], self.b[t:], self.c[t:]
            self.a.append(a)
            self.b.append(b)
            self.c.append(c)
            self.kind.append(kind)
            self.intern[key] = t
            if (t & 4095) == 0:
                # after the term is complete: an expired deadline leaves nothing half-made
                if self.deadline is not None:
                    self.deadline.check()
                check_active()
        return t

    def bytes_(self, ranges: A.Ranges) -> int:
        if not ranges:
            return T_NOTHING
        return self._mk(("B", ranges), BYTES_K, ranges)

    def lit(self, data: bytes) -> int:
        if not data:
            return T_EMPTY
        return self._mk(("L", data), LIT_K, data)

    def chars(self, ranges: A.Ranges) -> int:
        if not ranges:
            return T_NOTHING
        if len(ranges) == 1 and ranges[0][1] < 0x80:
            return self.bytes_(ranges)
        return self._mk(("C", ranges), CHARS_K, ranges)

    def seq(self, h: int, t: int) -> int:
        if h == T_NOTHING or t == T_NOTHING:
            return T_NOTHING
        if h == T_EMPTY:
            return t
        if t == T_EMPTY:
            return h
        kind = self.kind
        if kind[h] == SEQ_K:
            # re-nesting a sequence head walks its whole chain: remembered, since derivatives rebuild the same
            # (chain, tail) pairs over and over (a repeated body's derivative is a chain before the repetition)
            key = (h, t)
            r = self._seq_nest.get(key)
            if r is None:
                r = self.seq(self.a[h], self.seq(self.b[h], t))
                self._seq_nest[key] = r
            return r
        if kind[h] == LIT_K and kind[t] == LIT_K:
            return self.lit(self.a[h] + self.a[t])
        if kind[h] == LIT_K and kind[t] == SEQ_K and kind[self.a[t]] == LIT_K:
            return self.seq(self.lit(self.a[h] + self.a[self.a[t]]), self.b[t])
        return self._mk(("S", h, t), SEQ_K, h, t)

    def seq_list(self, items: list[int]) -> int:
        r = T_EMPTY
        for x in reversed(items):
            r = self.seq(x, r)
            if r == T_NOTHING:
                return r
        return r

    def alt(self, items) -> int:
        kind = self.kind
        out: set[int] = set()
        byte_ranges: list = []
        for x in items:
            if x == T_NOTHING:
                continue
            k = kind[x]
            if k == ALT_K:
                for y in self.a[x]:
                    if kind[y] == BYTES_K:
                        byte_ranges.extend(self.a[y])
                    else:
                        out.add(y)
            elif k == BYTES_K:
                byte_ranges.extend(self.a[x])
            else:
                out.add(x)
        if byte_ranges:
            out.add(self.bytes_(A.norm_ranges(byte_ranges)))
        if not out:
            return T_NOTHING
        if len(out) == 1:
            return next(iter(out))
        tup = tuple(sorted(out))
        return self._mk(("A", tup), ALT_K, tup)

    def rep(self, x: int, lo: int, hi: int | None) -> int:
        if hi is not None and hi < lo:
            return T_NOTHING
        if hi == 0:
            return T_EMPTY
        if x == T_NOTHING:
            return T_EMPTY if lo == 0 else T_NOTHING
        if x == T_EMPTY:
            return T_EMPTY
        if lo == 1 and hi == 1:
            return x
        return self._mk(("R", x, lo, hi), REP_K, x, lo, hi)

    def gat(self, g: int, u: int) -> int:
        return self._mk(("G", g, u), GAT_K, g, u)

    def mem(self, i: int, used: int, tail: int) -> int:
        return self._mk(("M", i, used, tail), MEM_K, i, used, tail)

    # ------------------------------------------------------------------ from the regex AST
    def from_ast(self, node: A.Node) -> int:
        memo = self._ast_memo
        hit = memo.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        self._ast_converted += 1
        if not self._ast_converted % AST_CHECK_EVERY and self.deadline is not None:
            # a big schema's AST is tens of thousands of nodes (tens of ms): its time limit holds here too, and a
            # compilation beside the request loop pauses here (deadline.pausing); only whole nodes are memoised
            self.deadline.check()
        t = type(node)
        if t is A.Lit:
            r = self.lit(node.data)
        elif t is A.Bytes:
            r = self.bytes_(node.ranges)
        elif t is A.Chars:
            r = self.chars(node.ranges)
        elif t is A.Seq:
            r = self.seq_list([self.from_ast(x) for x in node.items])
        elif t is A.Alt:
            r = self.alt([self.from_ast(x) for x in node.items])
        elif t is A.Rep:
            r = self.rep(self.from_ast(node.item), node.lo, node.hi)
        elif t is A.Graph:
            r = self._graph(node)
        elif t is A.Members:
            r = self._members(node)
        else:
            raise TypeError(f"unknown regex node {node!r}")
        memo[id(node)] = (node, r)
        return r

    def _graph(self, g: A.Graph) -> int:
        if not g.finals:
            return T_NOTHING
        out: list[list[tuple[int, int]]] = [[] for _ in range(g.n)]
        eps: list[list[int]] = [[] for _ in range(g.n)]
        for u, lab, v in g.edges:
            if lab is None:
                eps[u].append(v)
                continue
            lt = self.from_ast(lab)
            if lt != T_NOTHING:
                out[u].append((lt, v))
        gi = len(self.graphs)  # after the labels: they may register nested graphs first
        self.graphs.append({"out": out, "eps": eps, "finals": frozenset(g.finals), "closure": {}, "exp": {},
                            "dist": None, "n": g.n})
        return self.gat(gi, g.start)

    def _members(self, m: A.Members) -> int:
        entries = tuple(self.from_ast(x) for x in m.entries)
        extras = tuple(x for x in (self.from_ast(x) for x in m.extras) if x != T_NOTHING)
        req = sum(1 << i for i, r in enumerate(m.required) if r)
        mi = len(self.members)  # after the entries: they may register nested members first
        self.members.append(MembersTerms(entries, req, extras, self.from_ast(m.sep), m.lo, m.hi, m.interleave))
        return self.mem(mi, 0, OM.START_EXTRA)

    def members_expansion(self, t: int) -> int:
        """MEM(i, used, extra) as an ordinary term: [sep] Alt(entry_j MEM(i, used+j, extra) for unused j,
        additional MEM(i, used, extra+1)) [+ EMPTY if the member list may close here]."""
        m = self.members[self.a[t]]
        used, tail = self.b[t], self.c[t]
        key = (used, tail)
        e = m.exp.get(key)
        if e is not None:
            return e
        items = []
        mi = self.a[t]
        if OM.can_add_entry(used, tail, m.hi):
            for j, kv in enumerate(m.entries):
                if not used >> j & 1:
                    items.append(self.seq(kv, self.mem(mi, used | (1 << j), tail)))
        nxt = OM.after_extra(used, tail, m.required_mask, m.lo, m.hi, m.interleave) if m.extras else None
        if nxt is not None:
            items.append(self.seq(self.alt(m.extras), self.mem(mi, *nxt)))
        e = self.alt(items)
        if OM.is_started(used, tail):
            e = self.seq(m.sep, e)
        if OM.can_close(used, tail, m.required_mask, m.lo):
            e = self.alt((e, T_EMPTY))
        m.exp[key] = e
        return e

    def _members_minlen(self, t: int) -> int:
        m = self.members[self.a[t]]
        if m.costs is None:  # all three computed before any is stored (m.costs set means all are)
            costs = [self.minlen(x) for x in m.entries]
            extra_cost = min((self.minlen(x) for x in m.extras), default=INF)
            sep_cost = self.minlen(m.sep)
            m.extra_cost, m.sep_cost, m.costs = extra_cost, sep_cost, costs
        return OM.shortest_completion(m.costs, m.required_mask, m.extra_cost, m.sep_cost, m.lo, m.hi,
                                      self.b[t], self.c[t])

    def _closure(self, g: dict, u: int) -> tuple[int, ...]:
        c = g["closure"].get(u)
        if c is None:
            seen = {u}
            stack = [u]
            eps = g["eps"]
            while stack:
                x = stack.pop()
                for y in eps[x]:
                    if y not in seen:
                        seen.add(y)
                        stack.append(y)
            c = tuple(sorted(seen))
            g["closure"][u] = c
        return c

    def expansion(self, t: int) -> int:
        """GAT(g, u) as an ordinary term: Alt(Seq(label, GAT(g, v))...) [+ EMPTY if final]."""
        g = self.graphs[self.a[t]]
        u = self.b[t]
        e = g["exp"].get(u)
        if e is not None:
            return e
        items = []
        fin = g["finals"]
        final = False
        for w in self._closure(g, u):
            if w in fin:
                final = True
            for lt, v in g["out"][w]:
                items.append(self.seq(lt, self.gat(self.a[t], v)))
        if final:
            items.append(T_EMPTY)
        e = self.alt(items)
        g["exp"][u] = e
        return e

    def chars_to_bytes(self, t: int) -> int:
        r = self._chars_bytes.get(t)
        if r is not None:
            return r
        r = self._utf8_term(self.a[t])
        self._chars_bytes[t] = r
        return r

    def _utf8_term(self, ranges: A.Ranges) -> int:
        """The code points in `ranges` as UTF-8 byte sequences, sharing common first bytes."""
        seqs = utf8_sequences(ranges)
        by_first: dict[tuple[int, int], list] = {}
        for sq in seqs:
            by_first.setdefault(sq[0], []).append(sq[1:])
        alts = []
        for first, rests in by_first.items():
            tails = [self.seq_list([self.bytes_(((lo, hi),)) for lo, hi in rest]) for rest in rests]
            alts.append(self.seq(self.bytes_((first,)), self.alt(tails)))
        return self.alt(alts)

    # ------------------------------------------------------------------ properties
    def nullable(self, t: int) -> bool:
        r = self._nullable.get(t)
        if r is not None:
            return r
        k = self.kind[t]
        if k in (BYTES_K, LIT_K, CHARS_K):
            r = False
        elif k == SEQ_K:
            r = self.nullable(self.a[t]) and self.nullable(self.b[t])
        elif k == ALT_K:
            r = any(self.nullable(x) for x in self.a[t])
        elif k == REP_K:
            r = self.b[t] == 0 or self.nullable(self.a[t])
        elif k == GAT_K:
            r = self._gat_nullable(t)
        elif k == MEM_K:
            r = self._mem_nullable(t)
        else:
            r = k == EMPTY_K
        self._nullable[t] = r
        return r

    def minlen(self, t: int) -> int:
        r = self._minlen.get(t)
        if r is not None:
            return r
        k = self.kind[t]
        if k == BYTES_K:
            r = 1
        elif k == LIT_K:
            r = len(self.a[t])
        elif k == CHARS_K:
            r = len(chr(self.a[t][0][0]).encode("utf-8"))
        elif k == SEQ_K:
            r = min(INF, self.minlen(self.a[t]) + self.minlen(self.b[t]))
        elif k == ALT_K:
            r = min(self.minlen(x) for x in self.a[t])
        elif k == REP_K:
            r = 0 if self.b[t] == 0 else min(INF, self.b[t] * self.minlen(self.a[t]))
        elif k == GAT_K:
            r = self._gat_minlen(t)
        elif k == MEM_K:
            r = self._members_minlen(t)
        else:
            r = INF if k == NOTHING_K else 0
        self._minlen[t] = r
        return r

    def _gat_nullable(self, t: int) -> bool:
        g = self.graphs[self.a[t]]
        return any(w in g["finals"] for w in self._closure(g, self.b[t]))

    def _gat_minlen(self, t: int) -> int:
        g = self.graphs[self.a[t]]
        if g["dist"] is None:
            self._graph_dist(g)
        return g["dist"][self.b[t]]

    def _mem_nullable(self, t: int) -> bool:
        m = self.members[self.a[t]]
        return OM.can_close(self.b[t], self.c[t], m.required_mask, m.lo)

    def shortest_first_byte(self, t: int, depth: int = 0) -> int | None:
        """The first byte of a shortest member of t, read off the terms (no derivative): -1 when t's shortest member
        is empty or t has none; None when undecided (a chain of members with empty steps deeper than 64, such as
        a loop of optional labels). Follows, at each alternative, the cheapest branch by `minlen`, so the byte
        starts a shortest member: deriv(t, byte) is one byte shorter (the caller checks it)."""
        r = self._first.get(t)
        if r is not None:
            return r
        if depth > 64:
            return None
        if self.minlen(t) == 0 or self.minlen(t) >= INF:
            r = -1
        else:
            k = self.kind[t]
            nxt = depth + 1
            if k == BYTES_K:
                r = self.a[t][0][0]
            elif k == LIT_K:
                r = self.a[t][0]
            elif k == CHARS_K:
                r = self.shortest_first_byte(self.chars_to_bytes(t), nxt)
            elif k == SEQ_K:
                h = self.a[t]
                r = self.shortest_first_byte(h if self.minlen(h) > 0 else self.b[t], nxt)
            elif k == ALT_K:
                r = self.shortest_first_byte(min(self.a[t], key=self.minlen), nxt)
            elif k == REP_K:
                r = self.shortest_first_byte(self.a[t], nxt)
            elif k == GAT_K:
                r = self.shortest_first_byte(self.expansion(t), nxt)
            elif k == MEM_K:
                r = self.shortest_first_byte(self.members_expansion(t), nxt)
            else:
                r = -1
        if r is not None:
            self._first[t] = r
        return r

    def _graph_dist(self, g: dict) -> None:
        n = g["n"]
        rev: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        for u in range(n):
            for v in g["eps"][u]:
                rev[v].append((u, 0))
            for lt, v in g["out"][u]:
                w = self.minlen(lt)
                if w < INF:
                    rev[v].append((u, w))
        dist = [INF] * n
        heap = []
        for f in g["finals"]:
            dist[f] = 0
            heap.append((0, f))
        heapq.heapify(heap)
        while heap:
            d, v = heapq.heappop(heap)
            if d > dist[v]:
                continue
            for u, w in rev[v]:
                nd = d + w
                if nd < dist[u]:
                    dist[u] = nd
                    heapq.heappush(heap, (nd, u))
        g["dist"] = dist

    def cuts(self, t: int) -> frozenset[int]:
        """Byte values where the derivative of t may change (class boundaries)."""
        r = self._cuts.get(t)
        if r is not None:
            return r
        k = self.kind[t]
        if k == BYTES_K:
            s = set()
            for lo, hi in self.a[t]:
                s.add(lo)
                s.add(hi + 1)
            r = frozenset(s)
        elif k == LIT_K:
            b = self.a[t][0]
            r = frozenset((b, b + 1))
        elif k == CHARS_K:
            r = self.cuts(self.chars_to_bytes(t))
        elif k == SEQ_K:
            h = self.a[t]
            r = self.cuts(h)
            if self.nullable(h):
                r = r | self.cuts(self.b[t])
        elif k == ALT_K:
            r = frozenset().union(*[self.cuts(x) for x in self.a[t]])
        elif k == REP_K:
            r = self.cuts(self.a[t])
        elif k == GAT_K:
            r = self.cuts(self.expansion(t))
        elif k == MEM_K:
            r = self.cuts(self.members_expansion(t))
        else:
            r = frozenset()
        self._cuts[t] = r
        return r

    def classes(self, t: int) -> list[tuple[int, int, int]]:
        """The row of t: [(lo, hi, derivative)] for the byte classes [lo, hi) whose derivative is not nothing (every
        other byte leads to the dead state)."""
        cuts = sorted(self.cuts(t) | {0, 256})
        out = []
        for lo, hi in zip(cuts, cuts[1:]):
            if lo < 256:
                d = self.deriv(t, lo)
                if d != T_NOTHING:
                    out.append((lo, hi, d))
        return out

    def deriv(self, t: int, byte: int) -> int:
        key = (t << 8) | byte
        r = self._deriv.get(key)
        if r is not None:
            return r
        k = self.kind[t]
        if k == BYTES_K:
            r = T_NOTHING
            for lo, hi in self.a[t]:
                if lo <= byte <= hi:
                    r = T_EMPTY
                    break
                if byte < lo:
                    break
        elif k == LIT_K:
            d = self.a[t]
            r = self.lit(d[1:]) if d[0] == byte else T_NOTHING
        elif k == CHARS_K:
            r = self.deriv(self.chars_to_bytes(t), byte)
        elif k == SEQ_K:
            h, tail = self.a[t], self.b[t]
            r = self.seq(self.deriv(h, byte), tail)
            if self.nullable(h):
                r2 = self.deriv(tail, byte)
                if r2 != T_NOTHING:
                    r = self.alt((r, r2))
        elif k == ALT_K:
            # the branches' derivatives are mostly remembered already: looked up here, without a call each
            memo = self._deriv
            ds = []
            for x in self.a[t]:
                d = memo.get((x << 8) | byte)
                if d is None:
                    d = self.deriv(x, byte)
                if d != T_NOTHING:
                    ds.append(d)
            r = self.alt(ds)
        elif k == REP_K:
            x, lo, hi = self.a[t], self.b[t], self.c[t]
            dx = self.deriv(x, byte)
            r = T_NOTHING if dx == T_NOTHING else self.seq(dx, self.rep(x, max(lo - 1, 0), None if hi is None else hi - 1))
        elif k == GAT_K:
            r = self.deriv(self.expansion(t), byte)
        elif k == MEM_K:
            r = self.deriv(self.members_expansion(t), byte)
        else:
            r = T_NOTHING
        self._deriv[key] = r
        return r


@dataclass
class MembersTerms:
    """A `regex_ast.Members` node as terms, with its per-state expansions and member costs."""

    entries: tuple[int, ...]
    required_mask: int
    extras: tuple[int, ...]
    sep: int
    lo: int
    hi: int | None
    interleave: bool
    exp: dict[tuple[int, int], int] = field(default_factory=dict)
    costs: list[int] | None = None
    extra_cost: int = INF
    sep_cost: int = 0
