"""The mask at the left frontier of a regular constraint's canvas, when the expansion budget cut a set.

At the left frontier f (every position before it committed, so F[f] is exact) B[f] and B[f+1] are decided by a
depth-first search for one completion of c[f+1:] per state (exact token transitions, first witness wins):

  FrontierSearch   one call's search: certified states, committed-token pruning, can-finish questions right of
                   the last commit, bounded by `question_states` / `call_states` (work, never time)
  FrontierMemo     proofs kept by position across calls while c[i:] is unchanged

Questions and children are taken in a canonical order (SetAlgebra.succ_canonical), so what a bound decides does not
depend on what was cached. docs/constraints.md, "The left frontier's search", has the argument.
"""
from __future__ import annotations

from collections.abc import Iterator

from .deadline import check_active
from .deriv import DEAD
from .set_algebra import ENDED, ENDED_BIT, SetAlgebra


def last_committed(c: tuple) -> int:
    """Index of the last committed (not None) position of canvas c, or -1. By bisection over "the tail from here is
    all open" (a C-level tuple comparison per probe): the open tail of a semi-autoregressive canvas is hundreds of
    positions, which a Python loop walked on every call."""
    n = len(c)
    if n == 0 or c[-1] is not None:
        return n - 1
    nones = (None,) * n
    lo, hi = -1, n - 1  # c[hi:] is all open; c[lo] is committed or lo == -1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if c[mid:] == nones[: n - mid]:
            hi = mid
        else:
            lo = mid
    return lo


def first_open(c: tuple) -> int | None:
    """Index of the first open (None) position of canvas c (the left frontier), or None when every position is
    committed (tuple.index: a C-level scan)."""
    try:
        return c.index(None)
    except ValueError:
        return None


class FrontierMemo:
    """Per-position memo of "state v before position i completes the canvas", kept from the previous call for the
    positions right of the last one that changed (the answer depends on c[i:] only)."""

    def __init__(self) -> None:
        self.canvas: tuple | None = None
        self.memo: dict[int, dict[int, bool]] = {}

    def for_canvas(self, c: tuple) -> dict[int, dict[int, bool]]:
        """The memo valid for canvas c (entries at or left of the last changed position dropped)."""
        prev, memo = self.canvas, self.memo
        if prev is None or len(prev) != len(c):
            memo = {}
        else:
            d = next((i for i in range(len(c) - 1, -1, -1) if prev[i] != c[i]), -1)
            if d >= 0:
                memo = {i: m for i, m in memo.items() if i > d}
        self.canvas = c
        self.memo = memo
        return memo


