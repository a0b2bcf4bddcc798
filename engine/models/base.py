"""What the engine needs from a model family: one interface, whatever the checkpoint layout.

A family adapter maps a canvas to one hidden state per position such that `logits(hidden[:, i])` is the
model's distribution for position i (families with shifted prediction, like Dream, shift inside the
adapter). Keeping the LM head separate lets the engine project only the rows it may commit (budgeted logits).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from dllm_constrain.errors import CheckpointError


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


def parse_config_fields(
    cls: type,
    raw: dict[str, Any],
    *,
    family: str,
    accepted_as: dict[str, set],
    ignored: set[str],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a config.json into dataclass kwargs and `extra`, refusing what we would silently misread.

    A field of the dataclass goes to kwargs; a field in `accepted_as` is kept only when it holds a value we
    implement; a field in `ignored` has no effect on inference. Any other field, or a missing required one,
    is a CheckpointError that names it: a checkpoint with a feature we do not implement must not load.
    """
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    unknown = []
    for key, value in raw.items():
        if key in names:
            kwargs[key] = value
        elif key in accepted_as:
            if value not in accepted_as[key]:
                raise CheckpointError(f"{family} config field {key}={value!r} is not supported "
                                      f"(supported: {sorted(map(str, accepted_as[key]))})")
            extra[key] = value
        elif key in ignored:
            extra[key] = value
        else:
            unknown.append(key)
    if unknown:
        raise CheckpointError(f"unknown {family} config field(s): {', '.join(sorted(unknown))}")
    missing = [f.name for f in dataclasses.fields(cls)
               if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
               and f.name not in kwargs]
    if missing:
        raise CheckpointError(f"{family} config.json is missing required field(s): {', '.join(missing)}")
    return kwargs, extra
