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


ALL_BYTES = (1 << 256) - 1


def product(nodes: list[A.Node], negate: list[bool] | None = None, deadline: Deadline | None = None,
            limit: int = 20000) -> A.Node:
    """Language of strings in every L(nodes[i]) (or NOT in it where negate[i]). At least one operand
    must be positive (it bounds the universe).

    Each operand state's bytes are grouped by target once (`_classes`: target -> a 256-bit mask of bytes), so a
    product state's edges are the non-empty intersections of its operands' classes: a few integer ANDs per state
    instead of a pass over the 256 bytes. Edges leave a state in the order of their lowest byte."""
    negate = negate or [False] * len(nodes)
    assert not all(negate)
    dfas = [_dfa(n, deadline) for n in nodes]
    classes: list[dict[int, tuple[tuple[int, int], ...]]] = [{} for _ in dfas]
    labels: dict[int, A.Node] = {}
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
        acc = True
        for d, s, neg in zip(dfas, st, negate):
            a = bool(d.accepting[s]) if s != DEAD else False
            if a == neg:
                acc = False
        if acc:
            finals.append(i)
        groups: list[tuple[tuple[int, ...], int]] = [((), ALL_BYTES)]
        for d, s, neg, memo in zip(dfas, st, negate, classes):
            by_target = memo.get(s)
            if by_target is None:
                by_target = memo[s] = _classes(d, s)
            groups = [(tgt + (t,), both) for tgt, m in groups for t, mm in by_target
                      if (neg or t != DEAD) and (both := m & mm)]
        groups.sort(key=lambda g: g[1] & -g[1])
        for tgt, mask in groups:
            j = index.get(tgt)
            if j is None:
                j = len(order)
                if j > limit:
                    raise TooLarge(f"intersection exceeds {limit} states")
                index[tgt] = j
                order.append(tgt)
            label = labels.get(mask)
            if label is None:
                label = labels[mask] = A.Bytes(_mask_ranges(mask))
            edges.append((i, label, j))
        i += 1
    if not finals:
        return A.NOTHING
    return _prune(len(order), 0, finals, edges)


def _classes(d: DerivDFA, s: int) -> tuple[tuple[int, int], ...]:
    """State `s`'s bytes grouped by target state: (target, mask of its bytes); DEAD takes every byte."""
    if s == DEAD:
        return ((DEAD, ALL_BYTES),)
    d.expand(s)
    row = d.T[s]
    targets = np.unique(row)
    if len(targets) <= 16:  # the usual case: a few targets, one packed comparison each
        return tuple((int(t), int.from_bytes(np.packbits(row == t, bitorder="little").tobytes(), "little"))
                     for t in targets)
    masks: dict[int, int] = {}
    for b, t in enumerate(row.tolist()):
        masks[t] = masks.get(t, 0) | (1 << b)
    return tuple(masks.items())


def _mask_ranges(mask: int) -> A.Ranges:
    """The byte ranges of a 256-bit mask, ascending."""
    out = []
    b = 0
    while mask:
        low = (mask & -mask).bit_length() - 1  # the next set bit
        mask >>= low
        b += low
        run = (~mask & (mask + 1)).bit_length() - 1  # the number of set bits from here
        out.append((b, b + run - 1))
        mask >>= run
        b += run
    return tuple(out)


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
