"""Triton source of the varlen attention kernel (imported lazily by `varlen_attention.py`).

One program computes BLOCK_M query rows of one (sequence, query head) pair, FlashAttention's varlen layout: the
sequence's rows are cu_seqlens_q[b] .. cu_seqlens_q[b + 1] of q [Hq, T, D]; its keys are the slots
key_slots[cu_seqlens_k[b] .. cu_seqlens_k[b + 1]] of k, v [Hkv, S, D] (KV head h // (Hq / Hkv)), narrowed by
the keep mask [Hkv, S] where use_keep[b] (any strides: the layouts are passed as strides). Online softmax over
key tiles in float32:

  s = (q . k) * scale;  m' = max(m, max_tile s);  l <- l e^{m - m'} + sum_tile e^{s - m'};
  acc <- acc e^{m - m'} + sum_tile e^{s - m'} v;  out = acc / l
with m' replaced by 0 while every key so far is masked (no NaN from -inf - -inf). DOT_FP32 (float32 inputs, or
any input under the interpreter) upcasts the dot operands with IEEE products; otherwise 16-bit inputs use the tensor
cores with p rounded to the value dtype, as flash attention does.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dllm_constrain.kernels._backend import interpreting

INTERPRETED = interpreting()


@triton.jit
def varlen_attention_kernel(
    q_ptr, k_ptr, v_ptr, keep_ptr, o_ptr, cu_q_ptr, cu_k_ptr, slots_ptr, use_keep_ptr,
    n_q_heads, n_rep, dim, scale,
    sq_t, sq_h, sq_d, sk_n, sk_h, sk_d, sv_n, sv_h, sv_d, skeep_n, skeep_h, so_t, so_h, so_d,
    HAS_KEEP: tl.constexpr, DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """grid = (cdiv(max_seqlen_q, BLOCK_M), sequences, Hq)."""
    pid_m = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    hk = (h // n_rep).to(tl.int64)
    h = h.to(tl.int64)
    q0 = tl.load(cu_q_ptr + b)
    lq = tl.load(cu_q_ptr + b + 1) - q0
    if pid_m * BLOCK_M >= lq:
        return
    k0 = tl.load(cu_k_ptr + b)
    lk = tl.load(cu_k_ptr + b + 1) - k0
    keep_on = tl.load(use_keep_ptr + b) != 0

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    m_ok = offs_m < lq
    d_ok = offs_d < dim
    rows = (q0 + offs_m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * sq_t + h * sq_h + offs_d[None, :] * sq_d,
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(0, lk, BLOCK_N):
        n = n0 + offs_n
        n_ok = n < lk
        slot = tl.load(slots_ptr + k0 + n, mask=n_ok, other=0).to(tl.int64)
        key_ok = n_ok
        if HAS_KEEP:
            kept = tl.load(keep_ptr + slot * skeep_n + hk * skeep_h, mask=n_ok, other=0) != 0
            key_ok = n_ok & (kept | (not keep_on))
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + slot[:, None] * sk_n + hk * sk_h + offs_d[None, :] * sk_d, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + slot[:, None] * sv_n + hk * sv_h + offs_d[None, :] * sv_d, mask=kv_mask, other=0.0)
        if DOT_FP32:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(key_ok[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DOT_FP32:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o_ptr + rows[:, None] * so_t + h * so_h + offs_d[None, :] * so_d,
             out.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def block_sizes(max_seqlen_q: int, dim: int, interpreted: bool = INTERPRETED) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_D) of a launch: the compile-time tile sizes (engine.warmup plans one per BLOCK_M);
    small tiles under the interpreter."""
    block_d = max(16, 1 << (dim - 1).bit_length())
    block_m = 16 if (interpreted or max_seqlen_q <= 16) else 64
    return block_m, 16 if interpreted else 64, block_d


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None,
                     cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, key_slots: torch.Tensor,
                     use_keep: torch.Tensor, max_seqlen_q: int, scale: float) -> torch.Tensor:
    """One launch for the layout's sequences (kernels.varlen_attention.VarlenLayout's varlen fields): [Hq, T, D] in
    q's dtype."""
    hq, _, d = q.shape
    hkv = k.shape[0]
    if d > 128:
        raise ValueError(f"the varlen kernel takes head dims up to 128, got {d}")
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)  # contiguous; rows outside every sequence: 0
    sequences = cu_seqlens_q.numel() - 1
    if sequences == 0 or max_seqlen_q == 0:
        return out
    block_m, block_n, block_d = block_sizes(max_seqlen_q, d)
    dot_fp32 = q.dtype == torch.float32 or INTERPRETED
    kv = k.to(q.dtype), v.to(q.dtype)
    keep_t = keep if keep is not None else torch.zeros((1, 1), dtype=torch.bool, device=q.device)
    keep_t = keep_t.view(torch.uint8) if keep_t.dtype == torch.bool else keep_t
    grid = (triton.cdiv(max_seqlen_q, block_m), sequences, hq)
    varlen_attention_kernel[grid](
        q, kv[0], kv[1], keep_t, out, cu_seqlens_q, cu_seqlens_k, key_slots, use_keep,
        hq, hq // hkv, d, float(scale),
        q.stride(1), q.stride(0), q.stride(2), kv[0].stride(1), kv[0].stride(0), kv[0].stride(2),
        kv[1].stride(1), kv[1].stride(0), kv[1].stride(2), keep_t.stride(1), keep_t.stride(0),
        out.stride(1), out.stride(0), out.stride(2),
        HAS_KEEP=keep is not None, DOT_FP32=dot_fp32, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        num_warps=4,
    )
    return out
