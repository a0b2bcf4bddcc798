"""The attention kernel against torch's SDPA at LLaDA-8B's head dimension (128), with grouped-query heads, on the
GPU: block queries against a full cache (keep ratio 1) plus the block's fresh keys and values."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gpu_support import GPU

from dllm_constrain.kernels._backend import last_backend
from dllm_constrain.kernels.packed_kv_attention import PackedKV, packed_kv_attention

pytestmark = GPU
HEAD_DIM = 128


def _case(batch: int, q_heads: int, kv_heads: int, cached: int, block: int, dtype: torch.dtype):
    gen = torch.Generator(device="cuda").manual_seed(batch * 1000 + cached)
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen).to(dtype)  # noqa: E731
    q = r(batch, q_heads, block, HEAD_DIM)
    k, v = r(batch, kv_heads, cached, HEAD_DIM), r(batch, kv_heads, cached, HEAD_DIM)
    kf, vf = r(batch, kv_heads, block, HEAD_DIM), r(batch, kv_heads, block, HEAD_DIM)
    lengths = torch.full((batch, kv_heads), cached, dtype=torch.int32, device="cuda")
    indices = torch.arange(cached, device="cuda").expand(batch, kv_heads, cached).contiguous()
    return q, PackedKV(k, v, lengths, indices), kf, vf


@pytest.mark.parametrize("batch, q_heads, kv_heads, cached, block",
                         [(1, 32, 8, 480, 32), (4, 32, 8, 1000, 32), (2, 32, 32, 224, 32), (8, 16, 4, 64, 16)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_attention_kernel_matches_sdpa(batch, q_heads, kv_heads, cached, block, dtype) -> None:
    q, packed, kf, vf = _case(batch, q_heads, kv_heads, cached, block, dtype)
    out = packed_kv_attention(q, packed, kf, vf, backend="triton")
    assert last_backend("packed_kv_attention") == "triton"
    rep = q_heads // kv_heads
    k = torch.cat([packed.keys, kf], dim=2).repeat_interleave(rep, dim=1)
    v = torch.cat([packed.values, vf], dim=2).repeat_interleave(rep, dim=1)
    want = F.scaled_dot_product_attention(q, k, v)  # bidirectional: no mask
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
