"""A proof that a compiled grammar accepts no text, for grammars whose concrete completion search failed.

The lexer's emitted type sequences form a regular language: its states are the lexer states right after a
lexeme boundary (plus START and the end of text), with an edge per lexeme type (ignored lexemes: epsilon).
The context-free grammar (a superset of what the LALR table with its conflict resolution accepts) is
intersected with it: which nonterminal derives a type string between which two boundary states, to a
fixpoint. When the start rule derives nothing from START to the end of text, no text is accepted.
"""
from __future__ import annotations

import numpy as np

from .frontend import GrammarSpec
from .lexer import DEAD, START, Lexer

# (u, type or -1 for epsilon, v): an edge of the boundary graph; v = -1 is the end of text
Edge = tuple[int, int, int]


class _TooLarge(Exception):
    """The boundary graph outgrew its node or visit bound: the proof is abandoned (it proves nothing)."""


def proves_empty(spec: GrammarSpec, lexer: Lexer, max_nodes: int = 512, max_visits: int = 2_000_000) -> bool:
    """True when the grammar provably accepts no text (False proves nothing: also when a bound is hit)."""
    try:
        n_nodes, edges = _boundary_graph(lexer, max_nodes, max_visits)
    except _TooLarge:
        return False
    end = n_nodes  # the end-of-text node
    eps, by_type = _type_relations(n_nodes + 1, edges)
    derives = _derivations(spec, eps, by_type)
    return not bool(derives[spec.nt_names.index(spec.start)][0, end])


def _boundary_graph(lexer: Lexer, max_nodes: int, max_visits: int) -> tuple[int, list[Edge]]:
    """The lexer's type language as a graph over boundary states (node 0 is START)."""
    nodes = [START]
    index = {START: 0}
    edges: list[Edge] = []
    visits = 0
    k = 0
    while k < len(nodes):
        u = nodes[k]
        if u == START:
            edges.append((k, -1, -1))  # the empty text
        seen = {u}
        stack = [u]
        while stack:  # the states one lexeme reaches from boundary u, and the boundaries after them
            x = stack.pop()
            visits += 1
            if visits > max_visits:
                raise _TooLarge
            if x != START:
                et = lexer.lexeme_type(x)
                if et >= -1:
                    edges.append((k, et, -1))
            lexer.expand(x)
            for y, e in set(zip(lexer.T[x].tolist(), lexer.E[x].tolist())):
                if y == DEAD:
                    continue
                if e == -1:
                    if y not in seen:
                        seen.add(y)
                        stack.append(y)
                    continue
                v = index.get(y)
                if v is None:
                    if len(nodes) >= max_nodes:
                        raise _TooLarge
                    v = index[y] = len(nodes)
                    nodes.append(y)
                edges.append((k, e if e >= 0 else -1, v))
        k += 1
    return len(nodes), edges


def _bool_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32) @ b.astype(np.float32)) > 0


def _type_relations(n: int, edges: list[Edge]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """(eps, by_type): eps[u, v] when ignored lexemes alone lead from u to v (reflexive-transitive);
    by_type[t][u, v] when one lexeme of type t, with ignored lexemes around it, leads from u to v."""
    end = n - 1
    eps = np.eye(n, dtype=bool)
    single: dict[int, np.ndarray] = {}
    for u, t, v in edges:
        v = end if v < 0 else v
        if t == -1:
            eps[u, v] = True
        else:
            single.setdefault(t, np.zeros((n, n), dtype=bool))[u, v] = True
    for _ in range(n):  # reflexive-transitive closure
        nxt = _bool_matmul(eps, eps)
        if (nxt == eps).all():
            break
        eps = nxt
    return eps, {t: _bool_matmul(_bool_matmul(eps, m), eps) for t, m in single.items()}


def _derivations(spec: GrammarSpec, eps: np.ndarray, by_type: dict[int, np.ndarray]) -> list[np.ndarray]:
    """Per nonterminal, the boundary pairs (u, v) between which it derives a type string (least fixpoint)."""
    zero = np.zeros_like(eps)
    derives = [zero.copy() for _ in spec.nt_names]
    changed = True
    while changed:
        changed = False
        for lhs, rhs in spec.rules:
            prod = eps
            for is_t, x in rhs:
                m = by_type.get(x, zero) if is_t else derives[x]
                if not m.any():
                    prod = zero
                    break
                prod = _bool_matmul(prod, m)
            new = derives[lhs] | prod
            if (new != derives[lhs]).any():
                derives[lhs] = new
                changed = True
    return derives
