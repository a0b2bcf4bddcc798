"""The automata's infinity: the length, distance or cost of something that cannot be reached.

Every shortest-continuation table (NFA/DFA `dist`, derivative `minlen`, LR completion costs, canvas fit
checks) uses the same finite sentinel so that sums of two of them stay exact integers and comparisons
`>= INF` mean "no completion". `ConstraintTooLongError.NO_OUTPUT` equals it.
"""
from __future__ import annotations

INF = 1 << 30

__all__ = ["INF"]
