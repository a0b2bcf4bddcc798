"""Set-level steps of the canvas automaton for one compiled regular constraint, memoised and shared by its canvases.

The canvas analysis (canvas.py) moves *sets* of token-automaton states across positions. A set is a Python int
used as a bitset: bit q = DFA state q, and bit 0 (DEAD never belongs to a set) stands for ENDED ("an EOS has been
emitted"). `SetAlgebra` does every set-level operation on them, each a few big-int operations, memoised per
compiled constraint so that a canvas changing by a few commits per step recomputes little:

  step_open / step_tok      forward over an open position / a committed token;
  back_open / back_tok      the backward restriction (members whose step meets the next backward set);
  finishers / finish3       which states can reach acceptance within m more positions (exact, or by
                            finish_cheap under a budget; the per-state questions are set_finish.py's);
  row / count               the mask row between two sets (packed token bitmask bytes) / its size capped at 2.

`Budget` bounds, in states, what one call may add to its request's explored set (never in seconds, and
independently of what the shared transition cache already holds); a set computed through part of its members
counts as a cut of the call (see canvas.py's docstring, "Expansion budget").
"""
from __future__ import annotations

from array import array
from collections import OrderedDict

import numpy as np

from . import _cwalk
from .deadline import check_active
from .deriv import DEAD, START
from .set_finish import ENDED, FinishQuestions
from .token_automaton import TokenAutomaton, as_bytes, bits_from, bits_of

ENDED_BIT = 1  # ENDED's bit (set_finish.ENDED = 0)
START_BIT = 1 << START


class Budget:
    """The work one budgeted call may do, counted in states, never in seconds: the call's answer is then a function of
    the constraint, the canvas and its request's own history, the same on an idle or a loaded machine, from any
    thread, and whatever other requests cached before.

    `known` is the request's explored set (a bitset): the states whose token transitions the request's sets follow.
    A set with members outside it takes them all in when `left` (the new states the call may still add) covers them,
    else none (all or nothing, so that the choice depends on the set and not on the automaton's state numbering,
    which follows the order in which requests discovered the states); the automaton's shared transition cache only
    makes following a state cheaper. `cuts` counts the set-level results of the call computed through part of their
    members (while 0, every set of the call is exact)."""

    __slots__ = ("left", "known", "cuts")

    def __init__(self, n: int | None = None, known: int = 0):
        self.left = UNLIMITED if n is None else n
        self.known = known
        self.cuts = 0

    def admit(self, out: int) -> bool:
        """Take every state of bitset `out` (none of them in `known`) into the explored set if `left` covers them all."""
        k = out.bit_count()
        if k > self.left:
            return False
        self.left -= k
        self.known |= out
        return True


UNLIMITED = 1 << 62
# The states a budgeted forward step follows past its allowance to keep a spine (the members of minimal distance to
# acceptance, all or none), in token-steps: 256 at 4K tokens, 8 at 128K. Unbounded, one mask call walked the token
# transitions of 397 such states (0.7 s at 128K tokens); past it the step is empty (sound: the left frontier's row is
# searched, never empty while a completion exists).
SPINE_WORK = 256 * 4096


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


# Bytes of packed mask rows one compiled constraint keeps (SetAlgebra.rows)
ROW_CACHE_BYTES = 16 << 20
# Memory (bytes, TokenAutomaton.footprint_bytes) of a compiled constraint's automaton, which every request of the
# constraint shares and which never shrinks (a 10,000-state schema holds about 80 MB with a 4K vocabulary, more at
# 128K): past twice this the compile cache compiles the constraint afresh for the next request
# (CompiledConstraint.worn_out). It decides no mask: that would make a request's masks depend on what other requests
# explored; each request's exploration is bounded by its own explored set (canvas.EXPLORE_MAX_STATES).
EXPLORE_MAX_BYTES = 128 << 20


