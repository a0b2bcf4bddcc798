"""What the engine needs from a model family: one interface, whatever the checkpoint layout.

A family adapter maps a canvas to one hidden state per position such that `logits(hidden[:, i])` is the
model's distribution for position i (families with shifted prediction, like Dream, shift inside the
adapter). Keeping the LM head separate lets the engine project only the rows it may commit (budgeted logits).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class SpecialTokens:
    """Token ids the engine relies on. mask_id marks an open canvas position; eos_id pads the canvas tail."""

    mask_id: int
    eos_id: int
    pad_id: int
    bos_id: int | None = None


@runtime_checkable
class DiffusionLM(Protocol):
    """The model-side contract of the engine loop."""

    family: str
    special: SpecialTokens
    vocab_size: int
    max_sequence_length: int

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[B, L] ids -> [B, L, D] final hidden states (final norm applied), one per canvas position."""
        ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., D] hidden states -> [..., V] logits (the LM head only)."""
        ...


def default_position_ids(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """Positions that count only real tokens, so a left-padded row sees the positions it sees alone."""
    pos = key_padding_mask.long().cumsum(-1) - 1
    return pos.clamp_min(0)
