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

Expansion budget (work, never time). The successors of a state over "any token" need its token transitions (one
trie walk). Large schemas reach tens of thousands of DFA states within a 32-token open block, so each request keeps
its own explored set K (a bitset of states, set_algebra.Budget) and each call may add at most `expand_budget` states
to it (default: EXPAND_WORK token-steps, 128 states at 4K tokens, 4 at 128K; a set's new members all or none, left to right: the positions next to the committed frontier
first); the sets follow the token transitions of K's states only. Sets cut short are the states reachable through
K, a subset of the exact ones, so every allowed token is still part of a valid completion (sound), and
select_commits verifies in the same system. The states of minimal distance to acceptance are followed past the
budget while they are at most SPINE_WORK token-steps' worth (a "spine"). Right of the last committed position "can
finish in the positions left" is decided per state without a search (set_algebra.finish_cheap). Rows other than the left frontier's are computed while their backward sets hold at
most ROW_WORK token-steps' worth of states in all (the rest stay empty this call: sound, `rows_deferred`). The left frontier (the first open
position) is decided by a depth-first search for one completion per state whenever the budget cut any set of the
call (_frontier_sets: at most FRONTIER_WORK token-steps of states per call, in a canonical order; right of the last
committed position its can-finish questions expand at most FINISH_WORK token-steps of states each, breadth first; a
state left undecided is left out, and a row left empty gets its first witness unbounded), so the engine always has a
position to commit; select_commits / is_completable redo an inconclusive call by the same search, exactly.

Reproducibility: every allowance above counts states, and the sets and rows of a call are functions of the
constraint, the canvas and K, where K grows by the same states on any machine: the automaton's transition cache
(shared by all requests of the compiled constraint, never shrinking) only makes the same work cheaper, and a set's
members are taken by what they are, not by the automaton's state numbering (which follows the order in which requests
discovered them). So a request gets the same masks on an idle or a loaded machine, from any thread, with a cold or a
warm cache, whatever its batch-mates. The call deadline (`timeout_s`) is the last resort: when it fires the call
raises ConstraintTimeoutError and the request ends; no answer is ever cut by the clock. Without a budget
(expand_budget=None) every row is exact.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

from dllm_constrain.kernels.bitmask import bitmask_bytes, row_allows, row_tokens, set_token, write_row

from ..errors import ConstraintTimeoutError, ConstraintTooLongError, InvalidRequestError
from .canvas_frontier import FrontierMemo, FrontierSearch, first_open, last_committed
from .deadline import CallDeadline, activate
from .json_pointer import json_pointer_of_prefix
from .set_algebra import (  # noqa: F401  (re-exported: canvas.py was their home)
    ENDED,
    ENDED_BIT,
    START_BIT,
    UNLIMITED,
    Budget,
    SetAlgebra,
    bits_of,
    checked_chunks,
)

