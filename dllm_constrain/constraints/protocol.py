"""The contract between the denoising loop and the constraint layer.

The engine owns the canvas; a constraint only answers questions about it. The canvas passed in is the
answer region only (length = max_new_tokens), as a list of token ids where `mask_id` marks an open position.
Validity means: the tokens up to the first EOS decode to a string the constraint accepts, and every
position after the first EOS is EOS (the EOS-padded tail). A canvas is *completable* when some assignment
of its open positions makes it valid.

Masks travel in one format from the constraint to the kernels: xgrammar's packed token bitmask, int32
[rows, ceil(vocab / 32)] with bit t % 32 of word t // 32 allowing token t (`dllm_constrain.kernels.bitmask`).
The engine allocates it, the constraint fills it in place (`fill_token_bitmask`), and the same tensor is ANDed
with the engine's own restrictions and handed to the masked row-statistics kernels without conversion.
`allowed_tokens` answers the same question as bool rows, for tests, tools and per-row samplers (the vLLM plugin).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from dllm_constrain.kernels.bitmask import bitmask_bytes, pack_bool_mask


@runtime_checkable
class CanvasConstraint(Protocol):
    """Per-request constraint state (created by a compiled constraint for one canvas length)."""

    def fill_token_bitmask(self, canvas: Sequence[int], positions: Sequence[int], out: torch.Tensor) -> None:
        """Write the mask of positions[j] into row j of `out` (a CPU int32 bitmask [>= len(positions), W], rows
        contiguous): token t allowed iff committing it alone keeps the canvas completable (exact for regular
        constraints; sound over-approximation elsewhere). Every word of rows 0..len(positions)-1 is written; tokens
        at or past the constraint's vocabulary are 0, tokens past 32 W are dropped. Other rows are left alone."""
        ...

    def allowed_tokens(self, canvas: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Bool [len(positions), vocab_size]: the masks of `fill_token_bitmask` as bool rows (True = allowed)."""
        ...

    def select_commits(
        self, canvas: Sequence[int], proposals: Sequence[tuple[int, int, float]]
    ) -> list[tuple[int, int]]:
        """Joint verification of one step's commits. proposals = (position, token, score); returns the
        highest-scoring subset (greedy by score) whose joint commit keeps the canvas completable. Never
        empty when proposals is non-empty and each proposal was allowed alone."""
        ...

    def is_completable(self, canvas: Sequence[int]) -> bool:
        """True when some assignment of the open positions makes the canvas valid."""
        ...

    def forced_tokens(self, canvas: Sequence[int]) -> dict[int, int]:
        """Open positions whose allowed set has exactly one token: position -> token."""
        ...


def fill_token_bitmask(constraint: object, canvas: Sequence[int], positions: Sequence[int],
                       out: torch.Tensor) -> None:
    """`constraint.fill_token_bitmask(canvas, positions, out)`; a constraint written before the bitmask (one that
    answers `allowed_tokens` only, such as a user's own CanvasConstraint) has its bool rows packed into `out`, so
    callers have one way to ask for masks whatever the constraint implements."""
    fill = getattr(constraint, "fill_token_bitmask", None)
    if callable(fill):
        fill(canvas, positions, out)
        return
    n = len(positions)
    rows = torch.as_tensor(constraint.allowed_tokens(canvas, positions), dtype=torch.bool)  # type: ignore[attr-defined]
    dst = bitmask_bytes(out[:n])
    packed = bitmask_bytes(pack_bool_mask(rows))
    k = min(dst.shape[1], packed.shape[1])
    dst[:, :k] = packed[:, :k]
    dst[:, k:] = 0


def first_unfit_pin(constraint: CanvasConstraint, canvas_len: int, pins: dict[int, int], mask_id: int) -> int | None:
    """The first pinned position (in position order) that no valid output can hold together with the pins left of
    it, or None when the pinned canvas is completable: the admission check of a template (pinned tokens are the
    canvas's committed tokens at step 0).

    One completability call when the pins fit (the common case); otherwise a binary search over position-ordered
    prefixes of the pins (completability is monotone: a canvas with more committed tokens has no more completions),
    so O(log pins) calls name the position. None also when no output fits the bare canvas (a length problem, which
the constraint reports itself)."""
    order = sorted(pins)

    def fits(k: int) -> bool:
        view = [mask_id] * canvas_len
        for p in order[:k]:
            view[p] = pins[p]
        return constraint.is_completable(view)

    if fits(len(order)):
        return None
    lo, hi = 0, len(order)  # fits(lo) holds, fits(hi) does not
    if not fits(0):  # nothing fits the canvas at all: the constraint's own length error says so, not a pin
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return order[hi - 1]
