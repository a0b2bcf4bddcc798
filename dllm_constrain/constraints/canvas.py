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

State sets are Python ints used as bitsets: bit q = DFA state q, and bit 0 (DEAD never belongs to a set)
stands for ENDED. Unions/intersections are then single big-int operations; every set-level step is
memoised per compiled constraint, so a canvas that changes by a few commits per step recomputes little.

Expansion budget. The successors of a state over "any token" need its token transitions (one trie walk).
Large schemas reach tens of thousands of DFA states within a 32-token open block, so each call may
compute at most `expand_budget` new token transitions and spend at most `expand_time_s` on them
(defaults: 128 computations, no time limit, so the result does not depend on the machine's speed;
left to right: the positions next to the committed frontier first). States whose transitions are not known yet are not followed: the sets are
then the states reachable through known states only, a subset of the exact ones, so every allowed token
is still part of a valid completion (sound), and select_commits verifies in the same system. One state of
minimal distance to acceptance is always followed (a "spine"). The left frontier (the first open position) is
exact whenever the budget cut any set of the call: every state after its token is decided by a depth-first
search for one completion (_frontier_sets), so the engine always has a position to commit and a token of a
valid completion is never missing there (the spine alone once allowed only the first letter of the shortest
enum value); select_commits / is_completable redo an inconclusive call exactly. The transition cache is shared by all requests of the compiled constraint and never
shrinks, so masks become exact once the reachable part is known; with a budget that covers it (always for
small constraints) they are exact from the first call.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

from ..errors import ConstraintTimeoutError
from .deadline import CallDeadline, activate, check_active
from .deriv import DEAD, START
from .bounds import INF
from .token_automaton import TokenAutomaton, bits_of

# Per-call time limit (seconds) of every canvas call of a request (allowed_tokens, select_commits,
# is_completable, forced_tokens) and of min_tokens / the fit check of new_canvas_state: 0.5 s, so that with the
# salvage allowance below one call never holds the engine loop (and every other request) past ~0.75 s, while
# normal calls (median well under 1 ms, p99 tens of ms) never meet it. Work done before a timeout (DFA rows,
# token transitions) stays cached in the shared automaton, so the next call on the same canvas gets further.
DEFAULT_CALL_TIMEOUT_S = 0.5
# time allowed, after the call's deadline fired, for the cheap left-to-right answer at the frontier
SALVAGE_S = 0.25

ENDED = 0  # bit 0 of a state set
ENDED_BIT = 1
START_BIT = 1 << START


class Budget:
    """How many new token-transition computations one call may still do, and until when."""

    __slots__ = ("left", "t_end", "undecided", "finish_left", "cuts")

    def __init__(self, n: int | None = None, seconds: float | None = None, finish: int | None = None):
        self.left = UNLIMITED if n is None else n
        self.t_end = None if seconds is None else time.perf_counter() + seconds
        self.undecided: set[tuple[int, int]] = set()  # (state, m) found undecided in this call
        # the can-finish search has its own allowance (it decides which tokens are allowed at all)
        self.finish_left = UNLIMITED if n is None else (8 * n if finish is None else finish)
        # set-level results this call computed through part of their members only (budget cuts): while 0, every
        # set of the call is exact. Per call, not on the shared SetAlgebra, which other requests (and threads) use.
        self.cuts = 0

    def take(self) -> bool:
        if self.left <= 0 or (self.t_end is not None and time.perf_counter() > self.t_end):
            return False
        self.left -= 1
        return True

    def take_finish(self) -> bool:
        if self.finish_left <= 0 or (self.t_end is not None and time.perf_counter() > self.t_end):
            return False
        self.finish_left -= 1
        return True


UNLIMITED = 1 << 62


def checked_chunks(members: list[int], size: int = 256):
    """`members` in slices of `size`, this thread's call deadline checked before each: set loops check once per
    slice instead of testing a counter at every member (which cost more than the loop bodies it guarded)."""
    if len(members) <= size:
        check_active()
        yield members
        return
    for k in range(0, len(members), size):
        check_active()
        yield members[k:k + size]