# Per-call time limit (seconds) of every canvas call of a request (allowed_tokens, select_commits,
# is_completable, forced_tokens) and of min_tokens / the fit check of new_canvas_state: the last resort. The answers
# are bounded by work (the allowances below), never by this limit: a call that reaches it raises
# ConstraintTimeoutError and its request ends (the work it finished stays cached in the shared automaton). 2 s: the
# exact decisions a call may need (the left frontier's witness search, select_commits' exact fallback) walk the
# token trie of every new state they meet, about 1 ms each at 128K tokens, and a loaded machine takes several times
# longer; 0.5 s (when the limit cut answers instead of ending requests) ended about one JSONSchemaBench walk in
# three on the shared 2-core machine (docs/measurements.md).
DEFAULT_CALL_TIMEOUT_S = 2.0
# The work allowances are counted in token-steps (a state times the vocabulary size: a new state's transitions are one
# walk of the token trie, a row one pass over the vocabulary's bitmask), so that one allowance costs about the same
# time at 4K and at 128K tokens; each gives the states it allows at the constraint's vocabulary size.
# New states a mask call may add to its request's explored set: 128 at 4K tokens, 4 at 128K (EXPAND_S = 5 ms used to
# bound the same by the clock: about 5-10 new transitions at 128K; so which states a call explored followed the load).
EXPAND_WORK = 128 * 4096
# States of backward sets (summed over the rows) up to which a mask call computes rows other than the left
# frontier's: 4096 at 4K tokens, 128 at 128K. Past it, the open positions left keep an empty row this call (sound: no
# token is offered there this step). ROWS_S = 5 ms did the same by the clock, so which rows a step offered followed
# the load.
ROW_WORK = 4096 * 4096
# States one can-finish question of the left frontier's search may expand (SetAlgebra.finish_bounded): 256 at 4K
# tokens, 8 at 128K. FRONTIER_S = 8 ms did the same by the clock; without any bound, refuting the states of a nearly
# closed canvas walked the transitions of 14,000 states (9 s at 128K tokens) in one call.
FINISH_WORK = 256 * 4096
# States the left frontier's search may expand in one mask call between the frontier and the last committed position
# (each before an open position: its token transitions are a trie walk; before a committed one a token step is not
# counted) and in its can-finish questions right of it (the states their breadth-first searches expand, memoised or
# not): 2048 at 4K tokens, 64 at 128K. Its questions (does this successor of the frontier's state complete the
# canvas?) are taken in a canonical order (SetAlgebra.succ_canonical), so what the allowance decides is the same with
# a cold or a warm automaton; a question left undecided is left out (sound) and a row left empty gets the first witness
# in the same order, unbounded. Unbounded, refuting the successors that committed tokens further right exclude walked
# 13,000-15,000 new states (2 s, the call limit, at 128K tokens) in one call; 32 states at 128K (1024 x 4096) left
# one JSONSchemaBench walk of 36 without its instance's token at 20 retries (docs/measurements.md).
FRONTIER_WORK = 2048 * 4096
# A mask call on the canvas of the previous one, whose frontier search the allowance cut, doubles that search's
# allowance, up to this factor: asked again, the row gets more complete (the proofs found before are memoised too)
FRONTIER_RETRY_MAX = 8
# expand_budget's default: EXPAND_WORK at the constraint's vocabulary size
AUTO = -1


