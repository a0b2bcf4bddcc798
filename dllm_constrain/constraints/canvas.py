"""Exact per-position masks on a fixed-length canvas for a regular constraint.

Canvas c[0..n-1]: each position is open (mask_id) or holds a committed token. Automaton states are
the DFA states plus ENDED ("an EOS has been emitted"). One position acts on a state q as

    open          : q -> {delta(q, t) : t a text token} U {ENDED if q accepts};  ENDED -> {ENDED}
    committed EOS : q -> {ENDED} if q accepts or q = ENDED, else {}
    committed t   : q -> {delta(q, t)} (DEAD dropped);  ENDED -> {}

Forward sets  F[0] = {start},  F[i+1] = step(F[i], c[i]).
Backward sets restricted to reachable states (exact, and never larger than F):
    B[H] = {q in F[H] : q can finish within the n-H open positions after H}
    B[i] = {q in F[i] : step(q, c[i]) meets B[i+1]}
where H = one past the last committed position (or past the last queried one): the tail after H is all
open, so "can finish within m positions" is a property of q alone (accepting -> pad with EOS; otherwise
a token-level shortest path, bounded below by the byte distance).

Token t is allowed at open position i  iff  exists q in B[i], delta(q, t) in B[i+1];
EOS is allowed at i  iff  ENDED in B[i+1] and some q in B[i] accepts (or is ENDED).
The canvas is completable iff B[0] is non-empty.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

from .deriv import DEAD, START
from .nfa import INF
from .token_automaton import TokenAutomaton

ENDED = -1

_EMPTY: frozenset[int] = frozenset()


class SetAlgebra:
    """Memoised set-level steps for one compiled constraint (shared by all its canvases)."""

    def __init__(self, ta: TokenAutomaton):
        self.ta = ta
        self.dfa = ta.dfa
        self.eos = ta.eos_id
        self._open: dict[frozenset[int], frozenset[int]] = {}
        self._tok: dict[tuple[frozenset[int], int], frozenset[int]] = {}
        # can-finish memo per state: (largest m known False, smallest m known True)
        self._fin_false: dict[int, int] = {}
        self._fin_true: dict[int, int] = {}
        self.rows: OrderedDict = OrderedDict()  # mask-row cache: key -> bool numpy row
        self.max_rows = 64

    def accepting(self, q: int) -> bool:
        return q == ENDED or bool(self.dfa.accepting[q])

    def step_open(self, F: frozenset[int]) -> frozenset[int]:
        r = self._open.get(F)
        if r is not None:
            return r
        parts = []
        ended = False
        for q in F:
            if q == ENDED:
                ended = True
                continue
            parts.append(self.ta.succ(q))
            if not ended and self.dfa.accepting[q]:
                ended = True
        r = frozenset().union(*parts) if parts else _EMPTY
        if ended:
            r = r | {ENDED}
        self._open[F] = r
        return r

    def step_tok(self, F: frozenset[int], t: int) -> frozenset[int]:
        key = (F, t)
        r = self._tok.get(key)
        if r is not None:
            return r
        if t == self.eos:
            r = frozenset({ENDED}) if any(self.accepting(q) for q in F) else _EMPTY
        else:
            d = self.ta.delta
            r = frozenset(u for u in (d(q, t) for q in F if q != ENDED) if u != DEAD)
        self._tok[key] = r
        return r

    def step(self, F: frozenset[int], c: int | None) -> frozenset[int]:
        return self.step_open(F) if c is None else self.step_tok(F, c)

    def can_finish(self, q: int, m: int) -> bool:
        """q can reach a valid end within m further (open) positions."""
        if q == ENDED or self.dfa.accepting[q]:
            return True
        if m <= 0:
            return False
        if int(self.dfa.dist[q]) <= m:  # spell the shortest byte path with single-byte tokens... if they exist
            if self.ta.single_byte_complete:
                return True
        t = self._fin_true.get(q)
        if t is not None and t <= m:
            return True
        f = self._fin_false.get(q)
        if f is not None and f >= m:
            return False
        ok = self._bfs_finish(q, m)
        if ok:
            self._fin_true[q] = min(m, self._fin_true.get(q, INF))
        else:
            self._fin_false[q] = max(m, self._fin_false.get(q, -1))
        return ok

    def _bfs_finish(self, q: int, m: int) -> bool:
        L = max(1, self.ta.max_token_len)
        dist = self.dfa.dist
        acc = self.dfa.accepting
        frontier = {q}
        seen = {q}
        for k in range(1, m + 1):
            nxt = set()
            rem = m - k
            for s in frontier:
                for u in self.ta.succ(s):
                    if u in seen:
                        continue
                    seen.add(u)
                    if acc[u]:
                        return True
                    du = int(dist[u])
                    if (du + L - 1) // L > rem:  # cannot make it even with the longest tokens
                        continue
                    if self.ta.single_byte_complete and du <= rem:
                        return True
                    nxt.add(u)
            if not nxt:
                return False
            frontier = nxt
        return False


class Analysis:
    __slots__ = ("canvas", "F", "B", "H")

    def __init__(self, canvas: tuple, F: list, B: list, H: int):
        self.canvas = canvas
        self.F = F
        self.B = B
        self.H = H


class CanvasState:
    """CanvasConstraint for one request (one canvas length) of a regular compiled constraint."""

    def __init__(self, algebra: SetAlgebra, canvas_len: int, mask_id: int | None, vocab_size: int):
        self.alg = algebra
        self.ta = algebra.ta
        self.n = int(canvas_len)
        self.mask_id = mask_id
        self.vocab_size = vocab_size
        self.eos = algebra.eos
        self._fwd_canvas: tuple | None = None
        self._fwd: list[frozenset[int]] = [frozenset({START})]

    # ------------------------------------------------------------------ helpers
    def _norm(self, canvas: Sequence[int]) -> tuple:
        if len(canvas) != self.n:
            raise ValueError(f"canvas has length {len(canvas)}, this constraint state was made for {self.n}")
        m = self.mask_id
        if isinstance(canvas, torch.Tensor):
            canvas = canvas.tolist()
        return tuple(None if (c == m) else int(c) for c in canvas)

    def _forward(self, c: tuple, upto: int) -> list[frozenset[int]]:
        """F[0..upto] for canvas c, reusing the previous call's prefix."""
        prev = self._fwd_canvas
        F = self._fwd
        if prev is not None:
            k = 0
            lim = min(len(F) - 1, upto)
            while k < lim and prev[k] == c[k]:
                k += 1
            F = F[: k + 1]
        else:
            F = F[:1]
        step = self.alg.step
        while len(F) <= upto:
            i = len(F) - 1
            F.append(step(F[i], c[i]))
        self._fwd = F
        self._fwd_canvas = c
        return F

    @staticmethod
    def _last_committed(c: tuple) -> int:
        for i in range(len(c) - 1, -1, -1):
            if c[i] is not None:
                return i
        return -1

    def _analyze(self, c: tuple, horizon: int) -> Analysis:
        H = max(self._last_committed(c) + 1, horizon)
        H = min(H, self.n)
        F = self._forward(c, H)
        alg = self.alg
        rem = self.n - H
        B: list[frozenset[int]] = [_EMPTY] * (H + 1)
        B[H] = frozenset(q for q in F[H] if alg.can_finish(q, rem))
        succ = self.ta.succ
        for i in range(H - 1, -1, -1):
            nb = B[i + 1]
            if not nb:
                break  # B[<=i] all empty
            ci = c[i]
            Fi = F[i]
            if ci is None:
                ended_ok = ENDED in nb
                B[i] = frozenset(
                    q for q in Fi
                    if (q == ENDED and ended_ok)
                    or (q != ENDED and ((ended_ok and alg.accepting(q)) or not succ(q).isdisjoint(nb)))
                )
            elif ci == self.eos:
                B[i] = frozenset(q for q in Fi if alg.accepting(q)) if ENDED in nb else _EMPTY
            else:
                d = self.ta.delta
                B[i] = frozenset(q for q in Fi if q != ENDED and d(q, ci) in nb)
        return Analysis(c, F, B, H)

    def _pairs(self, Bi: frozenset[int], Bn: frozenset[int]):
        succ = self.ta.succ
        out = []
        for q in Bi:
            if q == ENDED:
                continue
            for u in succ(q) & Bn:
                out.append((q, u))
        return out

    def _row(self, Bi: frozenset[int], Bn: frozenset[int]) -> np.ndarray:
        alg = self.alg
        eos_ok = ENDED in Bn and any(alg.accepting(q) for q in Bi)
        key = (Bi, Bn)
        row = alg.rows.get(key)
        if row is not None:
            alg.rows.move_to_end(key)
            return row
        row = np.zeros(self.vocab_size, dtype=bool)
        if Bi:
            self.ta.row(self._pairs(Bi, Bn), eos_ok, row[: self.ta.vocab_size])
        alg.rows[key] = row
        if len(alg.rows) > alg.max_rows:
            alg.rows.popitem(last=False)
        return row

    # ------------------------------------------------------------------ protocol
    def allowed_tokens(self, canvas: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        c = self._norm(canvas)
        positions = [int(p) for p in positions]
        out = torch.zeros((len(positions), self.vocab_size), dtype=torch.bool)
        if not positions:
            return out
        horizon = max(positions) + 1
        an = self._analyze(c, horizon)
        o = out.numpy()
        B = an.B
        for j, p in enumerate(positions):
            if not 0 <= p < self.n:
                raise IndexError(f"position {p} outside the canvas of length {self.n}")
            if c[p] is not None:
                # committed position: only its own token keeps the canvas as it is
                if B[0]:
                    o[j, c[p]] = True
                continue
            if not B[p] or not B[p + 1]:
                continue
            o[j] = self._row(B[p], B[p + 1])
        return out

    def is_completable(self, canvas: Sequence[int]) -> bool:
        c = self._norm(canvas)
        return self._completable(c)

    def _completable(self, c: tuple) -> bool:
        H = self._last_committed(c) + 1
        F = self._forward(c, H)
        rem = self.n - H
        return any(self.alg.can_finish(q, rem) for q in F[H])

    def select_commits(self, canvas: Sequence[int], proposals: Sequence[tuple[int, int, float]]) -> list[tuple[int, int]]:
        c = list(self._norm(canvas))
        order = sorted(range(len(proposals)), key=lambda k: -float(proposals[k][2]))
        kept: list[tuple[int, int]] = []
        for k in order:
            p, t, _ = proposals[k]
            p, t = int(p), int(t)
            if not 0 <= p < self.n or c[p] is not None or t == self.mask_id:
                continue
            c[p] = t
            if self._completable(tuple(c)):
                kept.append((p, t))
            else:
                c[p] = None
        return kept

    def forced_tokens(self, canvas: Sequence[int]) -> dict[int, int]:
        c = self._norm(canvas)
        an = self._analyze(c, self.n)
        B = an.B
        out: dict[int, int] = {}
        if not B[0]:
            return out
        alg = self.alg
        for i in range(self.n):
            if c[i] is not None:
                continue
            Bi, Bn = B[i], B[i + 1]
            eos_ok = ENDED in Bn and any(alg.accepting(q) for q in Bi)
            cnt, tok = self.ta.count_allowed(self._pairs(Bi, Bn), limit=2)
            if eos_ok:
                if cnt == 0:
                    out[i] = self.eos
                continue
            if cnt == 1:
                out[i] = tok
        return out

    # ------------------------------------------------------------------ extras
    def allowed_sets(self, canvas: Sequence[int]) -> list[set[int] | None]:
        """Debug/test helper: allowed token ids per position (None for committed positions)."""
        c = self._norm(canvas)
        an = self._analyze(c, self.n)
        res: list[set[int] | None] = []
        for i in range(self.n):
            if c[i] is not None:
                res.append(None)
                continue
            if not an.B[i] or not an.B[i + 1]:
                res.append(set())
                continue
            row = self._row(an.B[i], an.B[i + 1])
            res.append(set(np.flatnonzero(row).tolist()))
        return res
