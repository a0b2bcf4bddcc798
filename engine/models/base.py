"""What the engine needs from a model family: one interface, whatever the checkpoint layout.

A family adapter maps a canvas to one hidden state per position such that `logits(hidden[:, i])` is the
model's distribution for position i (families with shifted prediction, like Dream, shift inside the
adapter). Keeping the LM head separate lets the engine project only the rows it may commit (budgeted logits).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
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


# ---------------------------------------------------------------------------------------------------------------------
# What the engine calls on a model beyond `DiffusionLM`: one Protocol per capability, checked with isinstance (never
# by probing attributes). A family declares the protocols it implements by defining their members.

LayerAttend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (layer, q, k, v) -> out


@runtime_checkable
class LinearHeadLM(Protocol):
    """A model whose logits are exactly hidden @ W^T (no bias, no soft-capping): the fused budgeted logits path
    (engine.logits) projects only the rows it needs with W."""

    def lm_head_weight(self) -> torch.Tensor:
        """[V, D] LM head weight."""
        ...


@runtime_checkable
class SpanForwardLM(Protocol):
    """A model with a span forward: the engine packs every request's rows of a step into one forward and supplies
    each layer's attention (engine.model_runner); its Refresh/Reuse KV cache needs nothing more (LLaDA, Dream)."""

    kv_query_shift: int  # query positions left of a block a Reuse step runs (Dream's shifted head: 1; LLaDA: 0)

    def hidden_states_cached(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                             attend: LayerAttend) -> torch.Tensor:
        """Final hidden states [B, Lq, D] of query tokens (ids, position ids [B, Lq]) whose attention at every layer
        is attend(layer, q [B, Hq, Lq, D], k, v [B, Hkv, Lq, D]) -> [B, Hq, Lq, D]."""
        ...


@runtime_checkable
class NeighborTokensLM(SpanForwardLM, Protocol):
    """A span-forward model whose input mixes in each token's neighbours (LLaDA's input token shift): the span
    forward takes `neighbor_ids` [B, Lq, N], the ids at `neighbor_offsets` of each query token in its own sequence
    (-1 where there is none). An empty `neighbor_offsets` means the model does not use them."""

    neighbor_offsets: tuple[int, ...]

    def hidden_states_cached(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attend: LayerAttend,
                             neighbor_ids: torch.Tensor | None = None) -> torch.Tensor:
        ...


@runtime_checkable
class ScriptableLM(SpanForwardLM, Protocol):
    """A span-forward model with a TorchScript twin of its span forward (engine.models.scripted_forward), which the
    runner starts on torch's inter-op pool without the GIL (EngineConfig.gil_free_forward)."""

    def scripted_weights(self) -> Any:
        """The twin's tensors (a ScriptedWeights)."""
        ...


@runtime_checkable
class RequestStateLM(Protocol):
    """A model with per-request state (e.g. a uniform-state model's own noise): the engine calls
    `init_request_state(state)` once per request before its first step, and `hidden_states` with
    `request_states=[...]` (one per row). Such a model always runs the full forward (no packing, no KV cache)."""

    def init_request_state(self, state: Any) -> None:
        ...

    def hidden_states(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                      key_padding_mask: torch.Tensor | None = None, *,
                      request_states: list[Any] | None = None) -> torch.Tensor:
        ...


@runtime_checkable
class RenoisingLM(Protocol):
    """A model whose re-opened positions get other ids than the mask token (uniform-state diffusion): the engine
    asks `renoise_tokens(state, positions)` for them (default: mask_id)."""

    def renoise_tokens(self, state: Any, positions: list[int]) -> list[int]:
        ...


@runtime_checkable
class BlockDiffusionLM(Protocol):
    """A model with a prompt cache and a separate canvas decoder (DiffusionGemma): no per-step forward over prompt
    + canvas, so the engine denoises its requests in lockstep blocks (engine.block_diffusion)."""

    def encode_prompt(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None,
                      position_ids: torch.Tensor | None = None) -> Any:
        """Encode left-padded prompts [B, P] once into the cache every step reads."""
        ...

    def extend_prompt(self, prompt: Any, ids: torch.Tensor) -> None:
        """Append real tokens [B, N] (a finished block) to the prompt cache in place."""
        ...

    def noise(self, shape: tuple[int, ...], generator: torch.Generator | None = None,
              device: torch.device | str | None = None) -> torch.Tensor:
        """Ids for open positions (e.g. uniform over the vocabulary)."""
        ...

    def init_canvas(self, prompt: Any, canvas_length: int | None = None,
                    generator: torch.Generator | None = None) -> Any:
        """A fresh all-open canvas state for the next block."""
        ...

    def denoise_step(self, state: Any) -> Any:
        """One decoder pass over the canvas: an output with `hidden` and `logits`."""
        ...

    def advance(self, state: Any, tokens: torch.Tensor, accepted: torch.Tensor | None = None, *,
                self_conditioning_logits: torch.Tensor | None, generator: torch.Generator | None = None) -> None:
        """The next canvas: `tokens` where accepted, fresh noise elsewhere."""
        ...


def packs_rows(model: Any) -> bool:
    """Whether the engine packs the model's rows into one span forward per step (and may keep its KV cache): a span
    forward and no per-request state."""
    return isinstance(model, SpanForwardLM) and not isinstance(model, RequestStateLM)


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
