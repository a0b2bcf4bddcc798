"""One step's forwards for the running requests: a full forward, or Refresh/Reuse forwards over a KV cache.

`ModelRunner.forward(states)` returns groups `(states, hidden [b, L, D], offsets)`: for request `states[r]`, canvas
position p's hidden state is `hidden[r, offsets[r] + p]` (only the active block's positions are guaranteed).

Without a cache (EngineConfig.kv_cache="none", or a model without `hidden_states_kv`/`hidden_states_cached`, or a
model with per-request state) every step is one full forward of prompt + canvas, left-padded to the longest row.

With the cache (engine.kv_cache), each request is either
  refreshed: when it has no cache row yet, when its active block changed since its last refresh, or when the
             refresh policy says so (every k forwards; or once a share of the block was committed since the last
             refresh); the refreshed requests share one full forward (left-padded to the call's width W), whose
             hidden states serve this step's commits and whose keys/values replace their cache rows;
  reused:    every other request runs its query span only, [block start - shift, block end) where shift =
             `model.kv_query_shift` (Dream: 1, its shifted head predicts the block's first token from the position
             before it; LLaDA: 0), against its cache row. Requests with equal span lengths share one forward.
A row computes what it computes alone: padding is masked, position ids count real tokens, and refresh decisions
depend on the request's own progress only, so a request gets the same answer alone and in any batch.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.kv_cache import KVCache
from dllm_constrain.engine.models.base import default_position_ids
from dllm_constrain.engine.state import RequestState

Group = tuple[list[RequestState], torch.Tensor, list[int]]


def supports_kv_cache(model: Any) -> bool:
    """Families with a cached forward (LLaDA, Dream); models with per-request state never use the cache."""
    return (callable(getattr(model, "hidden_states_kv", None)) and callable(getattr(model, "hidden_states_cached", None))
            and not getattr(model, "uses_request_state", False))


def model_device(model: Any) -> torch.device:
    params = getattr(model, "parameters", None)
    if callable(params):
        for p in params():
            return p.device
    return torch.device("cpu")


@dataclass
class RowMeta:
    """A request's cache bookkeeping: the block its cache row was refreshed for, forwards since, and how many of
    that block's positions were committed at the refresh."""

    block: int
    forwards: int
    committed_at_refresh: int


