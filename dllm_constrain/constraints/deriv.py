"""Lazy byte-level DFA by Brzozowski derivatives over hash-consed terms.

Why not Thompson + subset construction (nfa.py / dfa.py): a big JSON Schema unrolls into a regex whose
NFA has up to millions of states, all built eagerly. Here a regex is a DAG of interned terms; a DFA
state *is* a term (the language still to be matched), and its transitions are the derivatives w.r.t.
each byte class, computed only when the state is visited. The derivative of `Seq(head, rest)` rewrites
only the head and shares `rest` by pointer, so visiting a state costs time proportional to the part of
the regex at the current position, not to the whole schema. Alternations are normalised (flattened,
deduplicated, sorted: ACI), which keeps the set of derivatives finite.

The interface matches `dfa.LazyDFA` (T, expanded, accepting, dist, expand, ensure_rows; step, walk and
matches shared through byte_dfa.LazyByteDFA): state 0 is DEAD (every term with an empty language maps there),
state 1 the start.
`dist[s]` is the length in bytes of the shortest accepted continuation (minimal word length of the term).
"""
from __future__ import annotations

import numpy as np

from ..errors import CompilationTimeoutError
from . import regex_ast as A
from .bounds import INF
from .byte_dfa import DEAD, START, LazyByteDFA
from .deadline import Deadline, check_active
from .deriv_terms import T_EMPTY, T_NOTHING, MembersTerms, Terms
from .native_terms import new_terms

# Bytes charged per DFA state's entries (term_of, state_of) beyond its table row
STATE_ENTRY_BYTES = 120

__all__ = ["DEAD", "START", "DerivDFA", "MembersTerms", "T_EMPTY", "T_NOTHING", "Terms"]


class DerivDFA(LazyByteDFA):
    """Lazy DFA whose states are derivative terms (see module docstring)."""

    def __init__(self, node: A.Node | None = None, deadline: Deadline | None = None, max_states: int = 500_000,
                 terms: Terms | None = None, start_term: int | None = None):
        self.terms = terms if terms is not None else new_terms(deadline)
        self.deadline = deadline
        self.terms.deadline = deadline
        self.max_states = max_states
        st = start_term if start_term is not None else self.terms.from_ast(node)
        cap = 64
        self.T = np.zeros((cap, 256), dtype=np.int32)
        self.expanded = np.zeros(cap, dtype=bool)
        self.accepting = np.zeros(cap, dtype=bool)
        self.dist = np.zeros(cap, dtype=np.int64)
        self.term_of: list[int] = []
        self.state_of: dict[int, int] = {}
        self._add(T_NOTHING)
        self.expanded[DEAD] = True
        self.dist[DEAD] = INF
        if self.terms.minlen(st) >= INF:
            self._add(-1)  # empty language: a start state that behaves like DEAD
            self.expanded[START] = True
            self.dist[START] = INF
            self.accepting[START] = False
            self._empty = True
        else:
            self._add(st)
            self._empty = False

    def memory_bytes(self) -> int:
        """An estimate of the memory this DFA holds: its tables, its states' entries, and its interned derivative
        terms (`Terms.memory_bytes`). It grows as states are expanded."""
        tables = self.T.nbytes + self.expanded.nbytes + self.accepting.nbytes + self.dist.nbytes
        return tables + STATE_ENTRY_BYTES * len(self.term_of) + self.terms.memory_bytes()

    @property
    def n_states(self) -> int:
        return len(self.term_of)

    @property
    def empty_language(self) -> bool:
        return self._empty

    def _grow(self, need: int) -> None:
        """Make room for state ids < need. All-or-nothing: the new tables are allocated and filled first and
        swapped in by one statement, so an exception here (a deadline, MemoryError) leaves the old tables
        whole and of equal lengths (the automaton is shared by every request of its compiled constraint)."""
        cap = self.T.shape[0]
        if need <= cap:
            return
        new_cap = max(need, cap * 2)
        T = np.zeros((new_cap, 256), dtype=np.int32)
        expanded = np.zeros(new_cap, dtype=bool)
        accepting = np.zeros(new_cap, dtype=bool)
        dist = np.zeros(new_cap, dtype=np.int64)
        T[:cap] = self.T
        expanded[:cap] = self.expanded
        accepting[:cap] = self.accepting
        dist[:cap] = self.dist
        self.T, self.expanded, self.accepting, self.dist = T, expanded, accepting, dist

    def _add(self, t: int) -> int:
        """Add the state of term t. Everything that can fail (the term's properties, the size bound, growing
        the tables) happens before the state becomes visible; the state exists from the append to term_of on
        (n_states), with its row fields already written, so an interrupted call adds nothing."""
        sid = len(self.term_of)
        if sid > self.max_states:
            raise CompilationTimeoutError(f"automaton too large (> {self.max_states} DFA states)")
        acc, dist = (self.terms.nullable(t), self.terms.minlen(t)) if t >= 0 else (False, INF)
        self._grow(sid + 1)
        self.T[sid] = 0
        self.expanded[sid] = False
        self.accepting[sid] = acc
        self.dist[sid] = dist
        self.term_of.append(t)
        if t >= 0:
            self.state_of[t] = sid
        return sid

    def state_for(self, t: int) -> int:
        sid = self.state_of.get(t)
        if sid is not None:
            return sid
        if t == T_NOTHING or self.terms.minlen(t) >= INF:
            self.state_of[t] = DEAD
            return DEAD
        return self._add(t)

    def expand(self, sid: int) -> None:
        """Compute the row of state sid. The row is built aside and written, then marked expanded, only when
        complete: a deadline firing in the middle leaves sid unexpanded (and any state added on the way is a
        complete, unexpanded state), so a later call simply redoes it."""
        if self.expanded[sid]:
            return
        if self.deadline is not None:
            self.deadline.check()
        check_active(sid)  # a request's call deadline (canvas masks, min_tokens): before anything is built
        row = np.zeros(256, dtype=np.int32)
        for lo, hi, d in self.terms.classes(self.term_of[sid]):  # bytes not listed lead to DEAD (0)
            row[lo:hi] = self.state_for(d)
        # _add may have reallocated the tables meanwhile: write into the current ones
        self.T[sid] = row
        self.expanded[sid] = True

    def ensure_rows(self, ids: np.ndarray) -> None:
        if ids.size == 0:
            return
        exp = self.expanded
        if exp[ids].all():
            return
        for s in np.unique(ids[~exp[ids]]).tolist():
            self.expand(s)
