"""Triton sources of the masked row-statistics kernels (imported lazily by `masked_row_stats.py`).

Both kernels write one *partial state* per (row, vocabulary split); `masked_row_stats._combine_partials` merges
the splits. For a row and a split covering columns C, with x_j the masked logit (-inf where not allowed):

  m     = max_{j in C} x_j                     top2 = second largest x_j in C (multiset: a tie gives top2 = m)
  s     = sum_{j in C} exp(x_j - m)            t    = sum_{j in C} (x_j - m) exp(x_j - m)
  best  = max_{j in C} score_j, score_j = x_j (greedy) or x_j / T + g_j in float64 (Gumbel-max sampling)
  idx   = smallest j attaining best (-1 if every score is -inf), bx = x_idx

Streaming over vocabulary tiles keeps (m, s, t) with the online-softmax rescaling: for a new tile maximum
m' = max(m, max_tile x), s <- s e^{m - m'} + sum_tile e^{x - m'} and
t <- e^{m - m'} (t + (m - m') s) + sum_tile (x - m') e^{x - m'}; all -inf cases are guarded (no NaN).
Tiles are visited in increasing column order and a tile only replaces the best on a strictly larger score,
which with tl.max's leftmost tie-break gives torch.argmax's lowest-index-wins rule.
"""
from __future__ import annotations

import triton
import triton.language as tl

from dllm_constrain.kernels._backend import interpreting

INTERPRETED = interpreting()  # which flavour @triton.jit produced below; the loader re-imports on change


@triton.jit
def _tile_update(x, score, local, col0, m, s, t, top2, best, best_idx, best_x, HAS_NOISE: tl.constexpr):
    """Fold one [BLOCK_R, BLOCK_V] tile of masked logits x (and scores) into the running per-row state."""
    neg_inf = float("-inf")
    tile_max, tile_arg = tl.max(x, axis=1, return_indices=True, return_indices_tie_break_left=True)
    hit = local[None, :] == tile_arg[:, None]
    tile_second = tl.max(tl.where(hit, neg_inf, x), axis=1)
    top2 = tl.maximum(top2, tl.maximum(tile_second, tl.minimum(m, tile_max)))

    m_new = tl.maximum(m, tile_max)
    m_safe = tl.where(m_new == neg_inf, 0.0, m_new)
    alpha = tl.exp(m - m_safe)  # 0 while the row has seen nothing
    z = x - m_safe[:, None]
    p = tl.exp(z)
    zp = tl.where(p > 0.0, z, 0.0) * p  # (-inf) * 0 would be NaN
    shift = tl.where(s > 0.0, m - m_safe, 0.0) * s
    t = alpha * (t + shift) + tl.sum(zp, axis=1)
    s = alpha * s + tl.sum(p, axis=1)
    m = m_new

    if HAS_NOISE:
        tile_best, tile_best_arg = tl.max(score, axis=1, return_indices=True, return_indices_tie_break_left=True)
        tile_best_x = tl.max(tl.where(local[None, :] == tile_best_arg[:, None], x, neg_inf), axis=1)
    else:
        tile_best = tile_max
        tile_best_arg = tile_arg
        tile_best_x = tile_max
    better = tile_best > best
    best_idx = tl.where(better, col0 + tile_best_arg, best_idx)
    best_x = tl.where(better, tile_best_x, best_x)
    best = tl.where(better, tile_best, best)
    return m, s, t, top2, best, best_idx, best_x


