"""The cheap frontier hint of a regular canvas state: the token its committed prefix alone forces (a mixin).

Why it is enough: the prefix row is a superset of the canvas mask at the left frontier, and the canvas is kept
completable, so a single prefix token is the frontier's forced token. The engine uses it to choose between
committing forced tokens before the forward and computing the masks beside it (protocol.CanvasConstraint).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from .call_bounds import HINT_STATES
from .set_finish import ENDED


class PrefixHint:
    """`prefix_hint` over `CanvasState`'s forward sets (self._forward, self._explored, self._hint_memo, ...)."""

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
