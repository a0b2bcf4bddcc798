"""Variable-length bidirectional attention: every sequence of a step in ONE call (FlashAttention's varlen layout).

  q [Hq, T, D]      the step's packed query rows; sequence b owns rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1]
  k, v [Hkv, S, D]  key/value slots (a KV pool layer, or the step's own fresh rows); sequence b's keys are the slots
                    key_slots[cu_seqlens_k[b] .. cu_seqlens_k[b + 1]] (any order, any slots: pages, ranges)
  keep [Hkv, S]     optional per-(KV head, slot) mask, applied to the sequences with use_keep[b] (sparse Reuse)
  out [Hq, T, D]    softmax(q K_b^T * scale) V_b per sequence, query head h reading KV head h // (Hq / Hkv)
Head-major, the layout the model's [B, H, L, D] projections already have, so nothing is transposed.

`varlen_attention` is ONE op at the dispatcher, `torch.ops.dllm_constrain.varlen_attention` (a torch.library custom
op, as vLLM's unified_attention): torch.compile and dispatch modes see one opaque call (shape from its fake
implementation); inside, Triton on CUDA (kernels/_triton_varlen_attention.py, one launch) or the grouped torch path
(one SDPA per padded-shape group). `reference_varlen_attention` (plain softmax per sequence) is for tests.
The grouped torch path is bitwise batch invariant on the CPU (docs/attention.md): a sequence's queries are padded to
a multiple of QUERY_ROUND rows and its keys to a multiple of KEY_ROUND, and the sequences of one padded shape go
through one batched matmul-softmax-matmul, so every sequence computes at its own shape, alone or in any batch.
`VarlenLayout` is the host-side metadata, built once per step and moved to the device once; `select_salient_keys`
marks, per sequence and KV head, the most salient keys outside its span; `mark_salient_keys` writes them into the
sparse cache's keep mask as one op (torch.ops.dllm_constrain.mark_salient_keys_, mutating the mask).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dllm_constrain.kernels._backend import load_kernels, record, resolve_backend

QUERY_ROUND = 16  # a sequence's query rows are padded to a multiple of this (a constant: results depend on it)
KEY_ROUND = 64  # and its keys to a multiple of this
_KERNEL_MODULE = "dllm_constrain.kernels._triton_varlen_attention"


def _rounded(n: int, to: int) -> int:
    return max(1, -(-n // to)) * to


@dataclass(frozen=True)
class VarlenLayout:
    """One step's attention metadata (device tensors, host ints), for the Triton kernel and the grouped torch path."""

    cu_seqlens_q: torch.Tensor  # int32 [B + 1]
    cu_seqlens_k: torch.Tensor  # int32 [B + 1]
    key_slots: torch.Tensor  # int32 [total keys]
    use_keep: torch.Tensor  # int32 [B]: 1 where the keep mask applies
    max_seqlen_q: int
    rows: int  # T: query rows (rows outside every sequence: zeros from Triton, a finite value from torch)
    # grouped torch path: one group per padded shape (count, rows M, keys K), sequences in order within it
    counts: list[int]
    group_rows: list[int]
    group_keys: list[int]
    group_seqs: list[list[int]]  # host: the sequences of each group
    q_index: list[torch.Tensor]  # int64 [count * M]: the row of each padded query (padding: the sequence's first)
    key_index: list[torch.Tensor]  # int64 [count * K]: the slot of each padded key (padding: its first key)
    key_valid: list[torch.Tensor]  # bool [1, count, 1, K]
    key_bias: list[torch.Tensor]  # float32 [count, 1, 1, K]: 0 at valid keys, -inf elsewhere (the attention's mask)
    group_keep: list[torch.Tensor]  # bool [1, count, 1, 1]: the keep mask applies
    query_valid: list[torch.Tensor]  # bool [count, M]: the real query rows
    out_index: torch.Tensor  # int64 [T]: each row's place in the groups' concatenated padded rows
    grouped: bool = True  # False: the grouped torch path's fields are empty (built for Triton only)

    @classmethod
    def build(cls, q_starts: list[int], q_lens: list[int], key_slots: list[torch.Tensor], use_keep: list[bool],
              rows: int, device: torch.device | str = "cpu",
              key_valid: list[torch.Tensor] | None = None, grouped: bool = True) -> "VarlenLayout":
        """Sequence b: query rows [q_starts[b], q_starts[b] + q_lens[b]) of the T=`rows` packed rows, keys at the slots
        `key_slots[b]` (int64, CPU), the keep mask on where use_keep[b]; key_valid[b] (bool, optional) narrows the
        torch path's keys (the Triton kernel takes every key). Host work, then one copy per tensor. grouped=False
        builds only what the Triton kernel reads (cu_seqlens, slots, use_keep): no per-group index, mask or copy."""
        def dev(x: torch.Tensor) -> torch.Tensor:
            return x.to(device, non_blocking=True)

        n = len(q_lens)
        cu_q, cu_k = [0], [0]
        for b in range(n):
            cu_q.append(cu_q[-1] + q_lens[b])
            cu_k.append(cu_k[-1] + int(key_slots[b].numel()))
        flat = torch.cat(key_slots) if key_slots else torch.zeros(0, dtype=torch.long)
        varlen = dict(cu_seqlens_q=dev(torch.tensor(cu_q, dtype=torch.int32)),
                      cu_seqlens_k=dev(torch.tensor(cu_k, dtype=torch.int32)), key_slots=dev(flat.to(torch.int32)),
                      use_keep=dev(torch.tensor(use_keep, dtype=torch.int32)), max_seqlen_q=max(q_lens, default=0),
                      rows=rows)
        if not grouped:
            return cls(**varlen, counts=[], group_rows=[], group_keys=[], group_seqs=[], q_index=[], key_index=[],
                       key_valid=[], key_bias=[], group_keep=[], query_valid=[],
                       out_index=torch.zeros(0, dtype=torch.long, device=device), grouped=False)
        shapes = sorted({(_rounded(q_lens[b], QUERY_ROUND), _rounded(int(key_slots[b].numel()), KEY_ROUND))
                         for b in range(n)})
        seqs = [[b for b in range(n) if (_rounded(q_lens[b], QUERY_ROUND),
                                         _rounded(int(key_slots[b].numel()), KEY_ROUND)) == shape]
                for shape in shapes]
        out_index = torch.zeros(rows, dtype=torch.long)
        q_index, key_index, valid, bias, keep, real, at = [], [], [], [], [], [], 0
        for (m, k), members in zip(shapes, seqs):
            qi = torch.zeros(len(members), m, dtype=torch.long)
            ki = torch.zeros(len(members), k, dtype=torch.long)
            kv = torch.zeros(len(members), k, dtype=torch.bool)
            qv = torch.zeros(len(members), m, dtype=torch.bool)
            for j, b in enumerate(members):
                nq, nk = q_lens[b], int(key_slots[b].numel())
                qi[j] = q_starts[b]
                qi[j, :nq] = torch.arange(q_starts[b], q_starts[b] + nq)
                ki[j] = key_slots[b][0] if nk else 0
                ki[j, :nk] = key_slots[b]
                kv[j, :nk] = True if key_valid is None else key_valid[b]
                qv[j, :nq] = True
                out_index[q_starts[b]:q_starts[b] + nq] = torch.arange(at + j * m, at + j * m + nq)
            at += len(members) * m
            q_index.append(dev(qi.view(-1)))
            key_index.append(dev(ki.view(-1)))
            valid.append(dev(kv.view(1, len(members), 1, k)))
            bias.append(dev(torch.zeros(len(members), 1, 1, k).masked_fill_(~kv.view(-1, 1, 1, k), float("-inf"))))
            real.append(dev(qv))
            keep.append(dev(torch.tensor([use_keep[b] for b in members], dtype=torch.bool).view(1, -1, 1, 1)))
        return cls(**varlen, counts=[len(m) for m in seqs],
                   group_rows=[m for m, _ in shapes], group_keys=[k for _, k in shapes], group_seqs=seqs,
                   q_index=q_index, key_index=key_index, key_valid=valid, key_bias=bias, group_keep=keep,
                   query_valid=real, out_index=dev(out_index))


