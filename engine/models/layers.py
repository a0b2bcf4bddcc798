"""Building blocks shared by the model families: RMSNorm, rotary embeddings, bidirectional attention, SwiGLU.

All attention here is bidirectional (a dLLM canvas sees both sides). Padding is expressed by a key-padding
mask and positions by explicit position ids, so a left-padded row computes exactly what it computes alone.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps), computed in float32 for stability."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x32).to(dtype)


def rope_cos_sin(
    position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [B, L, head_dim] for the non-interleaved (rotate-half) RoPE layout, in float32 math."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim))
    freqs = position_ids.to(torch.float32)[..., None] * inv_freq  # [B, L, head_dim/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, L, D] by the tables [B, L, D]: x*cos + rotate_half(x)*sin, in the tables' dtype (float32
    tables: the rotation in float32, cast back, as LLaDA's rope_full_precision; tables in x's dtype: Qwen2/Dream)."""
    cos = cos[:, None]
    sin = sin[:, None]
    xr = x.to(cos.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
    return (xr * cos + rotated * sin).to(x.dtype)


def attention_bias(key_padding_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Additive bias [B, 1, 1, Lk] from a boolean mask (True = a real key); None when nothing is padded."""
    if key_padding_mask is None or bool(key_padding_mask.all()):
        return None
    bias = torch.zeros(key_padding_mask.shape, dtype=dtype, device=key_padding_mask.device)
    bias.masked_fill_(~key_padding_mask, torch.finfo(dtype).min)
    return bias[:, None, None, :]


def bidirectional_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) v with grouped-query heads: q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D]."""
    n_rep = q.shape[1] // k.shape[1]
    if n_rep > 1:
        k = k.repeat_interleave(n_rep, dim=1)
        v = v.repeat_interleave(n_rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=False)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, the LLaMA/Qwen feed-forward nonlinearity."""
    return F.silu(gate) * up
