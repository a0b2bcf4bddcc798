"""One step's attention: metadata built once on the host, then ONE varlen attention call per layer for every row.

`StepAttention.build(segments, pool, ...)` turns the step's segments (engine.model_runner.Segment) into
  * a `VarlenLayout`: each segment is one sequence; its queries are its packed rows, its keys its request's pool
    slots (refresh: the whole sequence; reuse: the whole sequence, the span's slots freshly written), or, without a
    cache, its own packed rows;
  * `write_slots`: the pool slot of every real packed row (Refresh and Reuse rows alike write their keys/values
    before anything reads them);
  * for the sparse cache, a selection layout: each refreshing segment's span queries against its keys outside the
    span, whose salient keys per KV head become its slots' keep mask.
Every tensor is moved to the device once per step; `attend(layer, q, k, v)` (the model's per-layer attention hook)
then runs one index_copy_ per K/V, the selection (sparse Refresh only) and one `varlen_attention`, with no host
sync and no Python branch on tensor values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dllm_constrain.engine.kv_pool import KVPool
from dllm_constrain.kernels.varlen_attention import (
    TILE_Q,
    VarlenLayout,
    keep_counts,
    select_salient_keys,
    varlen_attention,
)

if TYPE_CHECKING:  # annotations only: model_runner imports this module
    from dllm_constrain.engine.model_runner import Segment


@dataclass(frozen=True)
class Selection:
    """The sparse Refresh's salient-key selection of one step (device tensors, host-known sizes)."""

    layout: VarlenLayout  # span queries x keys outside the span, per refreshing segment
    seq_of_tile: torch.Tensor  # int64 [tiles]
    query_valid: torch.Tensor  # bool [tiles, TILE_Q]
    counts: torch.Tensor  # int64 [sequences]: keys kept per head
    kmax: int
    span: torch.Tensor  # bool [sequences, 1, kpad]: span positions (always kept: Reuse rewrites them)
    src: torch.Tensor  # int64 [keys]: flat (sequence, position) of every key of the refreshing segments
    dst: torch.Tensor  # int64 [keys]: its pool slot

    def apply(self, q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor) -> None:
        """Write the refreshing segments' keep mask for this layer into `keep` [S, Hkv]."""
        n = self.counts.shape[0]
        chosen = select_salient_keys(q, k, self.layout, self.seq_of_tile, self.query_valid, self.counts, n,
                                     self.kmax) | self.span
        flat = chosen.transpose(1, 2).reshape(-1, chosen.shape[1])
        keep.index_copy_(0, self.dst, flat.index_select(0, self.src))


@dataclass(frozen=True)
class StepAttention:
    """A step's attention metadata and its per-layer attention (see the module docstring)."""

    layout: VarlenLayout
    pool: KVPool | None
    write_slots: torch.Tensor | None  # int64 [total]: pool slot of each real packed row
    total: int
    selection: Selection | None
    backend: str = "auto"

    @classmethod
    def build(cls, segments: list["Segment"], pool: KVPool | None, rows: int, device: torch.device,
              keep_ratio: float = 1.0, backend: str = "auto") -> "StepAttention":
        total = sum(seg.length for seg in segments)
        if pool is None:
            keys = [torch.arange(seg.start, seg.start + seg.length) for seg in segments]
            layout = VarlenLayout.build([seg.start for seg in segments], [seg.length for seg in segments], keys,
                                        [False] * len(segments), rows, device)
            return cls(layout, None, None, total, None, backend)
        slots = [pool.slots(seg.state.index) for seg in segments]
        write = torch.cat([s[seg.first:seg.first + seg.length] for s, seg in zip(slots, segments)])
        sparse = pool.sparse
        layout = VarlenLayout.build([seg.start for seg in segments], [seg.length for seg in segments], slots,
                                    [sparse and seg.kind == "reuse" for seg in segments], rows, device)
        refreshing = [(seg, s) for seg, s in zip(segments, slots) if sparse and seg.kind == "refresh"]
        selection = _selection(refreshing, keep_ratio, rows, device) if refreshing else None
        return cls(layout, pool, write.to(device, non_blocking=True), total, selection, backend)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The model's attention hook: q [1, Hq, T, D], k, v [1, Hkv, T, D] -> [1, Hq, T, D], every row at once."""
        qt, kt, vt = q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1)
        keep = None
        if self.pool is None:
            keys, values = kt, vt
        else:
            keys, values, keep = self.pool.layer(layer, kt)
            assert self.write_slots is not None
            keys.index_copy_(0, self.write_slots, kt[:self.total].to(keys.dtype))
            values.index_copy_(0, self.write_slots, vt[:self.total].to(values.dtype))
            if self.selection is not None and keep is not None:
                self.selection.apply(qt, keys, keep)
        out = varlen_attention(qt, keys, values, self.layout, keep, backend=self.backend)
        return out.transpose(0, 1).unsqueeze(0)


def _selection(refreshing: list[tuple["Segment", torch.Tensor]], keep_ratio: float, rows: int,
               device: torch.device) -> Selection:
    """The selection layout of the refreshing segments (sparse cache): span queries, keys outside the span."""
    starts, lens, valid, spans, outside = [], [], [], [], []
    for seg, _ in refreshing:
        a, b = seg.span
        n = seg.length
        starts.append(seg.start + a)
        lens.append(b - a)
        mask = torch.ones(n, dtype=torch.bool)
        mask[a:b] = False
        valid.append(mask)
        outside.append(n - (b - a))
        spans.append((a, b))
    slots = [s for _, s in refreshing]
    layout = VarlenLayout.build(starts, lens, slots, [False] * len(slots), rows, device, key_valid=valid)
    kpad = layout.key_valid.shape[-1]
    per_seq = [-(-n // TILE_Q) for n in lens]
    seq_of_tile = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(per_seq))
    query_valid = torch.zeros(layout.tiles, TILE_Q, dtype=torch.bool)
    at = 0
    for n, t in zip(lens, per_seq):
        query_valid.view(-1)[at * TILE_Q:at * TILE_Q + n] = True
        at += t
    span = torch.zeros(len(lens), 1, kpad, dtype=torch.bool)
    src = []
    for i, ((a, b), s) in enumerate(zip(spans, slots)):
        span[i, 0, a:b] = True
        src.append(torch.arange(s.numel()) + i * kpad)
    counts = keep_counts(outside, keep_ratio)
    return Selection(layout=layout, seq_of_tile=seq_of_tile.to(device), query_valid=query_valid.to(device),
                     counts=torch.tensor(counts).to(device), kmax=max(max(counts), 1), span=span.to(device),
                     src=torch.cat(src).to(device), dst=torch.cat(slots).to(device))