@triton.jit
def _allowed_bits(mask_ptr, rows64, cols, valid, stride_mr):
    """Bit (cols % 32) of word (cols // 32) of each row's packed int32 bitmask (xgrammar layout), as a bool tile."""
    words = tl.load(mask_ptr + rows64[:, None] * stride_mr + (cols // 32)[None, :], mask=valid, other=0)
    return ((words >> (cols % 32)[None, :]) & 1) != 0


@triton.jit
def _store_partials(out_m, out_s, out_t, out_top2, out_best, out_idx, out_bx, rows64, row_ok, pid_s, n_splits,
                    m, s, t, top2, best, best_idx, best_x):
    off = rows64 * n_splits + pid_s
    tl.store(out_m + off, m, mask=row_ok)
    tl.store(out_s + off, s, mask=row_ok)
    tl.store(out_t + off, t, mask=row_ok)
    tl.store(out_top2 + off, top2, mask=row_ok)
    tl.store(out_best + off, best, mask=row_ok)
    tl.store(out_idx + off, best_idx, mask=row_ok)
    tl.store(out_bx + off, best_x, mask=row_ok)


@triton.jit
def masked_row_stats_kernel(
    logits_ptr, mask_ptr, noise_ptr, temp_ptr,
    out_m, out_s, out_t, out_top2, out_best, out_idx, out_bx,
    n_rows, vocab, tiles_per_split, n_splits,
    stride_lr, stride_lv, stride_mr, stride_nr, stride_nv,
    HAS_MASK: tl.constexpr, HAS_NOISE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """Partial row statistics of a logits chunk [n_rows, vocab]; grid = (cdiv(n_rows, BLOCK_R), n_splits)."""
    pid_r = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    rows64 = rows.to(tl.int64)
    local = tl.arange(0, BLOCK_V)
    neg_inf = float("-inf")

    m = tl.full([BLOCK_R], neg_inf, tl.float32)
    s = tl.zeros([BLOCK_R], tl.float32)
    t = tl.zeros([BLOCK_R], tl.float32)
    top2 = tl.full([BLOCK_R], neg_inf, tl.float32)
    best_idx = tl.full([BLOCK_R], -1, tl.int32)
    best_x = tl.full([BLOCK_R], neg_inf, tl.float32)
    if HAS_NOISE:
        temp = tl.load(temp_ptr)  # float64 scalar: T as the caller gave it
        best = tl.full([BLOCK_R], neg_inf, tl.float64)
    else:
        best = tl.full([BLOCK_R], neg_inf, tl.float32)

    v_begin = pid_s * tiles_per_split * BLOCK_V
    for i in range(0, tiles_per_split):
        col0 = v_begin + i * BLOCK_V
        cols = col0 + local
        valid = row_ok[:, None] & (cols < vocab)[None, :]
        x = tl.load(logits_ptr + rows64[:, None] * stride_lr + cols[None, :].to(tl.int64) * stride_lv,
                    mask=valid, other=neg_inf).to(tl.float32)
        keep = valid
        if HAS_MASK:
            keep = keep & _allowed_bits(mask_ptr, rows64, cols, valid, stride_mr)
        x = tl.where(keep, x, neg_inf)
        if HAS_NOISE:
            g = tl.load(noise_ptr + rows64[:, None] * stride_nr + cols[None, :].to(tl.int64) * stride_nv,
                        mask=valid, other=0.0).to(tl.float64)
            # x / T + g in float64, exactly torch's `logits.double() / T + g` (division, not x * (1/T))
            score = tl.where(keep, x.to(tl.float64) / temp + g, neg_inf)
        else:
            score = x
        m, s, t, top2, best, best_idx, best_x = _tile_update(
            x, score, local, col0, m, s, t, top2, best, best_idx, best_x, HAS_NOISE)
    _store_partials(out_m, out_s, out_t, out_top2, out_best, out_idx, out_bx, rows64, row_ok, pid_s, n_splits,
                    m, s, t, top2, best, best_idx, best_x)


@triton.jit
def masked_row_stats_hidden_kernel(
    hidden_ptr, weight_ptr, mask_ptr, noise_ptr, temp_ptr,
    out_m, out_s, out_t, out_top2, out_best, out_idx, out_bx,
    n_rows, vocab, dim, tiles_per_split, n_splits,
    stride_hr, stride_hd, stride_wv, stride_wd, stride_mr, stride_nr, stride_nv,
    HAS_MASK: tl.constexpr, HAS_NOISE: tl.constexpr, DOT_FP32: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Same partial statistics, with each logits tile computed in registers as hidden[rows] @ weight[cols]^T.

    hidden [n_rows, dim] and weight [vocab, dim] share a dtype; the dot accumulates in float32, so no logit is ever
    written to memory. DOT_FP32 (float32 inputs, or 16-bit inputs under the interpreter, whose tl.dot multiplies the
    raw bf16 bit patterns as integers in Triton 3.9) upcasts the operands and asks for IEEE float32 products (no
    TF32); bf16 x bf16 products are exact in float32, so the upcast computes what the tensor cores compute.
    """
    pid_r = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    rows64 = rows.to(tl.int64)
    local = tl.arange(0, BLOCK_V)
    dloc = tl.arange(0, BLOCK_D)
    neg_inf = float("-inf")

    m = tl.full([BLOCK_R], neg_inf, tl.float32)
    s = tl.zeros([BLOCK_R], tl.float32)
    t = tl.zeros([BLOCK_R], tl.float32)
    top2 = tl.full([BLOCK_R], neg_inf, tl.float32)
    best_idx = tl.full([BLOCK_R], -1, tl.int32)
    best_x = tl.full([BLOCK_R], neg_inf, tl.float32)
    if HAS_NOISE:
        temp = tl.load(temp_ptr)
        best = tl.full([BLOCK_R], neg_inf, tl.float64)
    else:
        best = tl.full([BLOCK_R], neg_inf, tl.float32)

    v_begin = pid_s * tiles_per_split * BLOCK_V
    for i in range(0, tiles_per_split):
        col0 = v_begin + i * BLOCK_V
        cols = col0 + local
        col_ok = cols < vocab
        cols64 = cols.to(tl.int64)
        acc = tl.zeros([BLOCK_R, BLOCK_V], tl.float32)
        for d0 in range(0, dim, BLOCK_D):
            d = d0 + dloc
            d_ok = d < dim
            h = tl.load(hidden_ptr + rows64[:, None] * stride_hr + d[None, :] * stride_hd,
                        mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            w = tl.load(weight_ptr + cols64[:, None] * stride_wv + d[None, :] * stride_wd,
                        mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            if DOT_FP32:
                acc = tl.dot(h.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
            else:
                acc = tl.dot(h, tl.trans(w), acc)
        valid = row_ok[:, None] & col_ok[None, :]
        keep = valid
        if HAS_MASK:
            keep = keep & _allowed_bits(mask_ptr, rows64, cols, valid, stride_mr)
        x = tl.where(keep, acc, neg_inf)
        if HAS_NOISE:
            g = tl.load(noise_ptr + rows64[:, None] * stride_nr + cols64[None, :] * stride_nv,
                        mask=valid, other=0.0).to(tl.float64)
            score = tl.where(keep, x.to(tl.float64) / temp + g, neg_inf)
        else:
            score = x
        m, s, t, top2, best, best_idx, best_x = _tile_update(
            x, score, local, col0, m, s, t, top2, best, best_idx, best_x, HAS_NOISE)
    _store_partials(out_m, out_s, out_t, out_top2, out_best, out_idx, out_bx, rows64, row_ok, pid_s, n_splits,
                    m, s, t, top2, best, best_idx, best_x)