class ModelRunner:
    def __init__(self, model: Any, pad_id: int, config: EngineConfig) -> None:
        self.model = model
        self.pad_id = pad_id
        self.config = config
        self.device = model_device(model)
        self.shift = int(getattr(model, "kv_query_shift", 0))
        self.cached = config.kv_cache == "dual" and supports_kv_cache(model)
        self.cache: KVCache | None = None
        self.meta: dict[int, RowMeta] = {}
        self.refreshes: dict[int, int] = {}  # request index -> refresh forwards it took part in
        self.width = 0
        # called with (states, hidden, offsets) after every Reuse forward (agreement measurements)
        self.on_reuse: Callable[[list[RequestState], torch.Tensor, list[int]], None] | None = None

    def reset(self, states: Sequence[RequestState]) -> None:
        """Start a generate() call: an empty cache whose width fits every request of the call."""
        self.width = max((len(s.prompt_ids) + s.canvas_len for s in states), default=0)
        self.cache = KVCache(self.config.keep_ratio, self.config.backend) if self.cached else None
        self.meta = {}
        self.refreshes = {s.index: 0 for s in states}

    # ------------------------------------------------------------------ inputs
    def _rows(self, states: Sequence[RequestState], width: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Left-padded ids [b, width], key-padding mask, and each row's slot of canvas position 0."""
        ids = torch.full((len(states), width), self.pad_id, dtype=torch.long)
        kpm = torch.zeros((len(states), width), dtype=torch.bool)
        offsets = []
        for b, s in enumerate(states):
            n = len(s.prompt_ids) + s.canvas_len
            pad = width - n
            ids[b, pad:pad + len(s.prompt_ids)] = torch.tensor(s.prompt_ids, dtype=torch.long)
            ids[b, pad + len(s.prompt_ids):] = s.canvas
            kpm[b, pad:] = True
            offsets.append(pad + len(s.prompt_ids))
        return ids, kpm, offsets

    def full_forward(self, states: Sequence[RequestState]) -> Group:
        """One forward of every request's whole sequence (no cache)."""
        width = max(len(s.prompt_ids) + s.canvas_len for s in states)
        ids, kpm, offsets = self._rows(states, width)
        kwargs: dict[str, Any] = {}
        if getattr(self.model, "uses_request_state", False):
            kwargs["request_states"] = list(states)
        kpm_d = kpm.to(self.device)
        hidden = self.model.hidden_states(ids.to(self.device), position_ids=default_position_ids(kpm_d),
                                          key_padding_mask=kpm_d, **kwargs)
        return list(states), hidden, offsets

    # ------------------------------------------------------------------ cached steps
    def _span(self, s: RequestState, offset: int) -> tuple[int, int]:
        start, end = s.block_bounds()
        return offset + start - self.shift, offset + end

    def _committed_in_block(self, s: RequestState) -> int:
        start, end = s.block_bounds()
        return int(s.committed[start:end].sum())

    def needs_refresh(self, s: RequestState) -> bool:
        meta = self.meta.get(s.index)
        if meta is None or self.cache is None or s.index not in self.cache or meta.block != s.block:
            return True
        if self.config.refresh == "steps":
            return meta.forwards >= self.config.refresh_steps
        if self.config.refresh == "adaptive":
            start, end = s.block_bounds()
            new = self._committed_in_block(s) - meta.committed_at_refresh
            return new >= self.config.refresh_threshold * (end - start)
        return False

    def _refresh(self, states: list[RequestState]) -> Group:
        assert self.cache is not None
        ids, kpm, offsets = self._rows(states, self.width)
        spans = [self._span(s, off) for s, off in zip(states, offsets)]
        kpm_d = kpm.to(self.device)
        observe, layers = self.cache.observer(kpm_d, spans)
        hidden = self.model.hidden_states_kv(ids.to(self.device), default_position_ids(kpm_d), kpm_d, observe)
        self.cache.store([s.index for s in states], kpm_d, layers)
        for s in states:
            self.meta[s.index] = RowMeta(block=s.block, forwards=0, committed_at_refresh=self._committed_in_block(s))
            self.refreshes[s.index] = self.refreshes.get(s.index, 0) + 1
        return states, hidden, offsets

    def _reuse(self, states: list[RequestState]) -> Group:
        assert self.cache is not None
        ids, kpm, offsets = self._rows(states, self.width)
        pos = default_position_ids(kpm)
        spans = [self._span(s, off) for s, off in zip(states, offsets)]
        length = spans[0][1] - spans[0][0]
        slots = torch.stack([torch.arange(a, b) for a, b in spans])  # [b, Lq]
        q_ids = ids.gather(1, slots)
        q_pos = pos.gather(1, slots)
        slots_d = slots.to(self.device)
        attend = self.cache.attend([s.index for s in states], slots_d)
        hidden = self.model.hidden_states_cached(q_ids.to(self.device), q_pos.to(self.device), attend)
        assert hidden.shape[1] == length
        # canvas position p of request r sits at span index (offset_r + p) - span_start_r
        offs = [off - a for off, (a, _) in zip(offsets, spans)]
        if self.on_reuse is not None:
            self.on_reuse(states, hidden, offs)
        return states, hidden, offs

    def forward(self, states: Sequence[RequestState]) -> list[Group]:
        """This step's forwards for the running `states` (see the module docstring)."""
        states = list(states)
        if not states:
            return []
        if not self.cached:
            return [self.full_forward(states)]
        assert self.cache is not None
        self.cache.keep([s.index for s in states])
        refresh = [s for s in states if self.needs_refresh(s)]
        reuse = [s for s in states if not any(s is r for r in refresh)]
        groups: list[Group] = []
        if refresh:
            groups.append(self._refresh(refresh))
        by_length: dict[int, list[RequestState]] = {}
        for s in reuse:
            start, end = s.block_bounds()
            by_length.setdefault(end - start + self.shift, []).append(s)
        for group in by_length.values():
            groups.append(self._reuse(group))
        for s in states:
            self.meta[s.index].forwards += 1
        return groups
