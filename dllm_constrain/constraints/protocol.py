"""The contract between the denoising loop and the constraint layer.

The engine owns the canvas; a constraint only answers questions about it. The canvas passed in is the
answer region only (length = max_new_tokens), as a list of token ids where `mask_id` marks an open position.
Validity means: the tokens up to the first EOS decode to a string the constraint accepts, and every
position after the first EOS is EOS (the EOS-padded tail). A canvas is *completable* when some assignment
of its open positions makes it valid.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class CanvasConstraint(Protocol):
    """Per-request constraint state (created by a compiled constraint for one canvas length)."""

    def allowed_tokens(self, canvas: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Bool [len(positions), vocab_size]: token t is allowed at positions[j] iff committing it alone
        keeps the canvas completable (exact for regular constraints; sound over-approximation elsewhere)."""
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