def work_states(work: int, vocab_size: int, least: int) -> int:
    """The states a token-step allowance `work` gives at `vocab_size` tokens (at least `least`)."""
    return max(least, work // max(1, vocab_size))
# States a request's explored set may hold (set_algebra.Budget.known): past it, calls add no state ahead of what their
# own answer needs (the left frontier's search, the spine, verified commits), and masks come from the explored states
# (sound subsets; the left frontier's row is never empty while a completion exists). Per request, so that it does not
# depend on what other requests explored (the automaton-wide memory bound, set_algebra.EXPLORE_MAX_BYTES, only decides
# when the compile cache compiles the constraint afresh: CompiledConstraint.worn_out).
EXPLORE_MAX_STATES = 8192
# States of the frontier's forward set up to which the prefix hint (prefix_forced_token) computes their transitions
# (a few trie walks; past it only the request's explored states answer)
HINT_STATES = 8

def common_prefix(a: tuple, b: tuple, limit: int) -> int:
    """The length (at most `limit`) of the common prefix of a and b, by bisection over slice comparisons (each a
    C-level loop): a per-call Python loop over hundreds of committed positions cost more than the sets' lookups."""
    if a[:limit] == b[:limit]:
        return limit
    lo, hi = 0, limit  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class Analysis:
    """The sets of one call on canvas c: F[0..] forward (extended on demand), B[0..H] backward. B[i] for i <= J + 1
    (J the last committed position) is computed at once (the backward chain needs it); right of it every position
    is open and B[i] is `finishers(F[i], n - i)`, a property of F[i] alone, computed when a row asks for it
    (`CanvasState._b`): a mask call that defers the far rows (ROW_WORK) no longer decides, for every state of their
    forward sets, whether it can finish."""

    __slots__ = ("canvas", "F", "B", "H", "J")

    def __init__(self, canvas: tuple, F: list, B: list, H: int, J: int = -1):
        self.canvas = canvas
        self.F = F
        self.B = B  # None: not computed yet (only right of J + 1)
        self.H = H
        self.J = J


class CanvasState:
    """CanvasConstraint for one request (one canvas length) of a regular compiled constraint."""

    def __init__(self, algebra: SetAlgebra, canvas_len: int, mask_id: int | None, vocab_size: int,
                 expand_budget: int | None = AUTO, timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S,
                 kind: str = "regex"):
        # per call: at most expand_budget new states in the request's explored set (None: unlimited, always exact;
        # AUTO: EXPAND_WORK at this vocabulary size)
        self.expand_budget = work_states(EXPAND_WORK, vocab_size, 4) if expand_budget == AUTO else expand_budget
        self.row_states = work_states(ROW_WORK, vocab_size, 64)  # ROW_WORK at this vocabulary size
        self.finish_states = work_states(FINISH_WORK, vocab_size, 8)  # FINISH_WORK at this vocabulary size
        # FRONTIER_WORK at this vocabulary size, for the frontier search's call and each of its questions alike (the
        # first questions in the canonical order, those nearest to acceptance, may take it all)
        self.frontier_call_states = self.question_states = work_states(FRONTIER_WORK, vocab_size, 16)
        # per call: the last-resort time limit (None = unbounded), see "Time bounds" in docs/constraints.md
        self.timeout_s = timeout_s
        self.kind = kind
        self.deadline_hits = 0  # calls whose deadline fired (each raised ConstraintTimeoutError)
        self.rows_deferred = 0  # open non-frontier rows left empty by a mask call past ROW_WORK
        self.frontier_undecided = 0  # frontier rows the search's allowances left smaller (sound)
        self.frontier_searched = 0  # of those, rows left empty: their first witness searched without a bound
        self._known = 0  # the request's explored set (set_algebra.Budget.known), carried from call to call
        # sound rows of the last mask call: (canvas, {position: mask row}); a token in one is verified. The rows
        # are bool (allowed_tokens) or packed bitmask bytes (fill_token_bitmask); kernels.bitmask.row_allows reads both
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
        self._frontier_memo = FrontierMemo()  # the exact frontier's memo, kept across calls (canvas_frontier.py)
        self._bounded_memo = FrontierMemo()  # the bounded frontier searches' proofs, kept across calls
        # (canvas, allowance factor) of the last frontier search the allowance cut: asked again on the same canvas, the
        # search gets twice the allowance, up to FRONTIER_RETRY_MAX times (a function of the request's own calls)
        self._frontier_retry: tuple[tuple, int] | None = None
        self._fwd: list[int] = [START_BIT]
        self._fwd_ok: list[bool] = [True]
        # the last exact frontier hint: (transitions known then, the committed prefix, its answer)
        self._hint_memo: tuple[int | None, tuple, int | None] | None = None
        # the last analysis' backward chain: (its canvas, its B list, the lowest open position its walk met)
        self._back_memo: tuple[tuple, list, int] | None = None
        self._no_certified = [0] * (self.n + 2)  # backward sets of no state (a witness search without certificates)

    # ------------------------------------------------------------------ helpers
    def _norm(self, canvas: Sequence[int]) -> tuple:
        if isinstance(canvas, torch.Tensor):
            canvas = canvas.tolist()
        if len(canvas) != self.n:
            raise InvalidRequestError(f"the canvas has {len(canvas)} positions, but this constraint state was "
                                      f"made for a canvas of {self.n} positions")
        m = self.mask_id
        return tuple([None if c == m else int(c) for c in canvas])

    def _forward(self, c: tuple, upto: int, extend: bool = False) -> list[int]:
        """F[0..upto] for canvas c, reusing the previous call's prefix (up to the first entry that was
        computed under a budget cut, so that sets grow back to exact as transitions become known).
        extend=True: the same call asks further on the same canvas: the entries it has are kept as they are."""
        prev = self._fwd_canvas
        F = self._fwd
        ok = self._fwd_ok
        if extend and prev is c:
            pass
        elif prev is not None:
            lim = min(len(F) - 1, upto)
            try:
                exact_upto = ok.index(False, 1) - 1  # F entries after a budget cut are recomputed
            except ValueError:
                exact_upto = lim
            k = min(common_prefix(prev, c, lim), exact_upto)
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
        return last_committed(c)

    def _analyze(self, c: tuple, horizon: int) -> Analysis:
        J = self._last_committed(c)
        H = min(max(J + 1, horizon), self.n)
        F = self._forward(c, J + 1)
        alg = self.alg
        B: list[int | None] = [0] * (J + 1) + [None] * (H - J)
        # right of the last committed position everything is open: membership in B is "can finish in
        # the positions left", a property of the state alone (no backward chain needed); B[i] for i > J + 1 is
        # computed on demand (_b)
        B[J + 1] = alg.finishers(F[J + 1], self.n - J - 1, self._budget)
        back_open, back_tok = alg.back_open, alg.back_tok
        # The committed prefix's chain is the previous call's from the first position down to which both canvases
        # agree, hold only committed tokens, and meet the same B[i + 1]: B[0..i] is then a function of identical
        # inputs through exact token steps (F[0..i] agree too), and semi-autoregressive blocks leave hundreds of
        # such positions behind the block, each a memo lookup per call otherwise.
        prev_c, prev_B, reuse_below = self._back_memo or ((), [], 0)
        lowest_open = J + 1  # everything right of J is open
        for i in range(J, -1, -1):
            nb = B[i + 1]
            if not nb:
                break  # B[<=i] all empty
            if i < reuse_below and prev_B[i + 1] == nb and c[: i + 1] == prev_c[: i + 1]:
                B[: i + 1] = prev_B[: i + 1]
                break
            ci = c[i]
            if ci is None:
                lowest_open = i
                B[i] = back_open(F[i], nb, self._budget)
            else:
                B[i] = back_tok(F[i], ci, nb)
        self._back_memo = (c, B, lowest_open)
        return Analysis(c, F, B, H, J)

    def _b(self, an: Analysis, i: int) -> int:
        """B[i] of the analysis, computed now if it is right of J + 1 and not yet known."""
        v = an.B[i]
        if v is None:
            F = self._forward(an.canvas, i, extend=True)
            an.F = F
            v = an.B[i] = self.alg.finishers(F[i], self.n - i, self._budget)
        return v

    def _all_b(self, an: Analysis) -> list[int]:
        """Every B[0..H] of the analysis (computing those not known yet)."""
        return [self._b(an, i) for i in range(an.H + 1)]

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

    def _completable_exact(self, c: tuple) -> bool:
        """Whether canvas c is completable, exactly: the forward set at the left frontier f (every position before
        it committed: exact and cheap), then a depth-first search for one completion from its states
        (canvas_frontier.FrontierSearch, memoised across calls). The forward sets through the open positions, which
        the exact answer used to compute whole, reach thousands of states on wide schemas, each needing its token
        transitions; one witness needs the states of one path."""
        if c in self._proven:
            return True
        alg = self.alg
        f = first_open(c)
        F = START_BIT
        for i in range(self.n if f is None else f):
            F = alg.step_tok(F, c[i])
            if not F:
                return False
        if f is None:
            ok = alg.any_accepting(F)
        else:
            search = FrontierSearch(alg, self.n, c, self._no_certified, -1, self._frontier_memo.for_canvas(c),
                                    self._finish_states())
            ok = any(search.good(q, f) for q in alg.members(F))
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
        """The call's budget: `expand_budget` new states for the request's explored set, none once it holds
        EXPLORE_MAX_STATES (no budget without expand_budget: exact)."""
        if self._budget is not None:
            self._known = self._budget.known  # what the previous call explored
        if self.expand_budget is None:
            self._budget = None
        else:
            n = self.expand_budget if self._known.bit_count() < EXPLORE_MAX_STATES else 0
            self._budget = Budget(n, self._known)

    def _explored(self) -> int | None:
        """The request's explored set as the rows read it (None without a budget: every state is followed)."""
        if self.expand_budget is None:
            return None
        return self._budget.known if self._budget is not None else self._known

    # ------------------------------------------------------------------ time bounds
    def _call(self, operation: str, c: tuple | None = None) -> CallDeadline:
        where = (lambda: self._where(c)) if c is not None else None
        return CallDeadline(self.timeout_s, self.kind, operation, where)

    def _where(self, c: tuple) -> str:
        """The request-level location for a timeout message: the canvas frontier and, for JSON, the instance
        location (JSON pointer) of the value being written there."""
        frontier = first_open(c)
        if frontier is None:
            return f"a full canvas of {self.n} positions"
        s = f"canvas frontier at position {frontier} of {self.n}"
        if self.kind == "json_schema":
            tb = self.ta.tok.token_bytes
            data = b"".join(tb[t] or b"" for t in c[:frontier] if t != self.eos and 0 <= t < len(tb))
            s += f", instance location {json_pointer_of_prefix(data.decode('utf-8', 'replace'))!r}"
        return s

    # ------------------------------------------------------------------ protocol
    def fill_token_bitmask(self, canvas: Sequence[int], positions: Sequence[int], out: torch.Tensor) -> None:
        """The masks as rows 0..len(positions)-1 of the token bitmask `out` (protocol.CanvasConstraint), under the
        call's deadline exactly as `allowed_tokens`. The certificate refers to the rows written (the algebra's cached
        rows, never modified), not to `out`: the caller owns `out` and goes on narrowing (base mask, banned pairs) or
        reusing it."""
        positions = [int(p) for p in positions]
        o = bitmask_bytes(out[:len(positions)])
        o[:] = 0
        self._masks_into(self._norm(canvas), positions, o)

    def allowed_tokens(self, canvas: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Bool [len(positions), vocab_size]: the rows `fill_token_bitmask` writes, unpacked."""
        positions = [int(p) for p in positions]
        out = torch.zeros((len(positions), self.vocab_size), dtype=torch.bool)
        self._masks_into(self._norm(canvas), positions, out.numpy())
        return out

    def _masks_into(self, c: tuple, positions: list[int], o: np.ndarray) -> None:
        """Masks under the call's deadline into the zeroed mask rows `o` (bool [n, V] or bitmask bytes [n, 4 W]).
        When the deadline fires the call raises ConstraintTimeoutError (the request ends): a mask is never answered
        from what the clock left time for."""
        if not positions:
            return
        for p in positions:
            if not 0 <= p < self.n:
                raise IndexError(f"position {p} outside the canvas of length {self.n}")
        frontier = first_open(c)
        done: dict[int, bool] = {}  # row index -> its row is final and sound
        written: dict[int, np.ndarray] = {}  # row index -> the (cached, never modified) row written there
        self._certified = None
        with activate(self._call("allowed_tokens", c)):
            try:
                self._allowed_into(c, positions, frontier, o, done, written)
            except ConstraintTimeoutError:
                self.deadline_hits += 1
                raise
        # the sound rows of the open positions, by reference: the caller owns `o` and goes on narrowing or reusing it
        self._certified = (c, {positions[j]: written[j] for j, ok in done.items() if ok and j in written})

    def _allowed_into(self, c: tuple, positions: list[int], frontier: int | None, o: np.ndarray,
                      done: dict[int, bool], written: dict[int, np.ndarray]) -> None:
        """The rows, the left frontier's first (searched: never empty while a completion exists, so the engine always
        has a position to commit; every token of every valid completion when the search fits FRONTIER_WORK), then the
        other open positions' (sound, possibly missing tokens under the budget) while their backward sets hold at most
        ROW_WORK states in all: those left after it stay empty this call (sound; `rows_deferred` counts them) and are
        filled by later calls, whose explored set is larger (in exact mode, without a budget, every row is computed)."""
        self._new_budget()
        work_left = None if self._budget is None else self.row_states
        an = self._analyze(c, max(positions) + 1)
        B = an.B
        if B[0]:
            self._prove(c)
        b = self._b
        V = self.vocab_size
        row_within = self.alg.row_within
        packed = o.dtype == np.uint8 and o.shape[1] == (V + 7) // 8  # rows copied as they are cached
        order = sorted(range(len(positions)), key=lambda j: positions[j] != frontier)  # the frontier first (stable)
        for j in order:
            p = positions[j]
            if c[p] is not None:
                # committed position: only its own token keeps the canvas as it is
                if B[0] and 0 <= c[p] < V:
                    set_token(o[j], c[p])
                done[j] = True
                continue
            if p != frontier and work_left is not None and work_left <= 0:
                self.rows_deferred += 1
                continue
            bi = B[p] if p < len(B) and B[p] is not None else b(an, p)
            bn = (B[p + 1] if p + 1 < len(B) and B[p + 1] is not None else b(an, p + 1)) if bi else 0
            if p != frontier and work_left is not None:
                work_left -= bi.bit_count()
            if bi and bn:
                row = written[j] = row_within(bi, bn, V, self._explored())
                if packed and row.shape[0] == o.shape[1]:
                    o[j] = row
                else:
                    write_row(o[j], row)
                done[j] = True  # sound; at the frontier it stands if the exact decision below runs out of time
            if p == frontier and self._budget is not None and (self._budget.cuts or not o[j].any()):
                # the budget cut part of the sets: the frontier row may miss tokens; decided exactly
                self.exact_fallbacks += 1
                bi, bn = self._frontier_sets(c, frontier, an)
                row = self.alg.row(bi, bn, V) if (bi and bn) else None
                write_row(o[j], row)
                written.pop(j, None)
                if row is not None:
                    written[j] = row
                    self._prove(c)
                done[j] = True
            if p == frontier == 0 and not o[j].any() and c.count(None) == self.n:
                # the frontier row is empty only when the exact one is, so an empty one on an all-open canvas proves
                # that no output fits: the fit check of new_canvas_state decides without a search and lets an undecided
                # canvas length in
                raise ConstraintTooLongError(self.n + 1, self.n)
            done.setdefault(j, True)

    def _frontier_sets(self, c: tuple, f: int, an: Analysis) -> tuple[int, int]:
        """(B[f], B[f+1]) at the left frontier f (canvas_frontier.py): exact but for the questions FRONTIER_WORK and
        FINISH_WORK leave undecided (left out: sound); when that leaves no token, the first witness in the same
        canonical order, searched without a bound (empty only when the exact row is)."""
        known = [0 if x is None else x for x in an.B]  # sets not computed certify nothing (the search decides)
        retry = self._frontier_retry
        factor = min(2 * retry[1], FRONTIER_RETRY_MAX) if retry is not None and retry[0] == c else 1
        search = FrontierSearch(self.alg, self.n, c, known, an.H, self._bounded_memo.for_canvas(c),
                                self._finish_states(), factor * self.question_states,
                                factor * self.frontier_call_states)
        bi, bn = search.sets(an.F[f], f)
        self._frontier_retry = (c, factor) if search.undecided else None
        if search.undecided:
            self.frontier_undecided += 1
            if not (bi and bn):
                # the bound left the frontier without a token: the first witness in the same canonical order, searched
                # without a bound and with exact can-finish answers (the engine must have a token to commit where
                # one exists; a row of one completion's token is sound, and empty only when no completion exists), at
                # whatever cost, the call's deadline the last resort
                self.frontier_searched += 1
                witness = FrontierSearch(self.alg, self.n, c, known, an.H, self._bounded_memo.for_canvas(c), None,
                                         UNLIMITED, None)
                bi, bn = witness.sets(an.F[f], f, first_only=True)
        return bi, bn

    def _finish_states(self) -> int | None:
        """The frontier search's states per can-finish question (None in exact mode: exact)."""
        return None if self.expand_budget is None else self.finish_states

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
                # "not completable" decides a backtrack: make sure, exactly
                self.exact_fallbacks += 1
                return self._completable_exact(c)
            except ConstraintTimeoutError:
                self.deadline_hits += 1
                raise

    def select_commits(self, canvas: Sequence[int], proposals: Sequence[tuple[int, int, float]]) -> list[tuple[int, int]]:
        """Under the call's deadline; when it fires, ConstraintTimeoutError (never fewer commits than the work
        decides, which would make the answer follow the clock). Never an unverified commit."""
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
                    self.exact_fallbacks += 1
                    self._greedy_commits(c, proposals, order, True, kept, exact=True)
            except ConstraintTimeoutError:
                self.deadline_hits += 1
                raise
        return kept

    def _greedy_commits(self, c: list, proposals: Sequence[tuple[int, int, float]], order: list[int],
                        first_only: bool, kept: list[tuple[int, int]], exact: bool = False) -> list[tuple[int, int]]:
        """Commit the proposals in `order` onto c, each kept (appended to `kept` at once, so that a deadline
        leaves the verified ones) iff the canvas stays completable (`exact`: decided by the witness search)."""
        completable = self._completable_exact if exact else self._completable
        # the first commit onto the canvas of the last mask call needs no search when its token is in that call's
        # sound row there: such a row allows only tokens that, committed alone, keep the canvas completable
        cert = self._certified
        rows = cert[1] if cert is not None and not kept and cert[0] == tuple(c) else None
        for k in order:
            p, t, _ = proposals[k]
            p, t = int(p), int(t)
            if not 0 <= p < self.n or c[p] is not None or t == self.mask_id:
                continue
            c[p] = t
            row = rows.get(p) if rows is not None and not kept else None
            if row is not None and row_allows(row, t):
                self._prove(tuple(c))
                kept.append((p, t))
                if first_only:
                    break
                continue
            try:
                ok = completable(tuple(c))
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
        """Under the call's deadline; when it fires, ConstraintTimeoutError."""
        c = self._norm(canvas)
        with activate(self._call("forced_tokens", c)):
            try:
                return self._forced(c)
            except ConstraintTimeoutError:
                self.deadline_hits += 1
                raise

    def _forced(self, c: tuple) -> dict[int, int]:
        self._new_budget()
        an = self._analyze(c, self.n)
        B = self._all_b(an)
        out: dict[int, int] = {}
        if not B[0]:
            return out
        for i in range(self.n):
            if c[i] is not None:
                continue
            cnt, tok, eos_ok = self.alg.count(B[i], B[i + 1], self._explored())
            if eos_ok:
                if cnt == 0:
                    out[i] = self.eos
                continue
            if cnt == 1:
                out[i] = tok
        return out

    # ------------------------------------------------------------------ CanvasConstraint (protocol.py)
    @property
    def canvas_len(self) -> int:
        return self.n

    offers_prefix_hint = True

    def shared_state(self) -> SetAlgebra:
        """The compiled constraint's set algebra (its automaton and memo tables), shared by its requests."""
        return self.alg

    def prefix_hint(self, canvas: Sequence[int], position: int) -> int | None:
        """The token the committed prefix alone forces at `position` when it is the left frontier (the first open
        position): the only token of the left-to-right prefix row there (EOS included), from transitions already
        known; None when the prefix allows several tokens, when `position` is not the frontier, or when deciding it
        would need new work (an unknown transition). No call deadline, no budget, no exploration: a cheap hint.

        Why it is enough: the prefix row is a superset of the canvas mask at the frontier, and the canvas is kept
        completable, so a single prefix token is the frontier's forced token. The converse does not hold (committed
        tokens to the right can force a position the prefix leaves free): the engine uses the hint only to choose
        between committing forced tokens before the forward and computing the masks beside it, and either choice
        keeps every commit verified."""
        view = canvas.tolist() if isinstance(canvas, torch.Tensor) else canvas
        if len(view) != self.n:
            self._norm(view)  # raises the canvas-length error
        m = self.mask_id
        if not 0 <= position < self.n or view[position] != m:
            return None
        prefix = tuple(map(int, view[:position]))
        if m in prefix:  # an open position left of it: not the frontier
            return None
        # the answer depends on the prefix and on the request's explored set (it never computes a transition; the
        # automaton's other known states do not count, so the hint is the same whatever other requests explored), so
        # an unchanged prefix with nothing explored since answers as before: a request whose frontier stays put over
        # steps asks once
        known = self._explored()
        memo = self._hint_memo
        if memo is not None and memo[0] == known and memo[1] == prefix:
            return memo[2]
        # the positions right of the frontier do not enter its forward set: left open, the canvas costs no pass
        c = prefix + (None,) * (self.n - position)
        F = self._forward(c, position)[position]  # every position before it is committed: exact token steps
        token = self._single_prefix_token(F, known)
        if self._fwd_ok[position]:
            self._hint_memo = (known, prefix, token)
        return token

    prefix_forced_token = prefix_hint  # the name the engine looks up while it still probes for the hint

    def _single_prefix_token(self, F: int, known: int | None) -> int | None:
        """The only token the states of forward set F allow next by their transitions (EOS when one of them
        accepts), or None when they allow several or none, or when F holds more than HINT_STATES states and one of
        them is outside the request's explored set `known` (None: exact mode). A function of F and `known`: the
        transitions other requests had the automaton compute do not enter it."""
        if not F:
            return None
        alg = self.alg
        few = F.bit_count() <= HINT_STATES
        token: int | None = self.eos if alg.any_accepting(F) else None  # EOS ends an accepted text
        for q in alg.members(F):
            if q == ENDED:
                continue  # after an EOS only EOS follows
            if known is None or few or (known >> q) & 1:
                tt = self.ta.trans(q)  # computed if need be (exact mode, or a small set: a few trie walks at most)
            else:
                tt = None
            if tt is None or tt.n_allowed > 1:
                return None
            if tt.n_allowed == 1:
                if tt.all_sparse is None or tt.all_sparse.size != 1:
                    return None
                t = int(tt.all_sparse[0])
                if token is not None and t != token:
                    return None
                token = t
        return token

    # ------------------------------------------------------------------ extras
    def allowed_sets(self, canvas: Sequence[int]) -> list[set[int] | None]:
        """Test helper: allowed token ids per position (None for committed positions)."""
        c = self._norm(canvas)
        self._new_budget()
        an = self._analyze(c, self.n)
        B = self._all_b(an)
        res: list[set[int] | None] = []
        for i in range(self.n):
            if c[i] is not None:
                res.append(None)
            elif not B[i] or not B[i + 1]:
                res.append(set())
            else:
                res.append(set(row_tokens(self.alg.row_within(B[i], B[i + 1], self.vocab_size,
                                                              self._explored())).tolist()))
        return res
