"""Counter-based Gumbel noise: the sampling noise of a row as a function of its key alone.

A row key is splitmix64 of (seed, step, position), computed on the host (`noise_row_key`, `noise_key`); the noise
of token t in a row is -log(-log u), u made uniform in (0, 1) from murmur3's 32-bit finaliser of (key, t)
(`hashed_gumbel_noise`). A fixed number of torch integer ops for any number of rows, on the keys' device: the
noise of a row never depends on the other rows of its batch, and every device computes the same hash (float64
takes 32 bits of it, float32 24). docs/engine.md, "Randomness", says how the engine keys its requests.
"""
from __future__ import annotations

import torch

from dllm_constrain.kernels.masked_row_stats import noise_dtype

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF


def _mix64(x: int) -> int:
    """splitmix64's finaliser (a bijection on 64-bit integers with full avalanche), on Python ints."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def noise_row_key(seed: int, step: int) -> int:
    """The 64-bit key of one request's noise at one of its steps (`noise_key` adds the position)."""
    return _mix64(_mix64((seed & _M64) ^ 0x9E3779B97F4A7C15) ^ (step & _M64))


def noise_key(row_key: int, position: int) -> int:
    """The 32-bit key of the noise of one canvas position (Python ints: the host computes a step's keys)."""
    return _mix64(row_key ^ (position & _M64)) & _M32


def _fmix32_(h: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser in place on an int64 tensor of 32-bit values (products wrap; the mask keeps the
    low 32 bits, so the result is the same on every device)."""
    h.bitwise_xor_(h >> 16)
    h.mul_(0x85EBCA6B).bitwise_and_(_M32)
    h.bitwise_xor_(h >> 13)
    h.mul_(0xC2B2AE35).bitwise_and_(_M32)
    return h.bitwise_xor_(h >> 16)


def hashed_gumbel_noise(keys: torch.Tensor, vocab: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Standard Gumbel noise [rows, vocab] as a function of (row key, token) alone: a counter-based hash (murmur3's
    finaliser of the key xor the token's odd-multiplied index) made uniform in (0, 1), then -log(-log u). A fixed
    number of torch ops for any number of rows, on the keys' device, so the noise of a row never depends on the
    other rows of its batch. float64 (the CPU default, `noise_dtype`) takes 32 bits of the hash, float32 24 bits
    (exact in float32, so u < 1)."""
    dtype = noise_dtype(keys.device) if dtype is None else dtype
    token = torch.arange(vocab, dtype=torch.int64, device=keys.device).mul_(0x9E3779B1).bitwise_and_(_M32)
    h = _fmix32_(torch.bitwise_xor(keys.to(torch.int64)[:, None], token[None, :]))
    if dtype == torch.float64:
        u = h.to(dtype).add_(0.5).mul_(2.0 ** -32)
    else:
        u = h.bitwise_right_shift_(8).to(dtype).add_(0.5).mul_(2.0 ** -24)
    return u.log_().neg_().log_().neg_()
