"""The multiples n*k (n in a window) that pass python-jsonschema's float test for `multipleOf: k`, as a minimal
automaton over their canonical spellings.

The test is `int(q) == q` on q = float(x) / float(k) (ajv computes the same quotient), and it rounds:
0.07 / 0.01 is 7.000000000000001, so 0.07 fails, and 19.99 and 1234.56 fail too, while 999.99 passes. No
closed form says which; enumerating a window of multiples and testing each does. The set is far more
regular than it looks (the verdict follows the low digits within a binade): for 0.01 over [0, 1000] the
88,575 passing spellings make an automaton of 162 states. It is built without spelling each literal:
the quotients in numpy (x = N / 10^places is one correctly rounded division of two exact doubles, so it is
float(text)), then per integer part the set of passing fractions, and a hash-consed automaton over the
integer parts' digits and the fraction sets.
"""
from __future__ import annotations

import numpy as np

from . import regex_ast as A

_EXACT = 2 ** 53


class _Automaton:
    """States made unique by (final, edges): equal right languages share one state (a minimal DFA when
    built bottom-up)."""

    def __init__(self) -> None:
        self.states: list[tuple[bool, tuple[tuple[int, int], ...]]] = []
        self.register: dict[tuple, int] = {}

    def state(self, final: bool, edges: dict[int, int]) -> int:
        sig = (final, tuple(sorted(edges.items())))
        s = self.register.get(sig)
        if s is None:
            s = self.register[sig] = len(self.states)
            self.states.append(sig)
        return s

    def graph(self, start: int) -> A.Node:
        edges = []
        for src, (_, outs) in enumerate(self.states):
            by: dict[int, list[tuple[int, int]]] = {}
            for b, t in outs:
                by.setdefault(t, []).append((b, b))
            edges.extend((src, A.chars(rs), t) for t, rs in sorted(by.items()))
        finals = tuple(i for i, (f, _) in enumerate(self.states) if f)
        return A.Graph(len(self.states), start, finals, tuple(edges))


def float_test_multiples(a: int, places: int, fm: float, n0: int, n1: int) -> A.Node | None:
    """The canonical spellings of N / 10^places, N = n * a for n0 <= n <= n1, whose quotient by fm passes the
    float test; None when a quotient cannot be computed exactly this way (|N| >= 2^53, places > 22)."""
    if places > 22 or max(abs(n0), abs(n1)) * a >= _EXACT:
        return None
    big = np.arange(n0, n1 + 1, dtype=np.int64) * a
    with np.errstate(over="ignore", invalid="ignore"):
        q = (big.astype(np.float64) / float(10 ** places)) / fm
        ok = np.isfinite(q) & (q == np.trunc(q))
    big = big[ok]
    if not len(big):
        return A.NOTHING
    whole, frac = np.divmod(np.abs(big), 10 ** places)
    groups: dict[str, set[int]] = {}
    for w, f, neg in zip(whole.tolist(), frac.tolist(), (big < 0).tolist()):
        groups.setdefault(("-" if neg else "") + str(w), set()).add(f)
    auto = _Automaton()
    fractions: dict[frozenset, int] = {}
    memo: dict[tuple, int] = {}
    ends = {}
    for text, fs in groups.items():
        key = frozenset(fs)
        if key not in fractions:
            fractions[key] = _fraction_state(auto, key, places, memo)
        ends[text] = fractions[key]
    return auto.graph(_integer_state(auto, "", sorted(ends), ends))


def _fraction_state(auto: _Automaton, fs: frozenset, places: int, memo: dict) -> int:
    """After an integer part: final when its fraction 0 passes, "." then the nonzero fractions in fs."""
    rest = frozenset(f for f in fs if f)
    edges = {ord("."): _digits_state(auto, rest, places, memo)} if rest else {}
    return auto.state(0 in fs, edges)


def _digits_state(auto: _Automaton, rest: frozenset, width: int, memo: dict) -> int:
    """The fraction digits still to spell: `rest` holds their values in `width` digits; 0 ends the literal
    (no trailing zeros are spelled)."""
    key = (rest, width)
    s = memo.get(key)
    if s is None:
        unit = 10 ** (width - 1) if width else 0
        by: dict[int, set[int]] = {}
        for v in rest:
            if v:
                by.setdefault(v // unit, set()).add(v % unit)
        edges = {0x30 + d: _digits_state(auto, frozenset(vs), width - 1, memo) for d, vs in by.items()}
        s = memo[key] = auto.state(0 in rest, edges)
    return s


def _integer_state(auto: _Automaton, prefix: str, texts: list[str], ends: dict[str, int]) -> int:
    """The state after `prefix`: texts (sorted) are the integer parts that extend it."""
    by: dict[str, list[str]] = {}
    for t in texts:
        if len(t) > len(prefix):
            by.setdefault(t[len(prefix)], []).append(t)
    edges = {ord(c): _integer_state(auto, prefix + c, ts, ends) for c, ts in by.items()}
    final = False
    if prefix in ends:  # an integer part itself: its fraction state's finality and "." edge
        f_final, f_edges = auto.states[ends[prefix]]
        final = f_final
        edges.update(dict(f_edges))
    return auto.state(final, edges)
