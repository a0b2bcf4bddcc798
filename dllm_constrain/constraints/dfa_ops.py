"""Eager operations on small byte DFAs: intersection and complement of regex ASTs.

Used where a JSON Schema needs a conjunction of regular languages on one string (pattern AND
minLength/maxLength, pattern AND format, several patterns, keys that must NOT match a pattern). The
operands are determinised completely (bounded by `limit` states, else UnsupportedSchemaError / timeout)
and the product is returned as a `Graph` node with byte-range edges, which embeds into any AST.
"""
from __future__ import annotations

import numpy as np

from ..errors import CompilationTimeoutError
from . import regex_ast as A
from .deadline import Deadline
from .deriv import DEAD, START, DerivDFA


class TooLarge(Exception):
    pass


def _dfa(node: A.Node, deadline: Deadline | None) -> DerivDFA:
    return DerivDFA(node, deadline)


def _ranges(bs: list[int]) -> A.Ranges:
    out = []
    for b in bs:
        if out and out[-1][1] == b - 1:
            out[-1][1] = b
        else:
            out.append([b, b])
    return tuple((lo, hi) for lo, hi in out)


def product(nodes: list[A.Node], negate: list[bool] | None = None, deadline: Deadline | None = None,
            limit: int = 20000) -> A.Node:
    """Language of strings in every L(nodes[i]) (or NOT in it where negate[i]). At least one operand
    must be positive (it bounds the universe)."""
    negate = negate or [False] * len(nodes)
    assert not all(negate)
    dfas = [_dfa(n, deadline) for n in nodes]
    k = len(dfas)
    start = tuple(START for _ in range(k))
    index = {start: 0}
    order = [start]
    edges: list[tuple[int, A.Node, int]] = []
    finals: list[int] = []
    i = 0
    while i < len(order):
        if deadline is not None and (i & 63) == 0:
            deadline.check()
        st = order[i]
        rows = []
        for d, s in zip(dfas, st):
            if s == DEAD:
                rows.append(np.zeros(256, dtype=np.int64))
            else:
                d.expand(s)
                rows.append(d.T[s].astype(np.int64))
        alive = np.ones(256, dtype=bool)
        for r, neg in zip(rows, negate):
            if not neg:
                alive &= r != DEAD
        acc = True
        for d, s, neg in zip(dfas, st, negate):
            a = bool(d.accepting[s]) if s != DEAD else False
            if a == neg:
                acc = False
        if acc:
            finals.append(i)
        groups: dict[tuple, list[int]] = {}
        cols = [r.tolist() for r in rows]
        for b in np.flatnonzero(alive).tolist():
            tgt = tuple(c[b] for c in cols)
            groups.setdefault(tgt, []).append(b)
        for tgt, bs in groups.items():
            j = index.get(tgt)
            if j is None:
                j = len(order)
                if j > limit:
                    raise TooLarge(f"intersection exceeds {limit} states")
                index[tgt] = j
                order.append(tgt)
            edges.append((i, A.Bytes(_ranges(bs)), j))
        i += 1
    if not finals:
        return A.NOTHING
    return _prune(len(order), 0, finals, edges)


def _prune(n: int, start: int, finals: list[int], edges: list) -> A.Node:
    """Drop states that cannot reach a final state."""
    rev: list[list[int]] = [[] for _ in range(n)]
    for u, _, v in edges:
        rev[v].append(u)
    live = set(finals)
    stack = list(finals)
    while stack:
        v = stack.pop()
        for u in rev[v]:
            if u not in live:
                live.add(u)
                stack.append(u)
    if start not in live:
        return A.NOTHING
    ids = {old: new for new, old in enumerate(sorted(live))}
    e2 = tuple((ids[u], lab, ids[v]) for u, lab, v in edges if u in live and v in live)
    return A.Graph(len(ids), ids[start], tuple(ids[f] for f in finals if f in live), e2)


def intersect(nodes: list[A.Node], deadline: Deadline | None = None, limit: int = 20000) -> A.Node:
    nodes = [n for n in nodes]
    if any(A.is_nothing(n) for n in nodes):
        return A.NOTHING
    if len(nodes) == 1:
        return nodes[0]
    return product(nodes, None, deadline, limit)


def difference(pos: A.Node, negs: list[A.Node], deadline: Deadline | None = None, limit: int = 20000) -> A.Node:
    if A.is_nothing(pos):
        return A.NOTHING
    negs = [n for n in negs if not A.is_nothing(n)]
    if not negs:
        return pos
    return product([pos] + negs, [False] + [True] * len(negs), deadline, limit)


__all__ = ["intersect", "difference", "product", "TooLarge", "CompilationTimeoutError"]