class SetAlgebra:
    """Memoised set-level steps for one compiled constraint (shared by all its canvases)."""

    def __init__(self, ta: TokenAutomaton):
        self.ta = ta
        self.dfa = ta.dfa
        self.eos = ta.eos_id
        self._bits: dict[int, list[int]] = {}
        self._open: dict[int, int] = {}
        self._tok: dict[tuple[int, int], int] = {}
        self._back_open: dict[tuple[int, int], int] = {}
        self._back_tok: dict[tuple[int, int, int], int] = {}
        # can-finish memo per state: (largest m known False, smallest m known True)
        self._fin_false: dict[int, int] = {}
        self._fin_true: dict[int, int] = {}
        self._fin_sets: dict[tuple[int, int], int] = {}
        self._succ_sorted: dict[int, list[int]] = {}
        self._greedy: dict[int, int] = {}
        self._greedy_step: dict[int, tuple[int, int]] = {}
        self.rows: OrderedDict = OrderedDict()  # mask-row cache: (Bi, Bn) -> bool numpy row
        self.max_rows = 64

    # ------------------------------------------------------------------ basics
    def members(self, F: int) -> list[int]:
        r = self._bits.get(F)
        if r is None:
            r = bits_of(F)
            if len(self._bits) > 200_000:
                self._bits.clear()
            self._bits[F] = r
        return r

    def accepting(self, q: int) -> bool:
        return q == ENDED or bool(self.dfa.accepting[q])

    def acc_bits(self) -> int:
        return self.ta.acc_bits | ENDED_BIT

    def any_accepting(self, F: int) -> bool:
        if F & ENDED_BIT:
            return True
        acc = self.dfa.accepting
        return any(acc[q] for q in self.members(F))

    def succ_bits(self, q: int) -> int:
        return self.ta.trans(q).succ_bits

    # ------------------------------------------------------------------ forward
    def known(self, q: int) -> bool:
        return q in self.ta.succ_bits

    def _expand(self, q: int, budget: Budget | None) -> int | None:
        """succ bits of q, computing them if the budget allows (None = unknown)."""
        sb = self.ta.succ_bits.get(q)
        if sb is not None:
            return sb
        if budget is None or budget.take():
            return self.ta.trans(q).succ_bits
        return None

    def step_open(self, F: int, budget: Budget | None = None) -> int:
        r = self._open.get(F)
        if r is not None:
            return r
        r = 0
        acc = self.dfa.accepting
        ended = bool(F & ENDED_BIT)
        partial = False
        unknown: list[int] = []
        sget = self.ta.succ_bits.get
        for chunk in checked_chunks(self.members(F)):
            for q in chunk:
                if q == ENDED:
                    continue
                if not ended and acc[q]:
                    ended = True
                sb = sget(q)
                if sb is None:
                    sb = self._expand(q, budget)
                    if sb is None:
                        partial = True
                        unknown.append(q)
                        continue
                r |= sb
        if partial:  # only a budget leaves members unknown
            budget.cuts += 1
        if partial and not r and not ended:
            # keep a spine: follow the member closest to acceptance even past the budget
            dist = self.dfa.dist
            q = min(unknown, key=lambda x: int(dist[x]))
            r |= self.ta.trans(q).succ_bits
        if ended:
            r |= ENDED_BIT
        if not partial:
            self._open[F] = r
        return r

    def step_tok(self, F: int, t: int) -> int:
        key = (F, t)
        r = self._tok.get(key)
        if r is not None:
            return r
        if t == self.eos:
            r = ENDED_BIT if self.any_accepting(F) else 0
        else:
            d = self.ta.delta
            r = 0
            for q in self.members(F):
                if q != ENDED:
                    u = d(q, t)
                    if u != DEAD:
                        r |= 1 << u
        self._tok[key] = r
        return r

    def step(self, F: int, c: int | None, budget: Budget | None = None) -> int:
        return self.step_open(F, budget) if c is None else self.step_tok(F, c)

    # ------------------------------------------------------------------ backward
    def back_open(self, F: int, X: int, budget: Budget | None = None) -> int:
        """{q in F : an open position takes q into X} (through known transitions; a member whose transitions are
        unknown counts as a cut of `budget`'s call)."""
        key = (F, X)
        r = self._back_open.get(key)
        if r is not None:
            return r
        sget = self.ta.succ_bits.get
        acc = self.dfa.accepting
        ended_ok = bool(X & ENDED_BIT)
        r = 0
        partial = False
        for chunk in checked_chunks(self.members(F)):
            for q in chunk:
                if q == ENDED:
                    if ended_ok:
                        r |= ENDED_BIT
                    continue
                if ended_ok and acc[q]:
                    r |= 1 << q
                    continue
                sb = sget(q)
                if sb is None:
                    partial = True
                elif sb & X:
                    r |= 1 << q
        if not partial:
            self._back_open[key] = r
        elif budget is not None:
            budget.cuts += 1
        return r

    def back_tok(self, F: int, t: int, X: int) -> int:
        """{q in F : committed token t takes q into X}."""
        key = (F, t, X)
        r = self._back_tok.get(key)
        if r is not None:
            return r
        r = 0
        if t == self.eos:
            if X & ENDED_BIT:
                acc = self.dfa.accepting
                for q in self.members(F):
                    if q == ENDED or acc[q]:
                        r |= 1 << q
        else:
            d = self.ta.delta
            for q in self.members(F):
                if q != ENDED:
                    u = d(q, t)
                    if u != DEAD and (X >> u) & 1:
                        r |= 1 << q
        self._back_tok[key] = r
        return r

    # ------------------------------------------------------------------ lengths
    def can_finish(self, q: int, m: int, budget: Budget | None = None) -> bool:
        """q can reach a valid end within m further (open) positions (False when undecided within the
        budget: sound)."""
        return self.finish3(q, m, budget) is True

    def finish3(self, q: int, m: int, budget: Budget | None = None) -> bool | None:
        """Tri-state can-finish: True / False (proven) / None (undecided within the budget).

        d(q) <= m  with  d(q) = 0 for accepting q, else 1 + min over token successors u of d(u); decided
        depth-first (successors closest to acceptance first) with per-state thresholds memoised: the
        smallest m known to suffice and the largest m known not to."""
        if q == ENDED or self.dfa.accepting[q]:
            return True
        if m <= 0:
            return False
        if self.ta.single_byte_complete and int(self.dfa.dist[q]) <= m:
            return True  # spell the shortest byte path with single-byte tokens
        t = self._fin_true.get(q)
        if t is not None and t <= m:
            return True
        f = self._fin_false.get(q)
        if f is not None and f >= m:
            return False
        if self.greedy_tokens_to_accept(q) <= m:
            self._fin_true[q] = min(m, self._fin_true.get(q, INF))
            return True
        if budget is not None and (q, m) in budget.undecided:
            return None
        check_active(q, "deciding whether it can finish")
        L = max(1, self.ta.max_token_len)
        if -(-int(self.dfa.dist[q]) // L) > m:  # not even with the longest tokens
            self._fin_false[q] = max(m, self._fin_false.get(q, -1))
            return False
        succ = self._succ_by_dist(q, budget)
        if succ is None:
            budget.undecided.add((q, m))
            return None
        undecided = False
        for u in succ:
            r = self.finish3(u, m - 1, budget)
            if r is True:
                self._fin_true[q] = min(m, self._fin_true.get(q, INF))
                return True
            if r is None:
                undecided = True
        if undecided:
            budget.undecided.add((q, m))
            return None
        self._fin_false[q] = max(m, self._fin_false.get(q, -1))
        return False

    def greedy_tokens_to_accept(self, q: int) -> int:
        """An upper bound on the tokens q needs: the shortest byte continuation (lowest byte first at each
        step), tokenized by longest match. Needs DFA rows only, no token transitions.

        The continuation is a function of the state (path(q) = b + path(next)), so after the longest token
        t that prefixes path(q) the rest is path(state after t): greedy(q) = 1 + greedy(that state), memoised
        per state (each state looks at most max_token_len bytes ahead instead of tokenizing its whole path)."""
        memo = self._greedy
        r = memo.get(q)
        if r is not None:
            return r
        dfa = self.dfa
        L = max(1, self.ta.max_token_len)
        chain: list[int] = []
        s = q
        while True:
            r = memo.get(s)
            if r is not None:
                break
            if not len(chain) & 63:
                check_active(s, "tokenizing its shortest continuation")
            if dfa.accepting[s]:
                r = memo[s] = 0
                break
            head = bytearray()
            states = [s]
            u = s
            while len(head) < L and not dfa.accepting[u]:
                b, u = self._greedy_next(u)
                if b < 0:
                    break
                head.append(b)
                states.append(u)
            k = self.ta.longest_token_prefix(bytes(head))
            if k == 0:  # a dead end on the path, or a byte no token spells
                r = memo[s] = INF
                break
            chain.append(s)
            s = states[k]
            if len(chain) > 100_000:
                r = INF
                break
        for x in reversed(chain):
            r = INF if r >= INF else r + 1
            memo[x] = r
        return memo[q]

    def _greedy_next(self, s: int) -> tuple[int, int]:
        """(lowest byte taking s one byte closer to acceptance, the state it leads to), or (-1, DEAD)."""
        st = self._greedy_step.get(s)
        if st is None:
            dfa = self.dfa
            dfa.expand(s)
            row = dfa.T[s]
            d = int(dfa.dist[s])
            st = (-1, DEAD)
            for b in np.flatnonzero(row).tolist():
                if int(dfa.dist[row[b]]) == d - 1:
                    st = (b, int(row[b]))
                    break
            self._greedy_step[s] = st
        return st

    def _succ_by_dist(self, q: int, budget: Budget | None) -> list[int] | None:
        r = self._succ_sorted.get(q)
        if r is None:
            sb = self.ta.succ_bits.get(q)
            if sb is None:
                if budget is not None and not budget.take_finish():
                    return None
                sb = self.ta.trans(q).succ_bits
            dist = self.dfa.dist
            r = sorted(bits_of(sb), key=lambda u: int(dist[u]))
            self._succ_sorted[q] = r
        return r

    def finishers(self, F: int, m: int, budget: Budget | None = None) -> int:
        key = (F, m)
        r = self._fin_sets.get(key)
        if r is not None:
            return r
        r = 0
        dist = self.dfa.dist
        acc = self.dfa.accepting
        easy = self.ta.single_byte_complete
        complete = True
        for q in self.members(F):
            if q == ENDED or acc[q] or (easy and int(dist[q]) <= m):
                r |= 1 << q
            else:
                f3 = self.finish3(q, m, budget)
                if f3 is True:
                    r |= 1 << q
                elif f3 is None:  # undecided within the budget (a proven False keeps the set complete)
                    complete = False
        if complete:
            self._fin_sets[key] = r
        else:  # only a budget leaves a member undecided
            budget.cuts += 1
        return r

    # ------------------------------------------------------------------ rows
    def row(self, Bi: int, Bn: int, vocab_size: int) -> np.ndarray:
        key = (Bi, Bn)
        row = self.rows.get(key)
        if row is not None:
            self.rows.move_to_end(key)
            return row
        row = np.zeros(vocab_size, dtype=bool)
        full: list[int] = []
        partial: list[tuple[int, int]] = []  # (state, targets in Bn as a bitset)
        eos_ok = False
        acc = self.dfa.accepting
        ended_in_next = bool(Bn & ENDED_BIT)
        notBn = ~Bn
        sget = self.ta.succ_bits.get
        partial_row = False
        for q in self.members(Bi):
            if q == ENDED:
                eos_ok = eos_ok or ended_in_next
                continue
            if ended_in_next and acc[q]:
                eos_ok = True
            sb = sget(q)
            if sb is None:
                partial_row = True  # in B only through EOS so far
                continue
            if not sb & notBn:
                full.append(q)
            else:
                inter = sb & Bn
                if inter:
                    partial.append((q, inter))
        self.ta.mask_row(full, partial, eos_ok, row, self.members)
        if partial_row:
            return row
        self.rows[key] = row
        if len(self.rows) > self.max_rows:
            self.rows.popitem(last=False)
        return row

    def count(self, Bi: int, Bn: int) -> tuple[int, int | None, bool]:
        """(allowed text tokens capped at 2, the token if exactly one, EOS allowed)."""
        full: list[int] = []
        partial: list[tuple[int, int]] = []
        eos_ok = False
        acc = self.dfa.accepting
        ended_in_next = bool(Bn & ENDED_BIT)
        for q in self.members(Bi):
            if q == ENDED:
                eos_ok = eos_ok or ended_in_next
                continue
            if ended_in_next and acc[q]:
                eos_ok = True
            sb = self.ta.succ_bits.get(q)
            if sb is None:
                continue
            if not sb & ~Bn:
                full.append(q)
            else:
                inter = sb & Bn
                if inter:
                    partial.append((q, inter))
        cnt, tok = self.ta.count_allowed(full, partial, self.members)
        return cnt, tok, eos_ok


class Analysis:
    __slots__ = ("canvas", "F", "B", "H")

    def __init__(self, canvas: tuple, F: list, B: list, H: int):
        self.canvas = canvas
        self.F = F
        self.B = B
        self.H = H


class CanvasState:
    """CanvasConstraint for one request (one canvas length) of a regular compiled constraint."""

    def __init__(self, algebra: SetAlgebra, canvas_len: int, mask_id: int | None, vocab_size: int,
                 expand_budget: int | None = 128, expand_time_s: float | None = None,
                 timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S, kind: str = "regex"):
        # per call: at most expand_budget new token-transition computations and expand_time_s seconds
        # spent on them (None, None = unlimited: always exact)
        self.expand_budget = expand_budget
        self.expand_time_s = expand_time_s
        # per call: a hard time limit (None = unbounded), see "Time bounds" in docs/constraints.md
        self.timeout_s = timeout_s
        self.kind = kind
        self.deadline_hits = 0  # calls whose deadline fired (answered from what they had, or raised)
        self.prefix_fallbacks = 0  # frontier masks answered by the left-to-right prefix check after a timeout
        # sound rows of the last allowed_tokens call: (canvas, {position: row}); a token in one is verified
        self._certified: tuple[tuple, dict[int, np.ndarray]] | None = None
        self._proven: OrderedDict = OrderedDict()  # canvases proven completable (most recent last)
        self._budget: Budget | None = None
        self.alg = algebra
        self.ta = algebra.ta
        self.n = int(canvas_len)
        self.mask_id = mask_id
        self.vocab_size = vocab_size
        self.eos = algebra.eos
        self._fwd_canvas: tuple | None = None
        self.exact_fallbacks = 0  # calls that the expansion budget left inconclusive, redone exactly
        self._fm_canvas: tuple | None = None  # the exact frontier's memo (see _frontier_memo)
        self._fm: dict[int, dict[int, bool]] = {}
        self._fwd: list[int] = [START_BIT]
        self._fwd_ok: list[bool] = [True]

    # ------------------------------------------------------------------ helpers
    def _norm(self, canvas: Sequence[int]) -> tuple:
        if isinstance(canvas, torch.Tensor):
            canvas = canvas.tolist()
        if len(canvas) != self.n:
            raise ValueError(f"canvas has length {len(canvas)}, this constraint state was made for {self.n}")
        m = self.mask_id
        return tuple(None if (c == m) else int(c) for c in canvas)

    def _forward(self, c: tuple, upto: int) -> list[int]:
        """F[0..upto] for canvas c, reusing the previous call's prefix (up to the first entry that was
        computed under a budget cut, so that sets grow back to exact as transitions become known)."""
        prev = self._fwd_canvas
        F = self._fwd
        ok = self._fwd_ok
        if prev is not None:
            k = 0
            lim = min(len(F) - 1, upto)
            while k < lim and prev[k] == c[k] and ok[k + 1]:
                k += 1
            F = F[: k + 1]
            ok = ok[: k + 1]
        else:
            F = F[:1]
            ok = ok[:1]
        step = self.alg.step
        budget = self._budget
        cuts0 = budget.cuts if budget is not None else 0
        while len(F) <= upto:
            i = len(F) - 1
            F.append(step(F[i], c[i], budget))
            ok.append(ok[i] and (budget is None or budget.cuts == cuts0))
        self._fwd = F
        self._fwd_ok = ok
        self._fwd_canvas = c
        return F

    @staticmethod
    def _last_committed(c: tuple) -> int:
        for i in range(len(c) - 1, -1, -1):
            if c[i] is not None:
                return i
        return -1

    def _analyze(self, c: tuple, horizon: int) -> Analysis:
        J = self._last_committed(c)
        H = min(max(J + 1, horizon), self.n)
        F = self._forward(c, H)
        alg = self.alg
        B = [0] * (H + 1)
        # right of the last committed position everything is open: membership in B is "can finish in
        # the positions left", a property of the state alone (no backward chain needed)
        for i in range(H, J, -1):
            B[i] = alg.finishers(F[i], self.n - i, self._budget)
        back_open, back_tok = alg.back_open, alg.back_tok
        for i in range(J, -1, -1):
            nb = B[i + 1]
            if not nb:
                break  # B[<=i] all empty
            ci = c[i]
            B[i] = back_open(F[i], nb, self._budget) if ci is None else back_tok(F[i], ci, nb)
        return Analysis(c, F, B, H)

    def _completable(self, c: tuple) -> bool:
        if c in self._proven:
            return True
        H = self._last_committed(c) + 1
        F = self._forward(c, H)
        rem = self.n - H
        can = self.alg.can_finish
        ok = any(can(q, rem, self._budget) for q in self.alg.members(F[H]))
        if ok:
            self._prove(c)
        return ok

    def _prove(self, c: tuple) -> None:
        """Remember that canvas c is completable (proven: a path through known transitions reaches the end)."""
        self._proven[c] = True
        self._proven.move_to_end(c)
        if len(self._proven) > 16:
            self._proven.popitem(last=False)

    def _new_budget(self) -> None:
        if self.expand_budget is None and self.expand_time_s is None:
            self._budget = None
        else:
            secs = self.expand_time_s
            if self.timeout_s is not None and self.expand_budget is not None:
                # stop computing new transitions at half the call's time: the rest finishes the sets
                secs = 0.5 * self.timeout_s if secs is None else min(secs, 0.5 * self.timeout_s)
            self._budget = Budget(self.expand_budget, secs)

    # ------------------------------------------------------------------ time bounds
    def _call(self, operation: str, c: tuple | None = None, limit: float | None = -1.0) -> CallDeadline:
        where = (lambda: self._where(c)) if c is not None else None
        return CallDeadline(self.timeout_s if limit == -1.0 else limit, self.kind, operation, where)

    def _where(self, c: tuple) -> str:
        """The request-level location for a timeout message: the canvas frontier and, for JSON, the instance
        location (JSON pointer) of the value being written there."""
        frontier = next((i for i, x in enumerate(c) if x is None), None)
        if frontier is None:
            return f"a full canvas of {self.n} positions"
        s = f"canvas frontier at position {frontier} of {self.n}"
        if self.kind == "json_schema":
            tb = self.ta.tok.token_bytes
            data = b"".join(tb[t] or b"" for t in c[:frontier] if t != self.eos and 0 <= t < len(tb))
            s += f", instance location {json_pointer_of_prefix(data.decode('utf-8', 'replace'))!r}"
        return s

    def _salvage_limit(self) -> float | None:
        return None if self.timeout_s is None else min(SALVAGE_S, 0.5 * self.timeout_s)

    def _prefix_row(self, c: tuple, frontier: int) -> np.ndarray:
        """The left-to-right prefix check at the frontier: every token that keeps the committed prefix a prefix
        of an accepted text (plus EOS where the prefix is accepted). A sound over-approximation of the canvas
        mask (committed tokens to the right and the length are not checked): select_commits and is_completable
        verify any commit taken from it."""
        alg = self.alg
        F = START_BIT
        for i in range(frontier):
            F = alg.step_tok(F, c[i])
        row = np.zeros(self.vocab_size, dtype=bool)
        if not F:
            return row
        full = [q for q in alg.members(F) if q != ENDED]
        self.ta.mask_row(full, [], alg.any_accepting(F), row)
        return row

    # ------------------------------------------------------------------ protocol
    def allowed_tokens(self, canvas: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Masks under the call's deadline. When it fires, positions whose (sound) row was finished keep it, the
        others stay empty, and the left frontier, if asked and still empty, gets the left-to-right prefix check
        (an over-approximation that select_commits / is_completable verify), computed within SALVAGE_S; if even
        that cannot finish, ConstraintTimeoutError."""
        c = self._norm(canvas)
        positions = [int(p) for p in positions]
        out = torch.zeros((len(positions), self.vocab_size), dtype=torch.bool)
        if not positions:
            return out
        for p in positions:
            if not 0 <= p < self.n:
                raise IndexError(f"position {p} outside the canvas of length {self.n}")
        frontier = next((i for i, x in enumerate(c) if x is None), None)
        o = out.numpy()
        done: dict[int, bool] = {}  # row index -> its row is final and sound
        with activate(self._call("allowed_tokens", c)):
            try:
                self._allowed_into(c, positions, frontier, o, done)
            except ConstraintTimeoutError as err:
                self.deadline_hits += 1
                if frontier is not None and frontier in positions:
                    j = positions.index(frontier)
                    if not (done.get(j) and o[j].any()):
                        with activate(self._call("allowed_tokens (left-to-right prefix check)", c,
                                                 self._salvage_limit())):
                            try:
                                o[j] = self._prefix_row(c, frontier)
                            except ConstraintTimeoutError:
                                raise err from None
                        done[j] = False
                        self.prefix_fallbacks += 1
        self._certified = (c, {positions[j]: o[j] for j, ok in done.items() if ok})
        return out

    def _allowed_into(self, c: tuple, positions: list[int], frontier: int | None, o: np.ndarray,
                      done: dict[int, bool]) -> None:
        self._new_budget()
        an = self._analyze(c, max(positions) + 1)
        B = an.B
        if B[0]:
            self._prove(c)
        V = self.vocab_size
        redo = None
        for j, p in enumerate(positions):
            if c[p] is not None:
                # committed position: only its own token keeps the canvas as it is
                if B[0] and 0 <= c[p] < V:
                    o[j, c[p]] = True
                done[j] = True
                continue
            bi, bn = B[p], B[p + 1]
            if bi and bn:
                o[j] = self.alg.row(bi, bn, V)
            if p == frontier and self._budget is not None and (self._budget.cuts or not o[j].any()):
                # the budget cut part of the sets: the frontier row may miss tokens; decided exactly below, after
                # every other row is safe (until then the sound budgeted row stands, if it is not empty)
                redo = j
                if not o[j].any():
                    continue
            done[j] = True
        if redo is not None:
            # the left frontier's mask is exact: every token of every valid completion is allowed there (the
            # engine always has a position to commit, and a wanted token is never lost to the budget; further
            # open positions may miss tokens or stay empty under the budget: sound, filled in later calls)
            self.exact_fallbacks += 1
            bi, bn = self._frontier_sets(c, frontier, an)
            o[redo] = self.alg.row(bi, bn, V) if (bi and bn) else False
            if bi and bn:
                self._prove(c)
            done[redo] = True

    def _frontier_memo(self, c: tuple) -> dict[int, dict[int, bool]]:
        """Per-position memo of "state v before position i completes the canvas", kept from the previous call
        for the positions right of the last one that changed (the answer depends on c[i:] only)."""
        prev = self._fm_canvas
        memo = self._fm
        if prev is None or len(prev) != len(c):
            memo = {}
        else:
            d = next((i for i in range(len(c) - 1, -1, -1) if prev[i] != c[i]), -1)
            if d >= 0:
                memo = {i: m for i, m in memo.items() if i > d}
        self._fm_canvas = c
        self._fm = memo
        return memo

    def _frontier_sets(self, c: tuple, f: int, an: Analysis) -> tuple[int, int]:
        """Exact (B[f], B[f+1]) at the left frontier f (every position before f is committed, so F[f] is exact).

        A state w after the frontier's token belongs to B[f+1] iff some completion of c[f+1:] starts from it: a
        depth-first search over (state, position) with exact token transitions, stopping at the first witness.
        States of the budgeted backward sets are certified (they are subsets of the exact ones), a committed
        next token prunes the successors that cannot read it, right of the last committed position the answer is
        can_finish, and answers are memoised by position across calls while c[i:] is unchanged. A state without
        a completion is refuted only by exhausting what it reaches before the committed tokens stop it: at worst
        the exact forward sets, at best (the frequent case) one path per state."""
        alg, ta = self.alg, self.ta
        dfa = alg.dfa  # its arrays are reallocated as it grows: read dfa.accepting / dfa.dist at each use
        n, eos = self.n, self.eos
        J = self._last_committed(c)
        B, H = an.B, an.H
        eos_tail = [True] * (n + 2)  # eos_tail[i]: every committed position >= i holds EOS
        for i in range(n - 1, -1, -1):
            eos_tail[i] = eos_tail[i + 1] and (c[i] is None or c[i] == eos)
        memo = self._frontier_memo(c)
        known = ta.succ_bits
        delta = ta.delta

        def quick(v: int, i: int) -> bool | None:
            if v == ENDED:
                return eos_tail[i]
            if i >= n:
                return bool(dfa.accepting[v])
            if i <= H and (B[i] >> v) & 1:
                return True
            m = memo.get(i)
            if m is not None:
                r = m.get(v)
                if r is not None:
                    return r
            if i > J:
                r = alg.can_finish(v, n - i)
                memo.setdefault(i, {})[v] = r
                return r
            ci = c[i]
            if ci is None:
                if dfa.accepting[v] and eos_tail[i + 1]:
                    return True
            elif ci == eos:
                return bool(dfa.accepting[v]) and eos_tail[i + 1]
            return None

        def children(v: int, i: int) -> list[int]:
            ci = c[i]
            if ci is not None:
                w = delta(v, ci)
                return [] if w == DEAD else [w]
            sb = ta.trans(v).succ_bits
            if i + 1 <= H and sb & B[i + 1]:
                return [(sb & B[i + 1]).bit_length() - 1]  # certified
            m = memo.get(i + 1)
            ws = alg.members(sb)
            if m:
                hit = next((w for w in ws if m.get(w) is True), None)
                if hit is not None:
                    return [hit]
            nxt = c[i + 1] if i + 1 < n else None
            if nxt is not None:
                if nxt == eos:
                    ws = [w for w in ws if dfa.accepting[w]]
                else:
                    ws = [w for w in ws if delta(w, nxt) != DEAD]
            # states whose transitions are known first (no trie walk to look further), then nearest to acceptance
            return sorted(ws, key=lambda w: (w not in known, int(dfa.dist[w])))

        visits = 0

        def good(v0: int, i0: int) -> bool:
            nonlocal visits
            r = quick(v0, i0)
            if r is not None:
                return r
            stack = [(v0, i0, iter(children(v0, i0)))]
            while stack:
                v, i, it = stack[-1]
                res = None
                for w in it:
                    r = quick(w, i + 1)
                    if r is True:
                        res = True
                        break
                    if r is None:
                        visits += 1
                        if not visits & 63:
                            check_active(w, "deciding the left frontier's mask exactly")
                        stack.append((w, i + 1, iter(children(w, i + 1))))
                        break
                else:
                    res = False
                if res is None:
                    continue  # descended
                if res:
                    for u, k, _ in stack:
                        memo.setdefault(k, {})[u] = True
                    return True
                memo.setdefault(i, {})[v] = False
                stack.pop()
            return False

        bi = bn = 0
        for q in alg.members(an.F[f]):
            if q == ENDED:
                if eos_tail[f]:
                    bi |= ENDED_BIT
                    bn |= ENDED_BIT
                continue
            sb = ta.trans(q).succ_bits
            ok = False
            if dfa.accepting[q] and eos_tail[f + 1]:
                bn |= ENDED_BIT
                ok = True
            cert = sb & B[f + 1] if f + 1 <= H else 0
            if cert:
                bn |= cert
                ok = True
            for w in alg.members(sb & ~cert):
                if not (bn >> w) & 1 and good(w, f + 1):
                    bn |= 1 << w
                    ok = True
            if ok:
                bi |= 1 << q
        return bi, bn

    def is_completable(self, canvas: Sequence[int]) -> bool:
        """Under the call's deadline; a canvas already proven completable (by select_commits or a mask) answers at
        once. Never True without proof: when the deadline fires first, ConstraintTimeoutError."""
        c = self._norm(canvas)
        if c in self._proven:
            return True
        with activate(self._call("is_completable", c)):
            try:
                self._new_budget()
                if self._completable(c):
                    return True
                if self._budget is None:
                    return False
                self._budget = None  # "not completable" decides a backtrack: make sure, exactly
                self.exact_fallbacks += 1
                return self._completable(c)
            except ConstraintTimeoutError:
                self.deadline_hits += 1
                raise

    def select_commits(self, canvas: Sequence[int], proposals: Sequence[tuple[int, int, float]]) -> list[tuple[int, int]]:
        """Under the call's deadline. When it fires, the commits verified so far are returned (fewer than without
        a deadline); with none verified yet, the best proposal whose token was in a sound row of the last
        allowed_tokens call on this same canvas; with none, ConstraintTimeoutError. Never an unverified commit."""
        ct = self._norm(canvas)
        c = list(ct)
        order = sorted(range(len(proposals)), key=lambda k: -float(proposals[k][2]))
        kept: list[tuple[int, int]] = []
        with activate(self._call("select_commits", ct)):
            try:
                self._new_budget()
                self._greedy_commits(c, proposals, order, False, kept)
                if not kept and self._budget is not None and proposals:
                    # nothing certified within the budget: decide the proposals exactly, best first, until one holds
                    self._budget = None
                    self.exact_fallbacks += 1
                    self._greedy_commits(c, proposals, order, True, kept)
            except ConstraintTimeoutError:
                self.deadline_hits += 1
                if not kept:
                    kept = self._certified_commit(ct, proposals, order)
                    if not kept:
                        raise
        return kept

    def _certified_commit(self, ct: tuple, proposals: Sequence[tuple[int, int, float]],
                          order: list[int]) -> list[tuple[int, int]]:
        """The best proposal whose token a sound mask row of this canvas allowed (so committing it alone keeps
        the canvas completable), or []."""
        cert = self._certified
        if cert is None or cert[0] != ct:
            return []
        rows = cert[1]
        for k in order:
            p, t = int(proposals[k][0]), int(proposals[k][1])
            row = rows.get(p)
            if row is not None and ct[p] is None and 0 <= t < row.shape[0] and bool(row[t]):
                c = list(ct)
                c[p] = t
                self._prove(tuple(c))
                return [(p, t)]
        return []

    def _greedy_commits(self, c: list, proposals: Sequence[tuple[int, int, float]], order: list[int],
                        first_only: bool, kept: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Commit the proposals in `order` onto c, each kept (appended to `kept` at once, so that a deadline
        leaves the verified ones) iff the canvas stays completable."""
        for k in order:
            p, t, _ = proposals[k]
            p, t = int(p), int(t)
            if not 0 <= p < self.n or c[p] is not None or t == self.mask_id:
                continue
            c[p] = t
            try:
                ok = self._completable(tuple(c))
            except BaseException:
                c[p] = None
                raise
            if ok:
                kept.append((p, t))
                if first_only:
                    break
            else:
                c[p] = None
        return kept

    def forced_tokens(self, canvas: Sequence[int]) -> dict[int, int]:
        """Under the call's deadline: when it fires, nothing is reported forced (sound)."""
        c = self._norm(canvas)
        with activate(self._call("forced_tokens", c)):
            try:
                return self._forced(c)
            except ConstraintTimeoutError:
                self.deadline_hits += 1
                return {}

    def _forced(self, c: tuple) -> dict[int, int]:
        self._new_budget()
        an = self._analyze(c, self.n)
        B = an.B
        out: dict[int, int] = {}
        if not B[0]:
            return out
        for i in range(self.n):
            if c[i] is not None:
                continue
            cnt, tok, eos_ok = self.alg.count(B[i], B[i + 1])
            if eos_ok:
                if cnt == 0:
                    out[i] = self.eos
                continue
            if cnt == 1:
                out[i] = tok
        return out

    # ------------------------------------------------------------------ extras
    def allowed_sets(self, canvas: Sequence[int]) -> list[set[int] | None]:
        """Test helper: allowed token ids per position (None for committed positions)."""
        c = self._norm(canvas)
        self._new_budget()
        an = self._analyze(c, self.n)
        res: list[set[int] | None] = []
        for i in range(self.n):
            if c[i] is not None:
                res.append(None)
            elif not an.B[i] or not an.B[i + 1]:
                res.append(set())
            else:
                res.append(set(np.flatnonzero(self.alg.row(an.B[i], an.B[i + 1], self.vocab_size)).tolist()))
        return res


def json_pointer_of_prefix(text: str) -> str:
    """The JSON pointer (RFC 6901) of the value a partial JSON text is writing at its end, e.g. '{"a":[1,{"b":'
    -> '/a/1/b' (best effort, for messages: a key being written counts as its member's location)."""
    stack: list[list] = []  # ["o", key or None] / ["a", index]
    i, n = 0, len(text)
    expect_key = False
    while i < n:
        ch = text[i]
        if ch == '"':
            j = i + 1
            buf = []
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n:
                    buf.append(text[j + 1])
                    j += 2
                    continue
                buf.append(text[j])
                j += 1
            if expect_key and stack and stack[-1][0] == "o":
                stack[-1][1] = "".join(buf)
            i = j + 1
            continue
        if ch == "{":
            stack.append(["o", None])
            expect_key = True
        elif ch == "[":
            stack.append(["a", 0])
            expect_key = False
        elif ch in "}]":
            if stack:
                stack.pop()
            expect_key = False
        elif ch == ":":
            expect_key = False
        elif ch == ",":
            if stack and stack[-1][0] == "a":
                stack[-1][1] += 1
            elif stack:
                stack[-1][1] = None
                expect_key = True
        i += 1
    parts = [str(x[1]) for x in stack if x[1] is not None]
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)
