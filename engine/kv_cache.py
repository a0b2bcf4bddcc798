"""The Refresh/Reuse KV cache (Fast-dLLM's DualCache) and its head-centric sparse form: one entry per request.

Each running request owns its entry (`RequestKV`): per layer the keys/values of its own prompt + canvas (n tokens,
no padding), in slot coordinates 0..n-1 (slot j = the request's j-th token). Requests join (their first Refresh
creates the entry) and leave (`release`) at any step without touching any other entry: no row gather, no
re-padding to a new width, no copy of other requests' keys/values. Attention is computed per request against its
own entry (engine.model_runner packs every request's tokens into one forward for the projections and the MLP, and
calls `refresh_attention` / `reuse_attention` per request and layer).

Refresh (`refresh_attention`): the request's whole sequence went through the layer; its rotated k, v are kept.
  dense  (keep_ratio = 1): k, v [1, Hkv, n, D] are stored (a copy: Reuse steps write their span slots in place).
  sparse (keep_ratio < 1): each KV head keeps its own ceil(keep_ratio * m) most salient keys among the m keys
         outside the request's query span, scored against the span's queries at this refresh
         (`kernels.packed_kv_attention.select_salient_keys`, softmax-probability saliency), packed densely per head
         (`PackedKV`); the dense k, v are dropped.
Reuse (`reuse_attention`): only the query span [a, b) went through the layer; its fresh k, v are combined with the
  entry:
  dense:  written into the span's slots of the cached k, v (those slots held the span's keys of the last refresh or
          reuse), then bidirectional attention over all n slots, i.e.
          softmax(q [K_outside; K_span_fresh]^T / sqrt(d)) [V_outside; V_span_fresh]: DualCache.
  sparse: `packed_kv_attention(q, packed, k_fresh, v_fresh)`: the packed salient keys plus the span's fresh keys
          (Triton on CUDA, the torch reference elsewhere).
Reuse steps never write anything a later step reads except the span slots, which every Reuse step rewrites before
reading and every Refresh recomputes, and a request refreshes whenever its span moves (engine.model_runner).

Memory: a request's dense entry is 2 * layers * Hkv * D * n elements, fixed for its lifetime (a dLLM sequence has
its final length from the start), which is what the scheduler's token budget reserves at admission
(engine.scheduler). A paged pool (one preallocated tensor, blocks indexed by slot) is the GPU form of the same
bookkeeping; per-request tensors keep the CPU path simple and the rows exactly independent.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from dllm_constrain.engine.models.layers import bidirectional_attention
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


def _cat_packed(parts: list[PackedKV]) -> PackedKV:
    cap = max(p.capacity for p in parts)
    parts = [_pad_packed(p, cap) for p in parts]
    return PackedKV(keys=torch.cat([p.keys for p in parts]), values=torch.cat([p.values for p in parts]),
                    lengths=torch.cat([p.lengths for p in parts]), indices=torch.cat([p.indices for p in parts]))


@dataclass
class RequestKV:
    """One request's cached keys/values, one element per layer (filled in layer order by a Refresh)."""

    length: int  # tokens of the request's sequence (prompt + canvas)
    k: list[torch.Tensor] = field(default_factory=list)  # dense: [1, Hkv, length, D]
    v: list[torch.Tensor] = field(default_factory=list)
    packed: list[PackedKV] = field(default_factory=list)  # sparse

    @property
    def nbytes(self) -> int:
        tensors = self.k + self.v + [t for p in self.packed for t in (p.keys, p.values, p.indices)]
        return sum(t.numel() * t.element_size() for t in tensors)


class KVCache:
    """Per-request cached keys/values of the running requests (see the module docstring)."""

    def __init__(self, keep_ratio: float = 1.0, backend: str = "auto", *, packed: bool | None = None) -> None:
        """packed=None: packed per-head caches iff keep_ratio < 1 (packed=True with keep_ratio=1 keeps every key
        in the packed layout, which equals dense reuse: for tests of the sparse path)."""
        self.keep_ratio = float(keep_ratio)
        self.backend = backend
        self._packed_layout = self.keep_ratio < 1.0 if packed is None else bool(packed)
        self.entries: dict[int, RequestKV] = {}

    @property
    def sparse(self) -> bool:
        return self._packed_layout

    def __contains__(self, request_index: int) -> bool:
        return request_index in self.entries

    # ------------------------------------------------------------------ lifetime
    def release(self, request_index: int) -> None:
        """Drop one request's entry (it finished or was aborted); the other entries are untouched."""
        self.entries.pop(request_index, None)

    # ------------------------------------------------------------------ refresh
    def refresh_attention(self, request_index: int, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          span: tuple[int, int]) -> torch.Tensor:
        """Attention of one request's full sequence (q [1, Hq, n, D], k, v [1, Hkv, n, D]) at `layer`, storing what
        the cache keeps; layer 0 starts a new entry. `span` [a, b) is the query span of the following Reuse steps."""
        n = k.shape[2]
        if layer == 0:
            self.entries[request_index] = RequestKV(length=n)
        entry = self.entries[request_index]
        assert len(entry.k) + len(entry.packed) == layer, "refresh layers must arrive in order"
        if self.sparse:
            a, b = span
            outside = torch.ones(1, n, dtype=torch.bool, device=k.device)
            outside[:, a:b] = False
            entry.packed.append(select_salient_keys(q[:, :, a:b], k, v, outside, self.keep_ratio))
        else:
            entry.k.append(k.clone(memory_format=torch.contiguous_format))
            entry.v.append(v.clone(memory_format=torch.contiguous_format))
        return bidirectional_attention(q, k, v, None)

    def store_dense(self, request_index: int, length: int, k: list[torch.Tensor], v: list[torch.Tensor]) -> None:
        """A whole Refresh's dense entry at once (per layer [1, Hkv, length, D], contiguous): what `refresh_attention`
        stores layer by layer, for a forward that computed its attention itself (engine.models.scripted_forward)."""
        assert not self.sparse, "the packed (sparse) layout is built by refresh_attention"
        self.entries[request_index] = RequestKV(length=length, k=list(k), v=list(v))

    # ------------------------------------------------------------------ reuse
    def reuse_attention(self, request_index: int, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        span: tuple[int, int]) -> torch.Tensor:
        """Attention of one request's query span [a, b) (q [1, Hq, b - a, D], fresh k, v [1, Hkv, b - a, D]) against
        its entry at `layer`."""
        entry = self.entries[request_index]
        if self.sparse:
            return packed_kv_attention(q, entry.packed[layer], k, v, backend=self.backend)
        a, b = span
        kc, vc = entry.k[layer], entry.v[layer]
        kc[:, :, a:b] = k.to(kc.dtype)
        vc[:, :, a:b] = v.to(vc.dtype)
        if q.shape[1] == kc.shape[1]:
            return bidirectional_attention(q, kc, vc, None)
        # grouped-query heads without materialising the cache n_rep times (it is re-read every Reuse step)
        return F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)

    # ------------------------------------------------------------------ inspection
    @property
    def packed(self) -> list[PackedKV]:
        """Sparse layout, per layer: every entry's PackedKV stacked in the order the entries were made (for inspection and tests)."""
        entries = [e for e in self.entries.values() if e.packed]
        if not entries:
            return []
        return [_cat_packed([e.packed[layer] for e in entries]) for layer in range(len(entries[0].packed))]

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())
