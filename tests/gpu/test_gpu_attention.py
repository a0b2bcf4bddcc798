"""The engine's attention kernel (the varlen Triton kernel behind torch.ops.dllm_constrain.varlen_attention) against
torch's SDPA, one sequence at a time, at LLaDA-8B's head dimension (128) with grouped-query heads, on the GPU: a step
mixing Refresh sequences (every token queries the whole sequence) and Reuse sequences (a block's span queries the
whole sequence) of different lengths, their keys in scattered pages of a KV pool, bf16 and fp32, with and without the
sparse cache's keep mask on the Reuse sequences."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gpu_support import GPU

from dllm_constrain.kernels._backend import last_backend
from dllm_constrain.kernels.varlen_attention import VarlenLayout, varlen_attention

pytestmark = GPU
HEAD_DIM = 128
PAGE = 16
# (kind, sequence length, query span [a, b) of a Reuse): prompts of different lengths, blocks of 32 (+1: Dream's shift)
SEQUENCES = [("refresh", 300, None), ("reuse", 517, (448, 481)), ("refresh", 77, None), ("reuse", 1000, (936, 968)),
             ("reuse", 129, (96, 129)), ("refresh", 1024, None), ("reuse", 40, (8, 40))]


def _step(q_heads: int, kv_heads: int, dtype: torch.dtype, device: str, sequences=SEQUENCES):
    """q [Hq, T, D] (head-major view of [T, Hq, D], as the model's projections), a pool k, v [Hkv, S, D] whose pages
    are handed out in a shuffled order, each sequence's slots and query rows, and a keep mask [Hkv, S]."""
    gen = torch.Generator().manual_seed(q_heads * 100 + kv_heads)
    pages = [-(-n // PAGE) for _, n, _ in sequences]
    order = torch.randperm(sum(pages), generator=gen)
    slots, at = [], 0
    for (_, n, _), p in zip(sequences, pages):
        mine = order[at:at + p]
        slots.append((mine[:, None] * PAGE + torch.arange(PAGE)).reshape(-1)[:n])
        at += p
    q_rows = [(0, n) if kind == "refresh" else span for kind, n, span in sequences]
    total = sum(b - a for a, b in q_rows)
    size = sum(pages) * PAGE
    r = lambda *s: torch.randn(*s, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
    q = r(total, q_heads, HEAD_DIM).transpose(0, 1)
    k, v = r(kv_heads, size, HEAD_DIM), r(kv_heads, size, HEAD_DIM)
    keep = (torch.rand(kv_heads, size, generator=gen) < 0.5).to(device)
    for s in slots:
        keep[:, s[:PAGE].to(device)] = True  # at least one kept key per sequence
    return q, k, v, keep, slots, q_rows


def _sdpa(q, k, v, keep, slots, q_rows, use_keep):
    """Per sequence: its queries against its slots with torch's SDPA in float32 (GQA by repeating KV heads)."""
    rep = q.shape[0] // k.shape[0]
    out, row = [], 0
    for s, (a, b), masked in zip(slots, q_rows, use_keep):
        idx = s.to(q.device)
        ks = k[:, idx].float().repeat_interleave(rep, dim=0)
        vs = v[:, idx].float().repeat_interleave(rep, dim=0)
        mask = keep[:, idx].repeat_interleave(rep, dim=0)[:, None, :] if masked else None
        out.append(F.scaled_dot_product_attention(q[:, row:row + b - a].float(), ks, vs, attn_mask=mask))
        row += b - a
    return torch.cat(out, dim=1)


def check(q_heads: int, kv_heads: int, dtype: torch.dtype, sparse: bool, device: str = "cuda",
          sequences=SEQUENCES) -> None:
    q, k, v, keep, slots, q_rows = _step(q_heads, kv_heads, dtype, device, sequences)
    use_keep = [sparse and kind == "reuse" for kind, _, _ in sequences]
    starts = [sum(b - a for a, b in q_rows[:i]) for i in range(len(q_rows))]
    layout = VarlenLayout.build(starts, [b - a for a, b in q_rows], slots, use_keep, q.shape[1], device,
                                grouped=False)  # what the engine builds for Triton
    out = varlen_attention(q, k, v, layout, keep if sparse else None, backend="triton")
    assert last_backend("varlen_attention") == "triton"
    assert out.dtype == dtype and out.shape == q.shape
    want = _sdpa(q, k, v, keep, slots, q_rows, use_keep)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out.float(), want, **tol)


@pytest.mark.parametrize("q_heads, kv_heads", [(32, 8), (32, 32), (28, 4)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("sparse", [False, True])
def test_the_varlen_kernel_matches_sdpa_per_sequence(q_heads, kv_heads, dtype, sparse) -> None:
    check(q_heads, kv_heads, dtype, sparse)
