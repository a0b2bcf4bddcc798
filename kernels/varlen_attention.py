"""Variable-length bidirectional attention: every sequence of a step in ONE call (FlashAttention's varlen layout).

  q [T, Hq, D]      the step's packed query rows; sequence b owns rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1]
  k, v [S, Hkv, D]  key/value slots (a KV pool layer, or the step's own fresh rows); sequence b's keys are the slots
                    key_slots[cu_seqlens_k[b] .. cu_seqlens_k[b + 1]] (any order, any slots: pages, ranges)
  keep [S, Hkv]     optional per-(slot, KV head) mask, applied to the sequences with use_keep[b] (sparse Reuse)
  out [T, Hq, D]    softmax(q K_b^T * scale) V_b per sequence, query head h reading KV head h // (Hq / Hkv)

Backends (`varlen_attention`): Triton on CUDA (kernels/_triton_varlen_attention.py), the tiled torch path elsewhere,
and `reference_varlen_attention` (a per-sequence loop of plain softmax attention) for tests.
The tiled torch path is bitwise batch invariant on the CPU (docs/attention.md): every sequence's queries are cut
into tiles of TILE_Q rows, each tile gathers its sequence's keys padded to the step's longest in chunks of KEY_CHUNK,
and every reduction runs over a fixed-size innermost dim or sequentially over the chunk dim, so a request's rows are
bitwise the same alone, in any batch, and at any key padding.
`VarlenLayout` is the host-side metadata, built once per step and moved to the device once; `select_salient_keys`
marks, per refreshing sequence and KV head, the ceil(keep_ratio * m) keys outside its span its span queries attend
to most (the sparse cache's keep mask), through the same tiles.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dllm_constrain.kernels._backend import load_kernels, record, resolve_backend

TILE_Q = 16  # query rows per tile of the torch path (a constant: a row's result depends on it)
KEY_CHUNK = 64  # keys per chunk of the torch path (padding of whole chunks adds exact zeros)
_KERNEL_MODULE = "dllm_constrain.kernels._triton_varlen_attention"


@dataclass(frozen=True)
class VarlenLayout:
    """One step's attention metadata (device tensors), for the Triton kernel and the tiled torch path alike."""

    cu_seqlens_q: torch.Tensor  # int32 [B + 1]
    cu_seqlens_k: torch.Tensor  # int32 [B + 1]
    key_slots: torch.Tensor  # int32 [total keys]
    use_keep: torch.Tensor  # int32 [B]: 1 where the keep mask applies
    max_seqlen_q: int
    rows: int  # T: query rows (rows outside every sequence get zeros from Triton, any finite value from torch)
    # tiled torch path
    q_index: torch.Tensor  # int64 [tiles * TILE_Q]: the packed row of each tile row (padding: the tile's first row)
    key_index: torch.Tensor  # int64 [tiles * kpad]: the slot of each tile key (padding: slot 0)
    key_valid: torch.Tensor  # bool [tiles, 1, kpad]
    tile_keep: torch.Tensor  # bool [tiles, 1, 1]: the keep mask applies to this tile
    out_index: torch.Tensor  # int64 [T]: each packed row's place in the tiles' rows
    tiles: int

    @classmethod
    def build(cls, q_starts: list[int], q_lens: list[int], key_slots: list[torch.Tensor], use_keep: list[bool],
              rows: int, device: torch.device | str = "cpu",
              key_valid: list[torch.Tensor] | None = None) -> "VarlenLayout":
        """Sequence b: query rows [q_starts[b], q_starts[b] + q_lens[b]) of the T=`rows` packed rows, keys at the slots
        `key_slots[b]` (int64, CPU), the keep mask on where use_keep[b]; key_valid[b] (bool, optional) narrows the
        tiled path's keys (the Triton kernel takes every key). Host work, then one copy per tensor."""
        n = len(q_lens)
        cu_q = [0] * (n + 1)
        cu_k = [0] * (n + 1)
        for b in range(n):
            cu_q[b + 1] = cu_q[b] + q_lens[b]
            cu_k[b + 1] = cu_k[b] + int(key_slots[b].numel())
        longest = max((int(s.numel()) for s in key_slots), default=1)
        kpad = max(1, -(-longest // KEY_CHUNK)) * KEY_CHUNK
        per_seq = [-(-q // TILE_Q) for q in q_lens]
        tiles = sum(per_seq)
        tile_rows = torch.arange(TILE_Q)
        q_index = torch.zeros(tiles, TILE_Q, dtype=torch.long)
        key_index = torch.zeros(tiles, kpad, dtype=torch.long)
        valid_t = torch.zeros(tiles, kpad, dtype=torch.bool)
        tile_keep = torch.zeros(tiles, dtype=torch.bool)
        out_index = torch.zeros(rows, dtype=torch.long)
        t = 0
        for b in range(n):
            nk = int(key_slots[b].numel())
            for j in range(per_seq[b]):
                first = j * TILE_Q
                real = min(TILE_Q, q_lens[b] - first)
                q_index[t] = q_starts[b] + first + torch.where(tile_rows < real, tile_rows, 0)
                key_index[t, :nk] = key_slots[b]
                valid_t[t, :nk] = True if key_valid is None else key_valid[b]
                tile_keep[t] = use_keep[b]
                out_index[q_starts[b] + first:q_starts[b] + first + real] = t * TILE_Q + tile_rows[:real]
                t += 1
        def dev(x: torch.Tensor) -> torch.Tensor:
            return x.to(device, non_blocking=True)

        flat = torch.cat(key_slots) if key_slots else torch.zeros(0, dtype=torch.long)
        return cls(cu_seqlens_q=dev(torch.tensor(cu_q, dtype=torch.int32)),
                   cu_seqlens_k=dev(torch.tensor(cu_k, dtype=torch.int32)),
                   key_slots=dev(flat.to(torch.int32)), use_keep=dev(torch.tensor(use_keep, dtype=torch.int32)),
                   max_seqlen_q=max(q_lens, default=0), rows=rows, q_index=dev(q_index.view(-1)),
                   key_index=dev(key_index.view(-1)), key_valid=dev(valid_t.view(tiles, 1, kpad)),
                   tile_keep=dev(tile_keep.view(tiles, 1, 1)), out_index=dev(out_index), tiles=tiles)


def tile_scores(q: torch.Tensor, k: torch.Tensor, q_index: torch.Tensor, key_index: torch.Tensor,
                key_mask: torch.Tensor, tiles: int, tile_q: int, chunk: int, scale: float) -> torch.Tensor:
    """Masked scores [tiles, Hkv, chunks, rep * tile_q, chunk] (float32; -inf at masked keys) of the tiled layout:
    query head r of group g is row r * tile_q + i of group g."""
    hq, d = q.shape[1], q.shape[2]
    hkv = k.shape[1]
    rep = hq // hkv
    kpad = key_index.shape[0] // tiles
    qt = q.index_select(0, q_index).float().view(tiles, tile_q, hkv, rep, d)
    qt = qt.permute(0, 2, 3, 1, 4).reshape(tiles, hkv, 1, rep * tile_q, d)
    kt = k.index_select(0, key_index).float().view(tiles, kpad // chunk, chunk, hkv, d).permute(0, 3, 1, 4, 2)
    s = torch.matmul(qt, kt) * scale  # [tiles, Hkv, chunks, rep * tile_q, chunk]
    mask = key_mask.view(tiles, key_mask.shape[1], kpad // chunk, 1, chunk)
    return s.masked_fill(~mask, float("-inf"))


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_index: torch.Tensor,
                    key_index: torch.Tensor, key_mask: torch.Tensor, out_index: torch.Tensor, tiles: int,
                    tile_q: int, chunk: int, scale: float) -> torch.Tensor:
    """The tiled torch path: [T, Hq, D] (TorchScript-compatible: the GIL-free forward calls it too)."""
    hq, d = q.shape[1], q.shape[2]
    hkv = k.shape[1]
    rep = hq // hkv
    kpad = key_index.shape[0] // tiles
    s = tile_scores(q, k, q_index, key_index, key_mask, tiles, tile_q, chunk, scale)
    m = s.amax(dim=-1, keepdim=True).amax(dim=2, keepdim=True)  # exact: max is order-free
    p = torch.exp(s - m)
    denom = p.sum(dim=-1, keepdim=True).sum(dim=2)  # [tiles, Hkv, M, 1]: chunk sums added in order
    vt = v.index_select(0, key_index).float().view(tiles, kpad // chunk, chunk, hkv, d).permute(0, 3, 1, 2, 4)
    o = torch.matmul(p, vt).sum(dim=2) / denom  # [tiles, Hkv, rep * tile_q, D]
    o = o.view(tiles, hkv, rep, tile_q, d).permute(0, 3, 1, 2, 4).reshape(tiles * tile_q, hq, d)
    return o.index_select(0, out_index).to(q.dtype)


def tile_key_mask(layout: VarlenLayout, keep: torch.Tensor | None) -> torch.Tensor:
    """bool [tiles, 1 or Hkv, kpad]: a tile's valid keys, narrowed by the keep mask [S, Hkv] where it applies."""
    if keep is None:
        return layout.key_valid
    kpad = layout.key_valid.shape[-1]
    kept = keep.index_select(0, layout.key_index).view(layout.tiles, kpad, keep.shape[1]).transpose(1, 2)
    return layout.key_valid & (kept | ~layout.tile_keep)


def reference_varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                               cu_seqlens_k: torch.Tensor, key_slots: torch.Tensor, keep: torch.Tensor | None = None,
                               use_keep: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """Plain float32 softmax attention, one sequence at a time (zeros for rows outside every sequence)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    rep = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        slots = key_slots[ck[b]:ck[b + 1]].long()
        qs = q[cq[b]:cq[b + 1]].float().transpose(0, 1)  # [Hq, Lq, D]
        ks = k[slots].float().transpose(0, 1).repeat_interleave(rep, dim=0)  # [Hq, Lk, D]
        vs = v[slots].float().transpose(0, 1).repeat_interleave(rep, dim=0)
        s = qs @ ks.transpose(-1, -2) * scale
        if keep is not None and use_keep is not None and bool(use_keep[b]):
            mask = keep[slots].transpose(0, 1).repeat_interleave(rep, dim=0)  # [Hq, Lk]
            s = s.masked_fill(~mask[:, None, :], float("-inf"))
        out[cq[b]:cq[b + 1]] = (torch.softmax(s, dim=-1) @ vs).transpose(0, 1)
    return out.to(q.dtype)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: VarlenLayout,
                     keep: torch.Tensor | None = None, *, scale: float | None = None,
                     backend: str = "auto") -> torch.Tensor:
    """Every sequence of `layout` in one call: q [T, Hq, D], k/v [S, Hkv, D] -> [T, Hq, D] (see the module
    docstring). backend: "auto" (Triton on CUDA, the tiled torch path elsewhere) | "triton" | "torch"."""
    if q.shape[1] % k.shape[1] or q.shape[2] != k.shape[2] or k.shape != v.shape:
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    chosen = resolve_backend(backend, q.device)
    record("varlen_attention", chosen)
    if chosen == "triton":
        return load_kernels(_KERNEL_MODULE).varlen_attention(q, k, v, layout, keep, scale)
    return tiled_attention(q, k, v, layout.q_index, layout.key_index, tile_key_mask(layout, keep),
                           layout.out_index, layout.tiles, TILE_Q, KEY_CHUNK, scale)


def keep_counts(outside: list[int], keep_ratio: float) -> list[int]:
    """ceil(keep_ratio * m) per sequence (m keys outside its span), at least 1 when m > 0, rounded first so that
    0.3 * 10 keeps 3 (as kernels.packed_kv_attention.keep_count)."""
    return [min(m, max(1 if m > 0 else 0, math.ceil(round(m * keep_ratio, 6)))) for m in outside]


def select_salient_keys(q: torch.Tensor, k: torch.Tensor, layout: VarlenLayout, seq_of_tile: torch.Tensor,
                        query_valid: torch.Tensor, counts: torch.Tensor, sequences: int, kmax: int,
                        *, scale: float | None = None) -> torch.Tensor:
    """bool [sequences, Hkv, kpad]: per sequence and KV head, its counts[b] most salient keys (ties: the earlier key).

    `layout` tiles each sequence's span queries against its keys outside the span (key_valid); saliency is the max
    over the span's queries and the query heads of the group of the softmax probability over those keys, as in
    kernels.packed_kv_attention.select_salient_keys. seq_of_tile int64 [tiles]; query_valid bool [tiles, TILE_Q];
    counts int64 [sequences]; kmax = max(counts) (known on the host)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    tiles, kpad, hkv = layout.tiles, layout.key_valid.shape[-1], k.shape[1]
    s = tile_scores(q, k, layout.q_index, layout.key_index, layout.key_valid, tiles, TILE_Q, KEY_CHUNK, scale)
    m = s.amax(dim=-1, keepdim=True).amax(dim=2, keepdim=True)
    p = torch.exp(s - m)
    p = p / p.sum(dim=-1, keepdim=True).sum(dim=2, keepdim=True)  # [tiles, Hkv, chunks, rep * TILE_Q, chunk]
    rep = q.shape[1] // hkv
    rows = query_valid.repeat(1, rep).view(tiles, 1, 1, rep * TILE_Q, 1)
    sal = p.masked_fill(~rows, 0.0).amax(dim=3).reshape(tiles, hkv, kpad)
    per_seq = sal.new_zeros(sequences, hkv, kpad)
    per_seq.scatter_reduce_(0, seq_of_tile[:, None, None].expand(tiles, hkv, kpad), sal, "amax")
    valid = layout.key_valid.view(tiles, kpad).float()
    seen = valid.new_zeros(sequences, kpad).scatter_reduce_(0, seq_of_tile[:, None].expand(tiles, kpad), valid,
                                                            "amax")
    per_seq.masked_fill_(seen[:, None, :] == 0, float("-inf"))
    order = torch.sort(per_seq, dim=-1, descending=True, stable=True).indices[..., :kmax]
    used = torch.arange(kmax, device=q.device)[None, None, :] < counts[:, None, None]
    chosen = torch.zeros(sequences, hkv, kpad, dtype=torch.bool, device=q.device)
    return chosen.scatter_(2, order, used.expand(sequences, hkv, kmax))