class FrontierSearch:
    """One exact frontier decision on canvas c (see the module docstring); `sets(F_f, f)` is the answer.

    B, H: the call's (budgeted) backward sets and their horizon; memo: `FrontierMemo.for_canvas(c)`."""

    def __init__(self, alg: SetAlgebra, n: int, c: tuple, B: list[int], H: int,
                 memo: dict[int, dict[int, bool]], finish_states: int | None = None,
                 question_states: int | None = None, call_states: int | None = None) -> None:
        self.alg = alg
        self.ta = alg.ta
        self.dfa = alg.dfa  # its arrays are reallocated as it grows: read dfa.accepting / dfa.dist at each use
        self.n, self.eos = n, alg.eos
        self.c, self.B, self.H = c, B, H
        self.J = last_committed(c)
        eos_tail = [True] * (n + 2)  # eos_tail[i]: every committed position >= i holds EOS
        for i in range(n - 1, -1, -1):
            eos_tail[i] = eos_tail[i + 1] and (c[i] is None or c[i] == self.eos)
        self.eos_tail = eos_tail
        self.memo = memo
        self.visits = 0
        # right of the last committed position: can-finish by SetAlgebra.finish_bounded within this many states
        # (None: exactly, finish3); a state it leaves undecided counts as not completing (sound), `undecided` says so
        self.finish_states = finish_states
        self.undecided = 0
        # (position, state) pairs found without a completion while some state was left undecided: no proof, so not
        # memoised across calls (the memo holds proofs only), but not explored twice in this search
        self.failed: set[tuple[int, int]] = set()
        # bounded mode (question_states set): each question of `sets` visits at most question_states states, the
        # call at most call_states in all, in the canonical order (SetAlgebra.succ_canonical); a question the bound
        # stops is undecided (left out: sound). The memo given is then the bounded searches' own (proofs they found),
        # never the exact search's, whose contents follow the automaton's cache through its search order.
        self.question_states = question_states
        self.call_left = call_states

    def quick(self, v: int, i: int) -> bool | None:
        """Whether state v before position i completes the canvas, when known without searching (else None)."""
        if v == ENDED:
            return self.eos_tail[i]
        accepting = self.dfa.accepting
        if i >= self.n:
            return bool(accepting[v])
        if i <= self.H and (self.B[i] >> v) & 1:
            return True
        m = self.memo.get(i)
        if m is not None:
            r = m.get(v)
            if r is not None:
                return r
        if (i, v) in self.failed:
            self.undecided += 1  # what it answers is no proof either
            return False
        if i > self.J:
            if self.finish_states is None:
                r = self.alg.finish3(v, self.n - i)
            else:
                if self.call_left is not None and self.call_left <= 0:
                    self.undecided += 1
                    return False  # the call's allowance is spent: left out (sound)
                r, spent = self.alg.finish_bounded_spent(v, self.n - i, self.finish_states)
                if self.call_left is not None:
                    self.call_left -= spent  # what the search expands, whether or not it was memoised
                if r is None:
                    self.undecided += 1
                    return False  # left out (sound); not memoised: not a proof
            self.memo.setdefault(i, {})[v] = r
            return r
        ci = self.c[i]
        if ci is None:
            if accepting[v] and self.eos_tail[i + 1]:
                return True
        elif ci == self.eos:
            return bool(accepting[v]) and self.eos_tail[i + 1]
        return None

    def children(self, v: int, i: int) -> list[int]:
        """The states position i can take v to, in search order (a certified one alone when there is one)."""
        c, ta, B = self.c, self.ta, self.B
        ci = c[i]
        if ci is not None:
            w = ta.delta(v, ci)
            return [] if w == DEAD else [w]
        sb = ta.trans(v).succ_bits
        if i + 1 <= self.H and sb & B[i + 1]:
            return [(sb & B[i + 1]).bit_length() - 1]  # certified
        m = self.memo.get(i + 1)
        bounded = self.question_states is not None
        ws = self.alg.succ_canonical(v) if bounded else self.alg.members(sb)
        if m:
            hit = next((w for w in ws if m.get(w) is True), None)
            if hit is not None:
                return [hit]
        nxt = c[i + 1] if i + 1 < self.n else None
        dfa = self.dfa
        if nxt is not None:
            if nxt == self.eos:
                ws = [w for w in ws if dfa.accepting[w]]
            else:
                ws = [w for w in ws if ta.delta(w, nxt) != DEAD]
        if bounded:
            return ws  # already nearest to acceptance first, in an order independent of the state numbering
        # states whose transitions are known first (no trie walk to look further), then nearest to acceptance
        known = ta.succ_bits
        return sorted(ws, key=lambda w: (w not in known, int(dfa.dist[w])))

    def good(self, v0: int, i0: int) -> bool | None:
        """Whether state v0 before position i0 completes the canvas: depth first, stopping at the first witness
        (None in bounded mode when the question's allowance ran out first)."""
        r = self.quick(v0, i0)
        if r is not None:
            return r
        left = None
        if self.question_states is not None:
            # every state expanded before an open position counts (its children need its token transitions; before
            # a committed one a single token step), v0 included
            left = self.question_states if self.call_left is None else min(self.question_states, self.call_left)
            if i0 < self.n and self.c[i0] is None:
                if left <= 0:
                    self.undecided += 1
                    return None
                left -= 1
                if self.call_left is not None:
                    self.call_left -= 1
        memo = self.memo
        # each frame: (state, position, its children left, `undecided` when it was entered): a refutation is a proof
        # (memoised) unless its subtree met an undecided state
        stack: list[tuple[int, int, Iterator[int], int]] = [(v0, i0, iter(self.children(v0, i0)), self.undecided)]
        while stack:
            v, i, it, u0 = stack[-1]
            res = None
            for w in it:
                r = self.quick(w, i + 1)
                if r is True:
                    res = True
                    break
                if r is None:
                    if left is not None and self.c[i + 1] is None:  # its children need its token transitions
                        if left <= 0:
                            self.undecided += 1
                            return None  # the allowance ran out: no proof either way (nothing memoised)
                        left -= 1
                        if self.call_left is not None:
                            self.call_left -= 1
                    self.visits += 1
                    if not self.visits & 63:
                        check_active(w, "deciding the left frontier's mask exactly")
                    stack.append((w, i + 1, iter(self.children(w, i + 1)), self.undecided))
                    break
            else:
                res = False
            if res is None:
                continue  # descended
            if res:
                for u, k, _, _ in stack:
                    memo.setdefault(k, {})[u] = True
                return True
            if self.undecided > u0:
                self.failed.add((i, v))  # a refutation that met an undecided state is not one
            else:
                memo.setdefault(i, {})[v] = False
            stack.pop()
        return False

    def sets(self, F_f: int, f: int, first_only: bool = False) -> tuple[int, int]:
        """Exact (B[f], B[f+1]) from the exact forward set F_f = F[f] at the left frontier f (in bounded mode
        without what the allowance left undecided). first_only: stop at the first state of B[f+1] that needs a search
        (with the certified ones and EOS: a sound row, empty only when the exact one is)."""
        alg, ta, B, eos_tail = self.alg, self.ta, self.B, self.eos_tail
        bi = bn = 0
        for q in alg.members(F_f):
            if q == ENDED:
                if eos_tail[f]:
                    bi |= ENDED_BIT
                    bn |= ENDED_BIT
                continue
            sb = ta.trans(q).succ_bits
            ok = False
            if self.dfa.accepting[q] and eos_tail[f + 1]:
                bn |= ENDED_BIT
                ok = True
            cert = sb & B[f + 1] if f + 1 <= self.H else 0
            if cert:
                bn |= cert
                ok = True
            rest = sb & ~cert
            # bounded mode: the questions in the canonical order, since what one proves (memoised) and spends (the
            # call's allowance) enters the next ones
            ws = alg.members(rest) if self.question_states is None else \
                [w for w in alg.succ_canonical(q) if (rest >> w) & 1]
            for w in ws:
                if not (bn >> w) & 1 and self.good(w, f + 1):
                    bn |= 1 << w
                    ok = True
                    if first_only:
                        break
            if ok:
                bi |= 1 << q
        return bi, bn
