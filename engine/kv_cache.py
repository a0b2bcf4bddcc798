"""The Refresh/Reuse KV cache (Fast-dLLM's DualCache) and its head-centric sparse form.

One cache serves one `LLMEngine.generate` call. It has one row per running request, every row left-padded to the
same width W (the longest prompt + canvas of the call), so a row's slot j is the same sequence position at every
step; `kpm` [B, W] marks real tokens.

Refresh (`store`): a full forward (`model.hidden_states_kv`) hands every layer's rotated q, k, v to the cache.
  dense  (keep_ratio = 1): the layer's k, v [B, Hkv, W, D] are kept as they are.
  sparse (keep_ratio < 1): each KV head keeps its own ceil(keep_ratio * n) most salient keys among the n real keys
         outside the request's query span, scored against the span's queries at this refresh
         (`kernels.packed_kv_attention.select_salient_keys`, softmax-probability saliency), packed densely per head
         (`PackedKV`); the dense k, v are dropped.
  Refreshing a subset of the rows writes those rows only (the others keep their cache).
Reuse (`attend`): a forward over each row's query span only (`model.hidden_states_cached`); per layer the span's
  fresh k, v are combined with the cache:
  dense:  written into the row's span slots of the cached k, v (those slots held the span's keys of the last
          refresh or reuse), then bidirectional attention over all W slots under the key-padding mask, i.e.
          softmax(q [K_outside; K_span_fresh]^T / sqrt(d)) [V_outside; V_span_fresh]: DualCache.
  sparse: `packed_kv_attention(q, packed, k_fresh, v_fresh)`: the packed salient keys plus the span's fresh keys
          (Triton on CUDA, the torch reference elsewhere).
Reuse steps never write anything a later step reads except the span slots, which every Reuse step rewrites before
reading and every Refresh recomputes, and a request refreshes whenever its span moves (engine.model_runner).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from dllm_constrain.engine.models.layers import attention_bias, bidirectional_attention
from dllm_constrain.kernels.packed_kv_attention import PackedKV, packed_kv_attention, select_salient_keys


def _pad_packed(p: PackedKV, capacity: int) -> PackedKV:
    """`p` with zero slots appended up to `capacity` (index -1, outside every length)."""
    extra = capacity - p.capacity
    if extra <= 0:
        return p
    b, h, _, d = p.keys.shape
    return PackedKV(keys=torch.cat([p.keys, p.keys.new_zeros(b, h, extra, d)], dim=2),
                    values=torch.cat([p.values, p.values.new_zeros(b, h, extra, d)], dim=2),
                    lengths=p.lengths,
                    indices=torch.cat([p.indices, p.indices.new_full((b, h, extra), -1)], dim=2))


def _take_packed(p: PackedKV, rows: torch.Tensor) -> PackedKV:
    return PackedKV(keys=p.keys.index_select(0, rows), values=p.values.index_select(0, rows),
                    lengths=p.lengths.index_select(0, rows), indices=p.indices.index_select(0, rows))


def _cat_packed(a: PackedKV, b: PackedKV) -> PackedKV:
    cap = max(a.capacity, b.capacity)
    a, b = _pad_packed(a, cap), _pad_packed(b, cap)
    return PackedKV(keys=torch.cat([a.keys, b.keys]), values=torch.cat([a.values, b.values]),
                    lengths=torch.cat([a.lengths, b.lengths]), indices=torch.cat([a.indices, b.indices]))


def _put_packed(p: PackedKV, rows: torch.Tensor, new: PackedKV) -> PackedKV:
    """`p` with rows `rows` replaced by `new` (capacities padded to the larger one)."""
    cap = max(p.capacity, new.capacity)
    p, new = _pad_packed(p, cap), _pad_packed(new, cap)
    return PackedKV(keys=p.keys.index_copy(0, rows, new.keys), values=p.values.index_copy(0, rows, new.values),
                    lengths=p.lengths.index_copy(0, rows, new.lengths),
                    indices=p.indices.index_copy(0, rows, new.indices))


class KVCache:
    """Per-layer cached keys/values of the running requests (see the module docstring)."""

    def __init__(self, keep_ratio: float = 1.0, backend: str = "auto", *, packed: bool | None = None) -> None:
        """packed=None: packed per-head caches iff keep_ratio < 1 (packed=True with keep_ratio=1 keeps every key
        in the packed layout, which equals dense reuse: for tests of the sparse path)."""
        self.keep_ratio = float(keep_ratio)
        self.backend = backend
        self._packed_layout = self.keep_ratio < 1.0 if packed is None else bool(packed)
        self.index: list[int] = []  # request index of each row
        self.kpm: torch.Tensor | None = None  # [B, W] bool, True = a real token
        self.k: list[torch.Tensor] = []  # dense: per layer [B, Hkv, W, D]
        self.v: list[torch.Tensor] = []
        self.packed: list[PackedKV] = []  # sparse: per layer

    @property
    def sparse(self) -> bool:
        return self._packed_layout

    def __contains__(self, request_index: int) -> bool:
        return request_index in self.index

    # ------------------------------------------------------------------ rows
    def keep(self, indices: Sequence[int]) -> None:
        """Drop the rows of requests not in `indices` (finished ones); the order of the kept rows is unchanged."""
        wanted = set(indices)
        if all(i in wanted for i in self.index):
            return
        rows = [r for r, i in enumerate(self.index) if i in wanted]
        sel = torch.tensor(rows, dtype=torch.long, device=self.kpm.device if self.kpm is not None else "cpu")
        self.index = [self.index[r] for r in rows]
        if self.kpm is not None:
            self.kpm = self.kpm.index_select(0, sel)
        self.k = [t.index_select(0, sel) for t in self.k]
        self.v = [t.index_select(0, sel) for t in self.v]
        self.packed = [_take_packed(p, sel) for p in self.packed]

    def rows_of(self, indices: Sequence[int]) -> torch.Tensor | None:
        """Row numbers of these requests, None when they are exactly all rows in order (no gather needed)."""
        if list(indices) == self.index:
            return None
        device = self.kpm.device if self.kpm is not None else "cpu"
        return torch.tensor([self.index.index(i) for i in indices], dtype=torch.long, device=device)

    # ------------------------------------------------------------------ refresh
    def observer(self, kpm: torch.Tensor, spans: Sequence[tuple[int, int]]):
        """(observe, layers): observe(layer, q, k, v) collects what a Refresh keeps for rows with key-padding mask
        `kpm` [b, W] and query spans [start, end) in slot coordinates; `layers` is filled in layer order."""
        layers: list[object] = []
        span_q = None
        outside = None
        if self.sparse:
            device = kpm.device
            longest = max(e - s for s, e in spans)
            idx = torch.tensor([[s + min(j, e - s - 1) for j in range(longest)] for s, e in spans],
                               dtype=torch.long, device=device)  # short spans repeat their last query (max-safe)
            in_span = torch.zeros_like(kpm)
            for r, (s, e) in enumerate(spans):
                in_span[r, s:e] = True
            outside = kpm & ~in_span
            span_q = idx

        def observe(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
            if not self.sparse:
                layers.append((k, v))
                return
            b, hq, _, d = q.shape
            qs = q.gather(2, span_q[:, None, :, None].expand(b, hq, span_q.shape[1], d))
            layers.append(select_salient_keys(qs, k, v, outside, self.keep_ratio))

        return observe, layers

    def store(self, indices: Sequence[int], kpm: torch.Tensor, layers: list[object]) -> None:
        """Write a Refresh of the requests `indices` (rows of `kpm` [b, W] and of each layer's tensors)."""
        indices = list(indices)
        if not self.index or indices == self.index:
            self.index, self.kpm = indices, kpm
            if self.sparse:
                self.packed = list(layers)  # type: ignore[arg-type]
            else:
                self.k = [k for k, _ in layers]  # type: ignore[misc]
                self.v = [v for _, v in layers]  # type: ignore[misc]
            return
        present = [j for j, i in enumerate(indices) if i in self.index]
        new = [j for j, i in enumerate(indices) if i not in self.index]
        device = kpm.device
        if present:
            src = torch.tensor(present, dtype=torch.long, device=device)
            dst = torch.tensor([self.index.index(indices[j]) for j in present], dtype=torch.long, device=device)
            self.kpm = self.kpm.index_copy(0, dst, kpm.index_select(0, src))
            for li, layer in enumerate(layers):
                if self.sparse:
                    self.packed[li] = _put_packed(self.packed[li], dst, _take_packed(layer, src))  # type: ignore[arg-type]
                else:
                    k, v = layer  # type: ignore[misc]
                    self.k[li].index_copy_(0, dst, k.index_select(0, src))
                    self.v[li].index_copy_(0, dst, v.index_select(0, src))
        if new:
            src = torch.tensor(new, dtype=torch.long, device=device)
            self.index += [indices[j] for j in new]
            self.kpm = torch.cat([self.kpm, kpm.index_select(0, src)])
            for li, layer in enumerate(layers):
                if self.sparse:
                    self.packed[li] = _cat_packed(self.packed[li], _take_packed(layer, src))  # type: ignore[arg-type]
                else:
                    k, v = layer  # type: ignore[misc]
                    self.k[li] = torch.cat([self.k[li], k.index_select(0, src)])
                    self.v[li] = torch.cat([self.v[li], v.index_select(0, src)])

    # ------------------------------------------------------------------ reuse
    def attend(self, indices: Sequence[int], slots: torch.Tensor):
        """attend(layer, q, k, v) for a Reuse forward of the requests `indices`, whose span tokens sit at `slots`
        [b, Lq] (slot coordinates); q [b, Hq, Lq, D], fresh k, v [b, Hkv, Lq, D]."""
        rows = self.rows_of(indices)
        b = slots.shape[0]
        if self.sparse:
            packed = self.packed if rows is None else [_take_packed(p, rows) for p in self.packed]

            def attend_sparse(layer: int, q, k, v):
                return packed_kv_attention(q, packed[layer], k, v, backend=self.backend)

            return attend_sparse

        kpm = self.kpm if rows is None else self.kpm.index_select(0, rows)
        biases: dict[torch.dtype, torch.Tensor | None] = {}
        bidx = torch.arange(b, device=slots.device)[:, None]

        def attend_dense(layer: int, q, k, v):
            kc = self.k[layer] if rows is None else self.k[layer].index_select(0, rows)
            vc = self.v[layer] if rows is None else self.v[layer].index_select(0, rows)
            kc[bidx, :, slots] = k.permute(0, 2, 1, 3).to(kc.dtype)
            vc[bidx, :, slots] = v.permute(0, 2, 1, 3).to(vc.dtype)
            if q.dtype not in biases:
                biases[q.dtype] = attention_bias(kpm, q.dtype)
            if q.shape[1] == kc.shape[1]:
                return bidirectional_attention(q, kc, vc, biases[q.dtype])
            # grouped-query heads without materialising the cache n_rep times (it is re-read every Reuse step)
            return F.scaled_dot_product_attention(q, kc, vc, attn_mask=biases[q.dtype], enable_gqa=True)

        return attend_dense

    @property
    def nbytes(self) -> int:
        tensors = self.k + self.v + [t for p in self.packed for t in (p.keys, p.values, p.indices)]
        return sum(t.numel() * t.element_size() for t in tensors)
