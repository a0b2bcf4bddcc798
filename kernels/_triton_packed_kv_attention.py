"""Triton source of the packed per-head KV attention kernel (imported lazily by `packed_kv_attention.py`).

One program computes BLOCK_M query rows of one (batch, query head) pair against two key sets of its KV head
(h_kv = h_q // (Hq / Hkv), grouped-query attention): the first `length[b, h_kv]` packed cached keys, then the Lq
fresh keys of the block itself. Flash-attention online softmax over key tiles, in float32:

  s = (q . k) * scale;  m' = max(m, max_tile s);  l <- l e^{m - m'} + sum_tile e^{s - m'};
  acc <- acc e^{m - m'} + sum_tile e^{s - m'} v;  out = acc / l
The fresh keys always exist (Lq >= 1), so l > 0 at the end and no -inf guard is needed once they are read.
DOT_FP32 (float32 inputs, or any input under the interpreter, whose Triton 3.9 tl.dot multiplies bf16 bit patterns
as integers) upcasts the dot operands and keeps p in float32 with IEEE products; otherwise 16-bit inputs use the
tensor cores with p rounded to the value dtype, as flash attention does.
"""
from __future__ import annotations

import triton
import triton.language as tl

from dllm_constrain.kernels._backend import interpreting

INTERPRETED = interpreting()


@triton.jit
def _attend_tile(q, k_ptrs, v_ptrs, key_ok, d_ok, m_i, l_i, acc, scale, DOT_FP32: tl.constexpr):
    k = tl.load(k_ptrs, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
    v = tl.load(v_ptrs, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
    if DOT_FP32:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(key_ok[None, :], s * scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if DOT_FP32:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def packed_kv_attention_kernel(
    q_ptr, kp_ptr, vp_ptr, len_ptr, kf_ptr, vf_ptr, o_ptr,
    n_q_heads, n_rep, lq, dim, scale,
    sq_b, sq_h, sq_m, sq_d,
    skp_b, skp_h, skp_n, skp_d,
    svp_b, svp_h, svp_n, svp_d,
    slen_b, slen_h,
    skf_b, skf_h, skf_n, skf_d,
    svf_b, svf_h, svf_n, svf_d,
    so_b, so_h, so_m, so_d,
    DOT_FP32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """grid = (cdiv(Lq, BLOCK_M), B * Hq); q [B, Hq, Lq, D], packed k/v [B, Hkv, K, D], fresh k/v [B, Hkv, Lq, D]."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // n_q_heads).to(tl.int64)
    h = pid_bh % n_q_heads
    hk = (h // n_rep).to(tl.int64)
    h = h.to(tl.int64)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    m_ok = offs_m < lq
    d_ok = offs_d < dim

    q = tl.load(q_ptr + b * sq_b + h * sq_h + offs_m[:, None] * sq_m + offs_d[None, :] * sq_d,
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    n_cached = tl.load(len_ptr + b * slen_b + hk * slen_h)
    kp_base = kp_ptr + b * skp_b + hk * skp_h
    vp_base = vp_ptr + b * svp_b + hk * svp_h
    for n0 in range(0, n_cached, BLOCK_N):
        n = n0 + offs_n
        m_i, l_i, acc = _attend_tile(
            q, kp_base + n[:, None] * skp_n + offs_d[None, :] * skp_d,
            vp_base + n[:, None] * svp_n + offs_d[None, :] * svp_d,
            n < n_cached, d_ok, m_i, l_i, acc, scale, DOT_FP32)

    kf_base = kf_ptr + b * skf_b + hk * skf_h
    vf_base = vf_ptr + b * svf_b + hk * svf_h
    for n0 in range(0, lq, BLOCK_N):
        n = n0 + offs_n
        m_i, l_i, acc = _attend_tile(
            q, kf_base + n[:, None] * skf_n + offs_d[None, :] * skf_d,
            vf_base + n[:, None] * svf_n + offs_d[None, :] * svf_d,
            n < lq, d_ok, m_i, l_i, acc, scale, DOT_FP32)

    out = acc / l_i[:, None]
    tl.store(o_ptr + b * so_b + h * so_h + offs_m[:, None] * so_m + offs_d[None, :] * so_d,
             out.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
