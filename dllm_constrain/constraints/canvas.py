"""Exact per-position masks on a fixed-length canvas for a regular constraint: `CanvasState`, one per request.

Canvas c[0..n-1]: each position open (mask_id) or committed. Automaton states are the DFA states plus ENDED ("an
EOS has been emitted"); state sets are int bitsets (set_algebra.py). Forward sets F[i+1] = step(F[i], c[i]);
backward sets B[i], restricted to reachable states, keep the members that can still finish:

    token t allowed at open i  iff  some q in B[i] has delta(q, t) in B[i+1]
    the canvas is completable  iff  B[0] is non-empty

Map: `_analyze` (the sets of one call, reused across calls from the first changed position), `_allowed_into` (mask
rows into the packed token bitmask), `_frontier_sets` (the left frontier decided by a witness search,
canvas_frontier.py), `select_commits` / `is_completable` (joint verification, redone exactly when a budget left a
call inconclusive), `prefix_hint` (the frontier's forced token from the committed prefix alone).

Each call adds at most `expand_budget` states to its request's explored set and computes rows within the work
allowances of call_bounds.py: sets cut short are sound subsets, the left frontier's row is never empty while a
completion exists, and answers depend on work, never on the clock. docs/constraints.md, "Canvas algorithm",
"Reproducibility" and "Time bounds", has the whole argument.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

from dllm_constrain.kernels.bitmask import bitmask_bytes, row_allows, row_tokens, set_token, write_row

from ..errors import ConstraintTimeoutError, ConstraintTooLongError, InvalidRequestError
from .canvas_hint import PrefixHint
from .canvas_frontier import FrontierMemo, FrontierSearch, first_open, last_committed
from .deadline import CallDeadline, activate
from .json_pointer import json_pointer_of_prefix
from .protocol import CanvasConstraint
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

from .call_bounds import (  # noqa: F401  (re-exported: canvas.py was their home)
    AUTO,
    DEFAULT_CALL_TIMEOUT_S,
    EXPAND_WORK,
    EXPLORE_MAX_STATES,
    FINISH_WORK,
    FRONTIER_RETRY_MAX,
    FRONTIER_WORK,
    ROW_WORK,
    work_states,
)


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


class CanvasState(PrefixHint, CanvasConstraint):
    """CanvasConstraint for one request (one canvas length) of a regular compiled constraint; its prefix hint is
    canvas_hint.py's."""

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
