"""The approximate forward and backward sets of a grammar canvas (right of the exactly parsed frontier).

Right of the frontier f a `GrammarCanvasState` tracks each position with the regular over-approximation of
approx.py: forward sets F[i] of approximate states from the frontier's state, backward sets B[i] of the states
from which the rest of the canvas (its committed tokens, its length, the EOS tail) is still reachable. A set larger
than `set_cap`, or one that would need more cold vocabulary walks than the call allows, becomes TOP (None:
everything), so masks there are sound but loose. `GrammarSets` is the part of the canvas state that computes them
(memoised per state); `Analysis` is one canvas's result. The loops check the active call deadline (deadline.py);
a set is memoised only once complete, so a call interrupted there leaves the memos whole.
"""
from __future__ import annotations

from ..bounds import INF
from ..deadline import check_active

ENDED = -1  # the approximate state "an EOS has been emitted"


class Analysis:
    """One canvas's sets: frontier f and its exact config, e_star (first committed EOS or n), last_text (last
    committed text position before e_star, or -1), F / B (frozensets of approximate states, None = TOP) up to the
    horizon H, and valid (False when the committed tokens cannot be part of any sentence)."""

    __slots__ = ("c", "f", "cfg", "e_star", "last_text", "F", "B", "H", "valid")

    def __init__(self) -> None:
        self.valid = True


def in_backward(B: list, i: int, a: int) -> bool:
    """Approximate state a is in B[i] (past the horizon, or where B[i] is TOP, every state is)."""
    if i >= len(B):
        return True
    b = B[i]
    return b is None or a in b


class GrammarSets:
    """The approximate-set half of `GrammarCanvasState` (it provides cg, approx, n, eos, set_cap, the memo dicts
    and `_structure` / `_prefix`)."""

    def _step_open(self, F):
        if F is None:
            return None
        r = self._open_memo.get(F)
        if r is not None or F in self._open_memo:
            return r
        ap = self.approx
        out: set[int] = set()
        ended = False
        for a in F:
            if a == ENDED:
                ended = True
                continue
            check_active(None, "computing the forward sets of the open positions")
            if not self._warm(a // ap.P):
                return None  # not worth a cold vocabulary walk now: TOP (sound); not memoised
            out |= ap.succ(a)
            if not ended and ap.accepting(a):
                ended = True
            if len(out) > self.set_cap:
                self._open_memo[F] = None
                return None
        if ended:
            out.add(ENDED)
        r = frozenset(out)
        self._open_memo[F] = r
        return r

    def _step_tok(self, F, t: int):
        if F is not None:
            k = (F, t)
            r = self._tok_memo.get(k)
            if r is None:
                r = self._step_tok_uncached(F, t)
                if len(self._tok_memo) > 8192:
                    self._tok_memo.clear()
                self._tok_memo[k] = r
            return r
        return self._step_tok_uncached(F, t)

    def _step_tok_uncached(self, F, t: int):
        ap = self.approx
        if t == self.eos:
            if F is None:
                return frozenset({ENDED})
            return frozenset({ENDED}) if any(a == ENDED or ap.accepting(a) for a in F) else frozenset()
        if F is None:
            return None
        out = set()
        for a in F:
            if a == ENDED:
                continue
            b = ap.delta(a, t)
            if b >= 0:
                out.add(b)
        return frozenset(out)

    def can_finish(self, a: int, m: int) -> bool:
        """Approximate state a can reach the end within m tokens (a sound 'True' for large m)."""
        ap = self.approx
        if a == ENDED or ap.accepting(a):
            return True
        if m <= 0:
            return False
        if m >= 8:
            return True
        t = self._fin_true.get(a)
        if t is not None and t <= m:
            return True
        f = self._fin_false.get(a)
        if f is not None and f >= m:
            return False
        frontier = {a}
        seen = {a}
        ok = False
        for _k in range(m):
            nxt = set()
            check_active(None, "deciding whether a state can finish within %d tokens", m)
            for s in frontier:
                if not self._warm(s // ap.P):
                    return True  # undecided without a cold vocabulary walk: sound answer
                for u in ap.succ(s):
                    if u in seen:
                        continue
                    if ap.accepting(u):
                        ok = True
                        break
                    seen.add(u)
                    nxt.add(u)
                if ok:
                    break
            if ok or not nxt or len(seen) > 20000:
                ok = ok or len(seen) > 20000
                break
            frontier = nxt
        if ok:
            self._fin_true[a] = min(m, self._fin_true.get(a, INF))
        else:
            self._fin_false[a] = max(m, self._fin_false.get(a, -1))
        return ok

    def _analyze(self, c: tuple, horizon: int = 0) -> Analysis:
        an = self._an
        if an is not None and an.c == c and an.H >= min(self.n, horizon):
            return an
        an = Analysis()
        an.c = c
        ok, e_star, last = self._structure(c)
        an.e_star, an.last_text = e_star, last
        f, cfg = self._prefix(c)
        an.f, an.cfg = f, cfg
        if not ok or cfg is None:
            an.valid = False
            an.F = an.B = []
            an.H = self.n
            self._an = an
            return an
        n = self.n
        H = min(n, max(last + 1, horizon, f))
        for i in range(H, n):  # committed EOS after the horizon bound the tail: include it
            if c[i] is not None:
                H = max(H, i + 1)
        F: list = [None] * (H + 1)
        F[f] = frozenset({self.cg.approx_id(cfg)})
        for i in range(f, H):
            check_active(None, "computing the forward set at position %d", i + 1)
            F[i + 1] = self._step_open(F[i]) if c[i] is None else self._step_tok(F[i], c[i])
        B: list = [frozenset()] * (H + 1)
        rem = n - H
        if F[H] is None:
            B[H] = None
        else:
            B[H] = frozenset(a for a in F[H] if self.can_finish(a, rem))
        ap = self.approx
        for i in range(H - 1, f - 1, -1):
            check_active(None, "computing the backward set at position %d", i)
            nb = B[i + 1]
            Fi = F[i]
            if nb is None:
                B[i] = Fi
                continue
            if not nb:
                for j in range(f, i + 1):
                    B[j] = frozenset()
                break
            if Fi is None:
                B[i] = None
                continue
            ci = c[i]
            ended_ok = ENDED in nb
            if ci is None:
                bk = (Fi, nb)
                r = self._back_memo.get(bk)
                if r is None:
                    r = frozenset(a for a in Fi if (a == ENDED and ended_ok) or (
                        a != ENDED and ((ended_ok and ap.accepting(a)) or not ap.succ(a).isdisjoint(nb))))
                    if len(self._back_memo) > 4096:
                        self._back_memo.clear()
                    self._back_memo[bk] = r
                B[i] = r
            elif ci == self.eos:
                B[i] = frozenset(a for a in Fi if a == ENDED or ap.accepting(a)) if ended_ok else frozenset()
            else:
                B[i] = frozenset(a for a in Fi if a != ENDED and ap.delta(a, ci) in nb)
        an.F, an.B, an.H = F, B, H
        self._an = an
        return an

    def _warm(self, q: int) -> bool:
        """True if lexer state q is in this request's walked set or may join it now (`cold_walks` per call). The set
        is the request's own, not the lexer's cache of walks (which other requests fill): which rows turn TOP then
        depends on the request's canvases alone, the same with a cold or a warm cache."""
        if q in self._warmed:
            return True
        if self._cold_left > 0:
            self._cold_left -= 1
            self._warmed.add(q)
            return True
        return False

    _inB = staticmethod(in_backward)

