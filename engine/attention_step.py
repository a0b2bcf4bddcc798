"""One step's attention: metadata built once on the host, then ONE varlen attention call per layer for every row.

`StepAttention.build(segments, pool, ...)` turns the step's segments (engine.model_runner.Segment) into
  * a `VarlenLayout`: each segment is one sequence; its queries are its packed rows, its keys its request's pool
    slots (refresh and reuse: the whole sequence, the step's own rows freshly written), or, without a cache, its own
    packed rows;
  * `write_slots`: the pool slot of every real packed row (Refresh and Reuse rows alike write their keys/values
    before anything reads them);
  * for the sparse cache, a `Selection`: each refreshing segment's span queries against its keys outside the span,
    whose salient keys per KV head become its slots' keep mask (Reuse reads only those, plus its span).
Only what the chosen backend reads is built: the grouped torch path's per-group indices and masks are skipped when
the attention runs on Triton (the sparse selection, torch on every device, keeps its own grouped layout). Every
tensor is moved to the device once per step; `attend(layer, q, k, v)` (the model's per-layer attention hook) then
runs one index_copy_ per K/V, the selection (sparse Refresh only, one op) and one `varlen_attention` (one custom op at
the dispatcher), with no host sync and no Python branch on tensor values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dllm_constrain.engine.kv_pool import KVPool
from dllm_constrain.kernels._backend import resolve_backend
from dllm_constrain.kernels.varlen_attention import VarlenLayout, keep_counts, mark_salient_keys, varlen_attention

if TYPE_CHECKING:  # annotations only: model_runner imports this module
    from dllm_constrain.engine.model_runner import Segment


@dataclass(frozen=True)
class Selection:
    """The sparse Refresh's salient-key selection of one step (device tensors, host-known sizes), per group of
    `layout` (kernels.varlen_attention)."""

    layout: VarlenLayout  # span queries x keys outside the span, per refreshing segment
    needs: list[torch.Tensor]  # int64 [count]: keys kept per head, per sequence
    kmaxes: list[int]
    spans: list[torch.Tensor]  # bool [1, count, K]: span positions (always kept: Reuse rewrites them)
    src: list[torch.Tensor]  # int64: flat (sequence, position) of every real key of the group
    dst: list[torch.Tensor]  # int64: its pool slot

    def apply(self, q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor) -> None:
        """Write the refreshing segments' keep mask for this layer into `keep` [Hkv, S] (one op)."""
        mark_salient_keys(q, k, keep, self.layout, self.needs, self.kmaxes, self.spans, self.src, self.dst)


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
        """backend: the attention's ("auto" | "triton" | "torch", resolved here for `device`); the metadata is
        built for it alone (the GIL-free forward's TorchScript twin runs the grouped path: it passes "torch")."""
        backend = resolve_backend(backend, torch.device(device))
        grouped = backend == "torch"
        total = sum(seg.length for seg in segments)
        starts, lengths = [seg.start for seg in segments], [seg.length for seg in segments]
        if pool is None:
            keys = [torch.arange(seg.start, seg.start + seg.length) for seg in segments]
            layout = VarlenLayout.build(starts, lengths, keys, [False] * len(segments), rows, device, grouped=grouped)
            return cls(layout, None, None, total, None, backend)
        slots = [pool.slots(seg.state.index) for seg in segments]
        write = torch.cat([s[seg.first:seg.first + seg.length] for s, seg in zip(slots, segments)])
        layout = VarlenLayout.build(starts, lengths, slots, [pool.sparse and seg.kind == "reuse" for seg in segments],
                                    rows, device, grouped=grouped)
        refreshing = [(seg, s) for seg, s in zip(segments, slots) if pool.sparse and seg.kind == "refresh"]
        selection = _selection(refreshing, keep_ratio, rows, device) if refreshing else None
        return cls(layout, pool, write.to(device, non_blocking=True), total, selection, backend)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The model's attention hook: q [1, Hq, T, D], k, v [1, Hkv, T, D] -> [1, Hq, T, D], every row at once."""
        keep = None
        if self.pool is None:
            keys, values = k[0], v[0]
        else:
            keys, values, keep = self.pool.layer(layer, k[0])
            assert self.write_slots is not None
            keys.index_copy_(1, self.write_slots, k[0, :, :self.total].to(keys.dtype))
            values.index_copy_(1, self.write_slots, v[0, :, :self.total].to(values.dtype))
            if self.selection is not None and keep is not None:
                self.selection.apply(q[0], keys, keep)
        return varlen_attention(q[0], keys, values, self.layout, keep, backend=self.backend).unsqueeze(0)


def _selection(refreshing: list[tuple["Segment", torch.Tensor]], keep_ratio: float, rows: int,
               device: torch.device) -> Selection:
    """The selection of the refreshing segments (sparse cache): span queries against the keys outside the span."""
    starts, lens, outside, spans, counts = [], [], [], [], []
    for seg, _ in refreshing:
        a, b = seg.span
        mask = torch.ones(seg.length, dtype=torch.bool)
        mask[a:b] = False
        starts.append(seg.start + a)
        lens.append(b - a)
        outside.append(mask)
        spans.append((a, b))
        counts.append(seg.length - (b - a))
    slots = [s for _, s in refreshing]
    counts = keep_counts(counts, keep_ratio)
    layout = VarlenLayout.build(starts, lens, slots, [False] * len(slots), rows, device, key_valid=outside)
    needs, kmaxes, span_masks, src, dst = [], [], [], [], []
    for g, members in enumerate(layout.group_seqs):
        kk = layout.group_keys[g]
        span = torch.zeros(1, len(members), kk, dtype=torch.bool)
        for j, i in enumerate(members):
            span[0, j, spans[i][0]:spans[i][1]] = True
        needs.append(torch.tensor([counts[i] for i in members]).to(device))
        kmaxes.append(max(counts[i] for i in members))
        span_masks.append(span.to(device))
        src.append(torch.cat([torch.arange(slots[i].numel()) + j * kk for j, i in enumerate(members)]).to(device))
        dst.append(torch.cat([slots[i] for i in members]).to(device))
    return Selection(layout, needs, kmaxes, span_masks, src, dst)
