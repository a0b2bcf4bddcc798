"""The left-to-right matcher of a compiled regular constraint: what a sampler that emits one token at a time asks.

    m = compiled.matcher()            # unbounded length (benchmarks, evals): the DFA state's token row
    m = compiled.matcher(max_tokens)  # an answer of at most max_tokens tokens (the vLLM plugin's samplers)
    m.fill_mask() -> bool [vocab]; m.packed_row() -> packed bytes | None; m.advance(token) -> bool; m.reset()

With `max_tokens`, a row allows a token only when a valid answer still fits in the positions left: it is the row a
canvas state answers at its first open position when every later position is open (`SetAlgebra.left_to_right_row`,
exact, no budget), with the forward set carried token by token instead of recomputed over the canvas, and
memoised per (forward set, positions left) across requests, so a step whose state some request met before at the
same distance from the end costs a dict lookup.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .deriv import DEAD, START
from .set_algebra import START_BIT


class LeftToRightMatcher:
    """One answer's left-to-right walk over a `CompiledConstraint` (not thread-safe: one per answer)."""

    def __init__(self, cc: Any, max_tokens: int | None = None):
        self.cc = cc
        self.max_tokens = None if max_tokens is None else int(max_tokens)
        self.reset()

    def reset(self) -> None:
        """Back to the empty answer."""
        self.state = START  # the DFA state (unbounded)
        self.forward = START_BIT  # the forward set of the set algebra (bounded)
        self.ended = False
        self.consumed = 0  # tokens advanced over
        self._mask: np.ndarray | None = None

    # ------------------------------------------------------------------ masks
    def fill_mask(self) -> np.ndarray:
        """Bool [vocab]: the tokens allowed next (EOS when the text so far is accepted)."""
        cc = self.cc
        if self.max_tokens is not None:
            packed = self.packed_row()
            row = (np.zeros(cc.vocab_size, dtype=bool) if packed is None else
                   np.unpackbits(packed, count=cc.vocab_size, bitorder="little").view(np.bool_))
        else:
            row = np.zeros(cc.vocab_size, dtype=bool)
            if not self.ended and self.state != DEAD:
                cc.ta.mask_row([self.state], [], bool(cc.dfa.accepting[self.state]), row)
        self._mask = row
        return row

    def packed_row(self) -> np.ndarray | None:
        """With max_tokens: the next position's row as packed bytes (token t = bit t % 8 of byte t // 8; the set
        algebra's cached row itself: read it, do not write it), None when nothing is allowed or the answer has
        max_tokens tokens. Without max_tokens, `fill_mask` packed."""
        if self.max_tokens is None:
            return np.packbits(self.fill_mask(), bitorder="little")
        left = self.max_tokens - self.consumed
        if left <= 0:
            return None
        return self.cc.algebra.left_to_right_row(self.forward, left, self.cc.vocab_size)

    def is_allowed(self, tid: int) -> bool:
        """Whether the last `fill_mask` allowed token `tid`."""
        return bool(self._mask[tid])

    # ------------------------------------------------------------------ tokens
    def advance(self, tid: int) -> bool:
        """Take token `tid`; False when no accepted text continues with it (unbounded: the matcher stays where it
        was; with max_tokens: the walk is dead, every later row empty)."""
        if self.max_tokens is not None:
            self.forward = self.cc.algebra.step_tok(self.forward, int(tid))
            self.consumed += 1
            return self.forward != 0
        if self.ended or self.state == DEAD:
            return False
        if tid == self.cc.eos_id:
            if self.cc.dfa.accepting[self.state]:
                self.ended = True
                self.consumed += 1
                return True
            return False
        nxt = self.cc.ta.delta(self.state, int(tid))
        if nxt == DEAD:
            return False
        self.state = nxt
        self.consumed += 1
        return True

    def is_accepting(self) -> bool:
        """Whether the text so far is an accepted output (with max_tokens: some state of the walk accepts)."""
        if self.max_tokens is not None:
            return self.cc.algebra.any_accepting(self.forward)
        return self.ended or bool(self.cc.dfa.accepting[self.state])