def group_probs(q: torch.Tensor, k: torch.Tensor, q_index: torch.Tensor, key_index: torch.Tensor,
                key_mask: torch.Tensor, count: int, m: int, kk: int, scale: float) -> torch.Tensor:
    """Softmax probabilities [Hkv, count, rep * m, kk] (float32, zero at masked keys) of one group: query head r of
    KV group g is row r * m + i."""
    hq, d = q.shape[0], q.shape[2]
    hkv = k.shape[0]
    rep = hq // hkv
    qt = q.index_select(1, q_index).float().view(hkv, rep, count, m, d).transpose(1, 2)
    qt = qt.reshape(hkv * count, rep * m, d)
    kt = k.index_select(1, key_index).float().view(hkv * count, kk, d)
    s = torch.bmm(qt, kt.transpose(1, 2)).view(hkv, count, rep * m, kk)
    s.mul_(scale).masked_fill_(~key_mask, float("-inf"))
    s.sub_(s.amax(dim=-1, keepdim=True)).exp_()
    return s.div_(s.sum(dim=-1, keepdim=True))


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_index: list[torch.Tensor],
                      key_index: list[torch.Tensor], key_mask: list[torch.Tensor], out_index: torch.Tensor,
                      counts: list[int], group_rows: list[int], group_keys: list[int], scale: float) -> torch.Tensor:
    """The grouped torch path: [Hq, T, D] (TorchScript-compatible: the GIL-free forward calls it too). Each group is
    one fused attention call (scaled_dot_product_attention) over its sequences at their common padded shape."""
    hq, d = q.shape[0], q.shape[2]
    hkv = k.shape[0]
    outs: list[torch.Tensor] = []
    for g in range(len(counts)):
        count, m, kk = counts[g], group_rows[g], group_keys[g]
        qt = q.index_select(1, q_index[g]).view(hq, count, m, d).transpose(0, 1)
        kt = k.index_select(1, key_index[g]).view(hkv, count, kk, d).transpose(0, 1).to(q.dtype)
        vt = v.index_select(1, key_index[g]).view(hkv, count, kk, d).transpose(0, 1).to(q.dtype)
        mask = key_mask[g].to(q.dtype)  # [count, 1 or Hkv, 1, K] additive
        if mask.shape[1] > 1 and hq != hkv:
            mask = mask.repeat_interleave(hq // hkv, dim=1)
        o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale, enable_gqa=hq != hkv)
        outs.append(o.transpose(0, 1).reshape(hq, count * m, d))
    return torch.cat(outs, dim=1).index_select(1, out_index)