class SetAlgebra(FinishQuestions):
    """Memoised set-level steps for one compiled constraint (shared by all its canvases); its can-finish questions
    are set_finish.py's."""

    def __init__(self, ta: TokenAutomaton):
        self.ta = ta
        self.dfa = ta.dfa
        self.eos = ta.eos_id
        self._bits: dict[int, list[int]] = {}
        self._open: dict[int, int] = {}
        self._tok: dict[tuple[int, int], int] = {}
        self._back_open: dict[tuple[int, int], int] = {}
        # sets computed through part of their members (a budget left some unknown): the result so far and the
        # members still to look at, so that a later call only looks at those (the transition cache only grows)
        self._open_part: dict[int, tuple[int, bool, list[int]]] = {}
        self._back_part: dict[tuple[int, int], tuple[int, list[int]]] = {}
        # budgeted can-finish sets (finish_cheap): (F, m) -> (the members proven, whether some were left undecided)
        self._fin_cheap: dict[tuple[int, int], tuple[int, bool]] = {}
        # finish_bounded: (state, m, states) -> True / False / None
        self._fin_bounded: dict[tuple[int, int, int], tuple[bool | None, int]] = {}
        self._back_tok: dict[tuple[int, int, int], int] = {}
        # can-finish memo per state, as int32 arrays indexed by state (Python reads them like lists, the native
        # `finish_split` as buffers): the largest m known not to suffice (-1: none) and the smallest m known to suffice
        # (set_finish._NO_TRUE: none); states past an array's end have neither
        self._fin_false = array("i")
        self._fin_true = array("i")
        native = _cwalk.load() if ta.row_store is not None else None
        self._finish_split = native.finish_split if native is not None else None
        # a committed token's backward step walked in C over the byte DFA's expanded rows (tables DFAs only)
        self._back_tok_walk = native.back_tok_walk if native is not None and hasattr(ta.dfa, "T") else None
        self._fin_sets: dict[tuple[int, int], int] = {}
        self._succ_sorted: dict[int, list[int]] = {}
        self._succ_canonical: dict[int, list[int]] = {}
        self._greedy: dict[int, int] = {}
        self._greedy_step: dict[int, tuple[int, int]] = {}
        self.explore_max_bytes = EXPLORE_MAX_BYTES  # see EXPLORE_MAX_BYTES
        self.rows: OrderedDict = OrderedDict()  # mask-row cache: (Bi, Bn) -> packed row (kernels.bitmask bytes)
        # rows kept: a byte budget, so that every request of a busy schema finds its rows again (a row is
        # ceil(V / 8) bytes: about 1,000 rows at 128K tokens, 30,000 at 4K), and at least 64
        self.max_rows = max(64, ROW_CACHE_BYTES // max(1, (ta.vocab_size + 7) // 8))
        # frontier rows of canvases open right of the frontier: (F, m) -> packed row or None (left_to_right_row;
        # cleared when it outgrows its bound)
        self._lr_rows: dict[tuple[int, int], np.ndarray | None] = {}

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

    def exploration_full(self) -> bool:
        """Whether the automaton holds its memory allowance (EXPLORE_MAX_BYTES). It decides no mask (each request's
        exploration is bounded by its own explored set, canvas.EXPLORE_MAX_STATES); CompiledConstraint.worn_out
        has the compile cache compile the constraint afresh past twice the allowance."""
        return self.ta.footprint_bytes() >= self.explore_max_bytes

    # ------------------------------------------------------------------ forward
    def known(self, q: int) -> bool:
        return q in self.ta.succ_bits

    def step_open(self, F: int, budget: Budget | None = None) -> int:
        """The forward step over an open position: exact without a budget; with one, through the members of F in the
        request's explored set (`Budget.known`, which takes in F's other members when the call's allowance covers
        them all), plus a spine when that leaves nothing (see `_step_budgeted`)."""
        if budget is None:
            return self._step_open_all(F)
        return self._step_budgeted(F, budget)

    def _step_budgeted(self, F: int, budget: Budget) -> int:
        out = F & ~budget.known & ~ENDED_BIT
        if not out or budget.admit(out):
            return self._step_open_all(F)
        budget.cuts += 1
        inside = F & ~out
        r = self._step_open_all(inside) if inside else 0
        acc = self.dfa.accepting
        outside = self.members(out)
        if any(acc[q] for q in outside):
            r |= ENDED_BIT  # an accepting member ends with EOS (no token transitions needed)
        if not r:
            # keep a spine: follow the members closest to acceptance even past the allowance (all of them, so that
            # the choice does not depend on the state numbering), when they are at most SPINE_WORK token-steps' worth
            dist = self.dfa.dist
            d = min(int(dist[q]) for q in outside)
            spine = [q for q in outside if int(dist[q]) == d]
            if len(spine) <= max(4, SPINE_WORK // max(1, self.ta.vocab_size)):
                for q in spine:
                    r |= self.ta.trans(q).succ_bits
        return r

    def _step_open_all(self, F: int) -> int:
        """The exact forward step over an open position through every member of F (memoised)."""
        r = self._open.get(F)
        if r is not None:
            return r
        part = self._open_part.get(F)
        rs = self.ta.row_store
        if part is None and rs is not None:
            # first visit, in C: the known members' successors at once; only the unknown ones are looked at below
            data, todo, any_acc = rs.step_open(as_bytes(F), self.dfa.accepting)
            r, ended = int.from_bytes(data, "little"), bool(F & ENDED_BIT) or any_acc
        elif part is None:
            # first visit: every member; ENDED joins when F holds ENDED or an accepting state
            acc = self.dfa.accepting
            ended = bool(F & ENDED_BIT) or any(acc[q] for q in self.members(F) if q != ENDED)
            r, todo = 0, [q for q in self.members(F) if q != ENDED]
        else:
            r, ended, todo = part
        trans = self.ta.trans
        sget = self.ta.succ_bits.get
        for chunk in checked_chunks(todo):
            for q in chunk:
                sb = sget(q)
                if sb is None:
                    try:
                        sb = trans(q).succ_bits
                    except BaseException:
                        # a call deadline fired mid-set: keep what is done, the rest is looked at next time
                        self._remember_part(self._open_part, F, (r, ended, todo[todo.index(q):]))
                        raise
                r |= sb
        self._open_part.pop(F, None)
        if ended:
            r |= ENDED_BIT
        self._open[F] = r
        return r

    @staticmethod
    def _remember_part(memo: dict, key, value) -> None:
        """Keep a result computed through part of its members (with the members still to look at), bounded."""
        if len(memo) > 50_000:
            memo.clear()
        memo[key] = value

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
        unknown counts as a cut of `budget`'s call, and is the only one looked at again when (F, X) comes back)."""
        if budget is not None:
            inside = F & (budget.known | ENDED_BIT)
            if inside != F:
                # members outside the request's explored set are not followed (sound), except into ENDED by EOS
                budget.cuts += 1
                r = self.back_open(inside, X) if inside else 0
                if X & ENDED_BIT:
                    acc = self.dfa.accepting
                    r |= sum(1 << q for q in self.members(F & ~inside) if acc[q])
                return r
        key = (F, X)
        r = self._back_open.get(key)
        if r is not None:
            return r
        sget = self.ta.succ_bits.get
        part = self._back_part.get(key)
        rs = self.ta.row_store
        if part is None and rs is not None:
            # first visit, in C: ENDED, accepting and known members decided at once; the unknown ones below
            data, todo = rs.back_open(as_bytes(F), as_bytes(X), self.dfa.accepting, bool(X & ENDED_BIT))
            r = int.from_bytes(data, "little")
        elif part is None:
            acc = self.dfa.accepting
            ended_ok = bool(X & ENDED_BIT)
            r = 0
            todo: list[int] = []
            for chunk in checked_chunks(self.members(F)):
                for q in chunk:
                    if q == ENDED:
                        if ended_ok:
                            r |= ENDED_BIT
                    elif ended_ok and acc[q]:
                        r |= 1 << q
                    else:
                        todo.append(q)
        else:
            r, todo = part
        unknown: list[int] = []
        for chunk in checked_chunks(todo):
            for q in chunk:
                sb = sget(q)
                if sb is None:
                    unknown.append(q)
                elif sb & X:
                    r |= 1 << q
        if not unknown:
            self._back_part.pop(key, None)
            self._back_open[key] = r
        else:
            self._remember_part(self._back_part, key, (r, unknown))
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
            tb = self.ta.tok.token_bytes
            walk = self._back_tok_walk
            if walk is not None and 0 <= t < len(tb) and tb[t] is not None and len(self.members(F)) > 2:
                # in C through the rows expanded so far; the members whose walk needs a new row below
                dfa = self.dfa
                data, todo = walk(as_bytes(F), tb[t], as_bytes(X), dfa.T, dfa.expanded)
                r = int.from_bytes(data, "little")
            else:
                todo = [q for q in self.members(F) if q != ENDED]
            for q in todo:
                u = d(q, t)
                if u != DEAD and (X >> u) & 1:
                    r |= 1 << q
        self._back_tok[key] = r
        return r

    # ------------------------------------------------------------------ lengths
    def can_finish(self, q: int, m: int, budget: Budget | None = None) -> bool:
        """q can reach a valid end within m further (open) positions: exactly without a budget; with one, by
        `finish_cheap` (False when it does not prove it: sound)."""
        if budget is not None:
            return self.finish_cheap(q, m) is True
        return self.finish3(q, m)

    def finishers(self, F: int, m: int, budget: Budget | None = None) -> int:
        """{q in F : q can finish within m positions}: exact without a budget; with one, the members `finish_cheap`
        proves (a function of (F, m) alone; a member it leaves undecided counts as a cut of the budget's call)."""
        if budget is not None:
            r, undecided = self._finishers_cheap(F, m)
            if undecided:
                budget.cuts += 1
            return r
        key = (F, m)
        r = self._fin_sets.get(key)
        if r is not None:
            return r
        if self._finish_split is not None:
            # in C: the members the tables decide (accepting, distance, known thresholds) at once
            data, todo = self._finish_split(
                as_bytes(F), m, self.dfa.dist, self.dfa.accepting, self._fin_true, self._fin_false,
                self.ta.single_byte_complete, self.ta.max_token_len)
            r = int.from_bytes(data, "little")
        else:
            r, todo = self._finish_at_once(F, m)
        for q in todo:
            if self.finish3(q, m):
                r |= 1 << q
        self._fin_sets[key] = r
        return r

    def _finishers_cheap(self, F: int, m: int) -> tuple[int, bool]:
        """(the members of F that `finish_cheap` proves, whether it left some undecided), memoised per (F, m)."""
        key = (F, m)
        hit = self._fin_cheap.get(key)
        if hit is not None:
            return hit
        r, todo = self._finish_at_once(F, m)
        undecided = False
        for q in todo:
            f = self.finish_cheap(q, m)
            if f is True:
                r |= 1 << q
            elif f is None:
                undecided = True
        if len(self._fin_cheap) > 200_000:
            self._fin_cheap.clear()
        self._fin_cheap[key] = (r, undecided)
        return r, undecided

    def _finish_at_once(self, F: int, m: int) -> tuple[int, list[int]]:
        """(the members of F that finish within m positions by a table lookup: ENDED, accepting states and, when
        every byte is a token, states at most m bytes from acceptance; the other members), in one numpy pass for
        large sets (a Python loop over thousands of members cost more than the rest of a mask call)."""
        ms = self.members(F)
        dist = self.dfa.dist
        acc = self.dfa.accepting
        easy = self.ta.single_byte_complete
        if len(ms) > 48:
            arr = np.asarray(ms, dtype=np.int64)
            sel = acc[arr] | (arr == ENDED)
            if easy:
                sel |= dist[arr] <= m
            return bits_from(arr[sel]), arr[~sel].tolist()
        r = 0
        todo: list[int] = []
        for q in ms:
            if q == ENDED or acc[q] or (easy and int(dist[q]) <= m):
                r |= 1 << q
            else:
                todo.append(q)
        return r, todo

    # ------------------------------------------------------------------ rows
    def row(self, Bi: int, Bn: int, vocab_size: int) -> np.ndarray:
        """The mask row between Bi and Bn as packed token-bitmask bytes (uint8 [ceil(vocab_size / 8)], token t =
        bit t % 8 of byte t // 8): token t is in it iff some q in Bi reaches Bn by t (EOS: Bn holds ENDED and some
        q accepts). Packed once when computed, so a cached row is copied into a bitmask as 1/8 of the bytes."""
        key = (Bi, Bn)
        row = self.rows.get(key)
        if row is not None:
            self.rows.move_to_end(key)
            return row
        if self.ta.row_store is not None:  # built in C from the known states' transitions
            row, partial_row = self.ta.set_row(Bi, Bn)
        else:
            full, partial, eos_ok, partial_row = self._split_step(Bi, Bn)
            row = self.ta.packed_row(full, partial, eos_ok, self.members)
        row = row[: (vocab_size + 7) // 8]
        if partial_row:
            return row
        self.rows[key] = row
        if len(self.rows) > self.max_rows:
            self.rows.popitem(last=False)
        return row

    def left_to_right_row(self, F: int, m: int, vocab_size: int) -> np.ndarray | None:
        """The mask row (packed bytes; None: no token) of a position reached in forward set F with m positions
        left, itself and every one after it open: what an autoregressive sampler asks at each step. It is
        row(finishers(F, m), finishers(step_open(F), m - 1)), memoised per (F, m): a step of a request whose state
        some request met before at the same distance from the end is one dict lookup. Exact (no budget)."""
        key = (F, m)
        hit = self._lr_rows.get(key, False)
        if hit is not False:
            return hit
        here = self.finishers(F, m)
        after = self.finishers(self.step_open(F), m - 1) if here else 0
        row = self.row(here, after, vocab_size) if (here and after) else None
        if row is not None and (here, after) not in self.rows:
            return row  # built from transitions not all known (not cached by row() either)
        if len(self._lr_rows) >= 4 * self.max_rows:
            self._lr_rows.clear()
        self._lr_rows[key] = row
        return row

    def row_within(self, Bi: int, Bn: int, vocab_size: int, known: int | None) -> np.ndarray:
        """`row(Bi, Bn)` through the members of Bi in the explored set `known` (None: every member); a member outside
        it adds EOS only (its token transitions are not followed: sound), so that the row does not depend on which
        transitions other requests had the automaton compute."""
        inside = Bi if known is None else Bi & (known | ENDED_BIT)
        if inside == Bi:
            return self.row(Bi, Bn, vocab_size)
        row = self.row(inside, Bn, vocab_size) if inside else np.zeros((vocab_size + 7) // 8, dtype=np.uint8)
        e = self.eos
        if Bn & ENDED_BIT and 0 <= e < vocab_size and not (row[e >> 3] >> (e & 7)) & 1 \
                and any(self.dfa.accepting[q] for q in self.members(Bi & ~inside)):
            row = row.copy()
            row[e >> 3] |= 1 << (e & 7)
        return row

    def count(self, Bi: int, Bn: int, known: int | None = None) -> tuple[int, int | None, bool]:
        """(allowed text tokens capped at 2, the token if exactly one, EOS allowed), through the members of Bi in
        `known` as `row_within` (None: every member)."""
        inside = Bi if known is None else Bi & (known | ENDED_BIT)
        full, partial, eos_ok, _ = self._split_step(inside, Bn)
        if inside != Bi and Bn & ENDED_BIT:
            eos_ok = eos_ok or any(self.dfa.accepting[q] for q in self.members(Bi & ~inside))
        cnt, tok = self.ta.count_allowed(full, partial, self.members)
        return cnt, tok, eos_ok

    def _split_step(self, Bi: int, Bn: int) -> tuple[list[int], list[tuple[int, int]], bool, bool]:
        """The step from Bi to Bn, sorted for the token automaton (shared by `row` and `count`, which must agree):
        (states every one of whose token successors lies in Bn; (state, its successors in Bn as a bitset) for
        the others that reach Bn at all; EOS allowed; some state's successors are not known yet, so a row built
        from this is partial and must not be cached)."""
        full: list[int] = []
        partial: list[tuple[int, int]] = []
        eos_ok = False
        acc = self.dfa.accepting
        ended_in_next = bool(Bn & ENDED_BIT)
        notBn = ~Bn
        sget = self.ta.succ_bits.get
        unknown = False
        for q in self.members(Bi):
            if q == ENDED:
                eos_ok = eos_ok or ended_in_next
                continue
            if ended_in_next and acc[q]:
                eos_ok = True
            sb = sget(q)
            if sb is None:
                unknown = True  # in B only through EOS so far
                continue
            if not sb & notBn:
                full.append(q)
            else:
                inter = sb & Bn
                if inter:
                    partial.append((q, inter))
        return full, partial, eos_ok, unknown
