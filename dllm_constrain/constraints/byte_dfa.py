"""What the two lazy byte DFAs share (deriv.DerivDFA by derivatives, dfa.LazyDFA by subset construction).

Both keep a transition table `T` [capacity, 256] whose row s is filled on demand by `expand(s)`
(`expanded[s]` says whether it is), plus per-state `accepting` and `dist` arrays; state 0 is DEAD
(absorbing, no continuation is accepted) and state 1 the start. Walking bytes through such a table is
the same code for both, so it lives here.
"""
from __future__ import annotations

import numpy as np

DEAD = 0
START = 1


class LazyByteDFA:
    """Byte walks over a lazily expanded transition table (subclasses provide the table and `expand`)."""

    T: np.ndarray
    expanded: np.ndarray
    accepting: np.ndarray

    def expand(self, sid: int) -> None:
        raise NotImplementedError

    def step(self, s: int, b: int) -> int:
        if not self.expanded[s]:
            self.expand(s)
        return int(self.T[s, b])

    def walk(self, s: int, data: bytes) -> int:
        T = self.T
        for b in data:
            if s == DEAD:
                return DEAD
            if not self.expanded[s]:
                self.expand(s)
                T = self.T  # (expanding may have grown the table)
            s = int(T[s, b])
        return s

    def matches(self, data: bytes) -> bool:
        s = self.walk(START, data)
        return bool(self.accepting[s]) if s != DEAD else False


__all__ = ["DEAD", "START", "LazyByteDFA"]