def group_key_masks(layout: VarlenLayout, keep: torch.Tensor | None) -> list[torch.Tensor]:
    """Per group the additive key mask [count, 1 or Hkv, 1, K]: the valid keys, narrowed by the keep mask [Hkv, S]
    where it applies."""
    if keep is None:
        return layout.key_bias
    return _kept_key_masks(keep, layout.key_index, layout.key_valid, layout.group_keep, layout.counts)


def _kept_key_masks(keep: torch.Tensor, key_index: list[torch.Tensor], key_valid: list[torch.Tensor],
                    group_keep: list[torch.Tensor], counts: list[int]) -> list[torch.Tensor]:
    masks = []
    for g, valid in enumerate(key_valid):
        kept = keep.index_select(1, key_index[g]).view(keep.shape[0], counts[g], 1, -1)
        ok = (valid & (kept | ~group_keep[g])).transpose(0, 1)
        masks.append(torch.zeros(ok.shape, device=ok.device).masked_fill_(~ok, float("-inf")))
    return masks


def reference_varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                               cu_seqlens_k: torch.Tensor, key_slots: torch.Tensor, keep: torch.Tensor | None = None,
                               use_keep: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """Plain float32 softmax attention, one sequence at a time (zeros for rows outside every sequence)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    rep = q.shape[0] // k.shape[0]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        slots = key_slots[ck[b]:ck[b + 1]].long()
        qs = q[:, cq[b]:cq[b + 1]].float()  # [Hq, Lq, D]
        ks = k[:, slots].float().repeat_interleave(rep, dim=0)  # [Hq, Lk, D]
        vs = v[:, slots].float().repeat_interleave(rep, dim=0)
        s = qs @ ks.transpose(-1, -2) * scale
        if keep is not None and use_keep is not None and bool(use_keep[b]):
            mask = keep[:, slots].repeat_interleave(rep, dim=0)  # [Hq, Lk]
            s = s.masked_fill(~mask[:, None, :], float("-inf"))
        out[:, cq[b]:cq[b + 1]] = torch.softmax(s, dim=-1) @ vs
    return out.to(q.dtype)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: VarlenLayout,
                     keep: torch.Tensor | None = None, *, scale: float | None = None,
                     backend: str = "auto") -> torch.Tensor:
    """Every sequence of `layout` in one call: q [Hq, T, D], k/v [Hkv, S, D] -> [Hq, T, D] (see the module
    docstring). backend: "auto" (Triton on CUDA, the grouped torch path elsewhere) | "triton" | "torch". One
    dispatch of the custom op `torch.ops.dllm_constrain.varlen_attention`."""
    if q.shape[0] % k.shape[0] or q.shape[2] != k.shape[2] or k.shape != v.shape:
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    chosen = resolve_backend(backend, q.device)
    if chosen == "torch" and not layout.grouped:
        raise ValueError("the grouped torch path needs a layout built with grouped=True")
    record("varlen_attention", chosen)
    return torch.ops.dllm_constrain.varlen_attention(
        q, k, v, keep, layout.cu_seqlens_q, layout.cu_seqlens_k, layout.key_slots, layout.use_keep,
        layout.max_seqlen_q, layout.q_index, layout.key_index, layout.key_bias, layout.key_valid, layout.group_keep,
        layout.out_index, layout.counts, layout.group_rows, layout.group_keys, scale, chosen)


_OP_SCHEMA = ("(Tensor q, Tensor k, Tensor v, Tensor? keep, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
              "Tensor key_slots, Tensor use_keep, int max_seqlen_q, Tensor[] q_index, Tensor[] key_index, "
              "Tensor[] key_bias, Tensor[] key_valid, Tensor[] group_keep, Tensor out_index, int[] counts, "
              "int[] group_rows, int[] group_keys, float scale, str backend) -> Tensor")


@torch.library.custom_op("dllm_constrain::varlen_attention", mutates_args=(), schema=_OP_SCHEMA)
def _varlen_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None,
                         cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, key_slots: torch.Tensor,
                         use_keep: torch.Tensor, max_seqlen_q: int, q_index: list[torch.Tensor],
                         key_index: list[torch.Tensor], key_bias: list[torch.Tensor], key_valid: list[torch.Tensor],
                         group_keep: list[torch.Tensor], out_index: torch.Tensor, counts: list[int],
                         group_rows: list[int], group_keys: list[int], scale: float, backend: str) -> torch.Tensor:
    """The op's implementation on every device: backend "triton" (CUDA, or Triton's interpreter): one kernel
    launch; "torch": the grouped path, one SDPA per padded-shape group (several aten ops inside the one op). The
    output is a new contiguous [Hq, T, D] tensor (the fake implementation's promise to torch.compile)."""
    if backend == "triton":
        return load_kernels(_KERNEL_MODULE).varlen_attention(q, k, v, keep, cu_seqlens_q, cu_seqlens_k, key_slots,
                                                             use_keep, max_seqlen_q, scale)
    masks = key_bias if keep is None else _kept_key_masks(keep, key_index, key_valid, group_keep, counts)
    return grouped_attention(q, k, v, q_index, key_index, masks, out_index, counts, group_rows, group_keys, scale)


@_varlen_attention_op.register_fake
def _(q: torch.Tensor, *args: object) -> torch.Tensor:
    return q.new_empty(q.shape)  # contiguous, whatever q's strides, as both implementations return it


def keep_counts(outside: list[int], keep_ratio: float) -> list[int]:
    """ceil(keep_ratio * m) per sequence (m keys outside its span), at least 1 when m > 0, rounded first so that
    0.3 * 10 keeps 3 (as kernels.packed_kv_attention.keep_count)."""
    return [min(m, max(1 if m > 0 else 0, math.ceil(round(m * keep_ratio, 6)))) for m in outside]


def select_salient_keys(q: torch.Tensor, k: torch.Tensor, layout: VarlenLayout, needs: list[torch.Tensor],
                        kmaxes: list[int], *, scale: float | None = None) -> list[torch.Tensor]:
    """Per group of `layout`, bool [Hkv, count, K]: per sequence and KV head, its needs[g][j] most salient keys
    (ties: the earlier key; kmaxes[g] = max(needs[g]), known on the host). `layout` has each sequence's span queries
    against its keys, key_valid marking those outside the span; saliency is the max over the span's queries and the
    query heads of the group of the softmax probability over those keys (kernels.packed_kv_attention's)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _salient(q, k, layout.q_index, layout.key_index, layout.key_valid, layout.query_valid, layout.counts,
                    layout.group_rows, layout.group_keys, needs, kmaxes, scale)


def _salient(q: torch.Tensor, k: torch.Tensor, q_index: list[torch.Tensor], key_index: list[torch.Tensor],
             key_valid: list[torch.Tensor], query_valid: list[torch.Tensor], counts: list[int], group_rows: list[int],
             group_keys: list[int], needs: list[torch.Tensor], kmaxes: list[int], scale: float) -> list[torch.Tensor]:
    hkv = k.shape[0]
    rep = q.shape[0] // hkv
    chosen = []
    for g in range(len(counts)):
        count, m, kk = counts[g], group_rows[g], group_keys[g]
        valid = key_valid[g]
        p = group_probs(q, k, q_index[g], key_index[g], valid, count, m, kk, scale)
        rows = query_valid[g].view(1, count, 1, m).expand(1, count, rep, m).reshape(1, count, rep * m, 1)
        sal = p.masked_fill_(~rows, 0.0).amax(dim=2).masked_fill_(~valid.view(1, count, kk), float("-inf"))
        kmax = max(1, kmaxes[g])
        order = torch.sort(sal, dim=-1, descending=True, stable=True).indices[..., :kmax]
        used = torch.arange(kmax, device=q.device)[None, None, :] < needs[g][None, :, None]
        mask = torch.zeros(hkv, count, kk, dtype=torch.bool, device=q.device)
        chosen.append(mask.scatter_(2, order, used.expand(hkv, count, kmax)))
    return chosen


def mark_salient_keys(q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor, layout: VarlenLayout,
                      needs: list[torch.Tensor], kmaxes: list[int], always: list[torch.Tensor],
                      src: list[torch.Tensor], dst: list[torch.Tensor]) -> None:
    """The sparse Refresh's keep mask, written into `keep` [Hkv, S] in ONE op at the dispatcher
    (torch.ops.dllm_constrain.mark_salient_keys_, declared to mutate `keep`): per group, the salient keys
    (`select_salient_keys`) or'ed with `always` [1, count, K] (the span), flattened (sequence, position) -> `src`,
    written at the pool slots `dst`."""
    torch.ops.dllm_constrain.mark_salient_keys_(
        q, k, keep, layout.q_index, layout.key_index, layout.key_valid, layout.query_valid, layout.counts,
        layout.group_rows, layout.group_keys, needs, kmaxes, always, src, dst, 1.0 / math.sqrt(q.shape[-1]))


_MARK_SCHEMA = ("(Tensor q, Tensor k, Tensor(a!) keep, Tensor[] q_index, Tensor[] key_index, Tensor[] key_valid, "
                "Tensor[] query_valid, int[] counts, int[] group_rows, int[] group_keys, Tensor[] needs, "
                "int[] kmaxes, Tensor[] always, Tensor[] src, Tensor[] dst, float scale) -> ()")


@torch.library.custom_op("dllm_constrain::mark_salient_keys_", mutates_args=("keep",), schema=_MARK_SCHEMA)
def _mark_salient_keys_op(q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor, q_index: list[torch.Tensor],
                          key_index: list[torch.Tensor], key_valid: list[torch.Tensor],
                          query_valid: list[torch.Tensor], counts: list[int], group_rows: list[int],
                          group_keys: list[int], needs: list[torch.Tensor], kmaxes: list[int],
                          always: list[torch.Tensor], src: list[torch.Tensor], dst: list[torch.Tensor],
                          scale: float) -> None:
    chosen = _salient(q, k, q_index, key_index, key_valid, query_valid, counts, group_rows, group_keys, needs,
                      kmaxes, scale)
    for g, c in enumerate(chosen):
        flat = (c | always[g]).view(c.shape[0], -1)
        keep.index_copy_(1, dst[g], flat.index_select(1, src[g]))


@_mark_salient_keys_op.register_fake
def _(*args: object) -> None:
    return None
