"""Head-centric sparse attention: block queries against a per-KV-head packed cache of salient keys.

At a refresh step the engine has full cached keys/values K, V [B, Hkv, L, D] (prompt and positions outside the
active block) and the active block's queries q [B, Hq, Lq, D]. `select_salient_keys` keeps, for every KV head
separately, the cached keys the block's queries attend to most, and packs them densely:

  saliency[b, h, j] = max over the block's queries i and the query heads of group h of
                        a_ij = softmax_j(q_i . k_j * scale)      (saliency="prob", default)
                        q_i . k_j * scale                         (saliency="logit")
  keep_b = ceil(keep_ratio * n_b) (n_b real cached keys, >= 1 when n_b > 0); packed[b, h] = the keep_b most salient
  keys of head h in their original order, then zero padding

so a Reuse step attends, per head, to a dense [keep_b, D] cache plus the block's fresh keys (softmax probability
is the default score: a dropped key j moves query i's output by at most a_ij times the value spread).

`packed_kv_attention` computes, for each query head h (KV head h // (Hq / Hkv)):
  out = softmax([q K_packed^T, q K_fresh^T] * scale) [V_packed; V_fresh]
        over the first lengths[b, h_kv] packed keys and all Lq fresh keys (bidirectional: no causal mask).
With keep_ratio = 1.0 every real key is kept: dense attention over the full cache.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dllm_constrain.kernels._backend import interpreting, load_kernels, record, resolve_backend

_KERNEL_MODULE = "dllm_constrain.kernels._triton_packed_kv_attention"


@dataclass
class PackedKV:
    """A per-KV-head packed cache. keys/values [B, Hkv, K, D]; lengths int32 [B, Hkv] (slots >= length are zero
    padding); indices int64 [B, Hkv, K], the position in the full cache of each kept key (-1 in padding slots)."""

    keys: torch.Tensor
    values: torch.Tensor
    lengths: torch.Tensor
    indices: torch.Tensor

    @property
    def capacity(self) -> int:
        return int(self.keys.shape[2])


def keep_count(n_real: torch.Tensor, keep_ratio: float) -> torch.Tensor:
    """ceil(keep_ratio * n) per row, at least 1 when n > 0 (rounded first so 0.3 * 10 keeps 3, not 4)."""
    k = torch.ceil(torch.round(n_real.double() * keep_ratio, decimals=6)).long()
    return torch.minimum(torch.maximum(k, (n_real > 0).long()), n_real.long())


def select_salient_keys(
    q_block: torch.Tensor,
    k_full: torch.Tensor,
    v_full: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    keep_ratio: float = 0.5,
    *,
    scale: float | None = None,
    saliency: str = "prob",
) -> PackedKV:
    """Pack, per KV head, the cached keys most salient to the block's queries (see the module docstring).

    q_block [B, Hq, Lq, D]; k_full, v_full [B, Hkv, L, D]; key_padding_mask bool [B, L], True = a real cached key
    (False for left padding, and for the active block's own positions, whose keys are supplied fresh at each step).
    Ties in saliency go to the earlier position. Plain torch: it runs once per refresh, not per step.
    """
    if not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must be in (0, 1], got {keep_ratio}")
    if saliency not in ("prob", "logit"):
        raise ValueError(f"saliency must be 'prob' or 'logit', got {saliency!r}")
    B, Hq, Lq, D = q_block.shape
    Bk, Hkv, L, Dk = k_full.shape
    if (Bk, Dk) != (B, D) or v_full.shape[:3] != k_full.shape[:3] or Hq % Hkv:
        raise ValueError(f"shape mismatch: q {tuple(q_block.shape)}, k {tuple(k_full.shape)}, v {tuple(v_full.shape)}")
    n_rep = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    device = k_full.device
    if key_padding_mask is None:
        key_padding_mask = torch.ones(B, L, dtype=torch.bool, device=device)
    real = key_padding_mask.to(device=device, dtype=torch.bool)

    qg = q_block.float().reshape(B, Hkv, n_rep * Lq, D)  # query heads of one group are adjacent (GQA layout)
    scores = torch.matmul(qg, k_full.float().transpose(-1, -2)) * scale  # [B, Hkv, n_rep*Lq, L]
    scores.masked_fill_(~real[:, None, None, :], float("-inf"))
    if saliency == "prob":
        scores = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # a row with no real key: all zero
    sal = scores.amax(dim=2)  # [B, Hkv, L]
    del scores
    sal.masked_fill_(~real[:, None, :], float("-inf"))

    keep = keep_count(real.sum(-1), keep_ratio)  # [B]
    cap = int(keep.max().item()) if B else 0
    if cap == 0:  # no real cached key anywhere: one zero slot per head (length 0), so the kernel has real tensors
        zeros = k_full.new_zeros(B, Hkv, 1, D)
        return PackedKV(keys=zeros, values=v_full.new_zeros(B, Hkv, 1, D),
                        lengths=torch.zeros(B, Hkv, dtype=torch.int32, device=device),
                        indices=torch.full((B, Hkv, 1), -1, dtype=torch.long, device=device))
    order = torch.sort(sal, dim=-1, descending=True, stable=True).indices[..., :cap]  # [B, Hkv, cap]
    slot = torch.arange(cap, device=device)
    used = slot[None, None, :] < keep[:, None, None]  # [B, 1, cap] -> broadcast over heads
    used = used.expand(B, Hkv, cap)
    pos = torch.where(used, order, torch.full_like(order, L)).sort(dim=-1).values  # kept positions, ascending
    indices = torch.where(used, pos, torch.full_like(pos, -1))
    gather_at = indices.clamp_min(0)[..., None].expand(B, Hkv, cap, D)
    keys = torch.gather(k_full, 2, gather_at) * used[..., None]
    values = torch.gather(v_full, 2, gather_at) * used[..., None]
    lengths = keep[:, None].expand(B, Hkv).to(torch.int32).contiguous()
    return PackedKV(keys=keys.contiguous(), values=values.contiguous(), lengths=lengths, indices=indices)


def _check(q, packed: PackedKV, k_fresh, v_fresh) -> None:
    B, Hq, Lq, D = q.shape
    Bp, Hkv, K, Dp = packed.keys.shape
    if Bp != B or Dp != D or Hq % Hkv or packed.values.shape != packed.keys.shape:
        raise ValueError(f"packed cache {tuple(packed.keys.shape)} does not fit queries {tuple(q.shape)}")
    if tuple(k_fresh.shape) != (B, Hkv, Lq, D) or tuple(v_fresh.shape) != (B, Hkv, Lq, D):
        raise ValueError(f"fresh k/v must be [{B}, {Hkv}, {Lq}, {D}], got {tuple(k_fresh.shape)}, "
                         f"{tuple(v_fresh.shape)}")
    if tuple(packed.lengths.shape) != (B, Hkv):
        raise ValueError(f"lengths must be [{B}, {Hkv}], got {tuple(packed.lengths.shape)}")
    if Lq < 1:
        raise ValueError("the block needs at least one query")


def reference_packed_kv_attention(
    q: torch.Tensor, packed: PackedKV, k_fresh: torch.Tensor, v_fresh: torch.Tensor, *, scale: float | None = None
) -> torch.Tensor:
    """Plain-torch float32 softmax([q Kp^T, q Kf^T] * scale) [Vp; Vf], packed slots >= length masked out."""
    _check(q, packed, k_fresh, v_fresh)
    B, Hq, Lq, D = q.shape
    Hkv, K = packed.keys.shape[1], packed.keys.shape[2]
    n_rep = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    k = torch.cat([packed.keys, k_fresh], dim=2).float().repeat_interleave(n_rep, dim=1)
    v = torch.cat([packed.values, v_fresh], dim=2).float().repeat_interleave(n_rep, dim=1)
    slot = torch.arange(K, device=q.device)
    valid = torch.cat(
        [slot[None, None, :] < packed.lengths[..., None].to(q.device),
         torch.ones(B, Hkv, Lq, dtype=torch.bool, device=q.device)], dim=-1,
    ).repeat_interleave(n_rep, dim=1)  # [B, Hq, K + Lq]
    s = torch.matmul(q.float(), k.transpose(-1, -2)) * scale
    s.masked_fill_(~valid[:, :, None, :], float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v).to(q.dtype)


def _triton_packed_kv_attention(q, packed, k_fresh, v_fresh, scale, block_m, block_n) -> torch.Tensor:
    mod = load_kernels(_KERNEL_MODULE)
    B, Hq, Lq, D = q.shape
    Hkv = packed.keys.shape[1]
    out = torch.empty_like(q)
    block_d = max(16, triton_next_pow2(D))
    if block_m is None:
        block_m = 16 if (interpreting() or Lq <= 16) else 32
    if block_n is None:
        block_n = 16 if interpreting() else 64
    lengths = packed.lengths.to(device=q.device, dtype=torch.int32)
    dot_fp32 = q.dtype == torch.float32 or interpreting()
    kp, vp = packed.keys.to(q.dtype), packed.values.to(q.dtype)
    kf, vf = k_fresh.to(q.dtype), v_fresh.to(q.dtype)
    grid = ((Lq + block_m - 1) // block_m, B * Hq)
    mod.packed_kv_attention_kernel[grid](
        q, kp, vp, lengths, kf, vf, out,
        Hq, Hq // Hkv, Lq, D, float(scale),
        *q.stride(), *kp.stride(), *vp.stride(), *lengths.stride(), *kf.stride(), *vf.stride(), *out.stride(),
        DOT_FP32=dot_fp32, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        num_warps=4,
    )
    return out


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def packed_kv_attention(
    q: torch.Tensor,
    packed: PackedKV,
    k_fresh: torch.Tensor,
    v_fresh: torch.Tensor,
    *,
    scale: float | None = None,
    backend: str = "auto",
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Block queries q [B, Hq, Lq, D] against the packed cache plus the block's fresh k/v [B, Hkv, Lq, D].

    Returns [B, Hq, Lq, D] in q's dtype. backend: "auto" (Triton on CUDA, torch elsewhere), "triton" (forced; on
    CPU needs TRITON_INTERPRET=1), "torch". Triton accumulates in float32 (IEEE float32 products for float32 inputs).
    """
    _check(q, packed, k_fresh, v_fresh)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    chosen = resolve_backend(backend, q.device)
    record("packed_kv_attention", chosen)
    if chosen == "torch":
        return reference_packed_kv_attention(q, packed, k_fresh, v_fresh, scale=scale)
    return _triton_packed_kv_attention(q, packed, k_fresh, v_fresh, scale, block_m, block_n)
