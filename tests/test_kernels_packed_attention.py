"""Head-centric packed KV attention: salient-key selection, and the Triton kernel (CPU interpreter) vs torch."""
from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_constrain.kernels import _backend
from dllm_constrain.kernels import packed_kv_attention as pka
from dllm_constrain.kernels.packed_kv_attention import (
    PackedKV,
    keep_count,
    packed_kv_attention,
    reference_packed_kv_attention,
    select_salient_keys,
)

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", autouse=True)
def interpreter():
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    yield
    if old is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = old


def run_triton(q, packed, kf, vf, **kw) -> torch.Tensor:
    out = packed_kv_attention(q, packed, kf, vf, backend="triton", **kw)
    assert _backend.last_backend("packed_kv_attention") == "triton"
    mod = _backend.load_kernels(pka._KERNEL_MODULE)
    assert mod.INTERPRETED is True
    assert type(mod.packed_kv_attention_kernel).__name__ == "InterpretedFunction"
    return out


@st.composite
def problems(draw):
    b = draw(st.integers(1, 2))
    hkv = draw(st.integers(1, 2))
    rep = draw(st.integers(1, 3))
    lq = draw(st.integers(1, 20))
    length = draw(st.integers(0, 40))
    d = draw(st.sampled_from([8, 16, 24, 40, 64]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hkv * rep, lq, d, generator=g)
    k = torch.randn(b, hkv, length, d, generator=g)
    v = torch.randn(b, hkv, length, d, generator=g)
    kf = torch.randn(b, hkv, lq, d, generator=g)
    vf = torch.randn(b, hkv, lq, d, generator=g)
    real = torch.ones(b, length, dtype=torch.bool)
    if length and draw(st.booleans()):  # left padding on the last row
        real[-1, : draw(st.integers(0, length))] = False
    keep_ratio = draw(st.sampled_from([0.1, 0.25, 0.5, 0.8, 1.0]))
    return q, k, v, kf, vf, real, keep_ratio


def dense_attention(q, k, v, kf, vf, allowed):
    """SDPA over [full cache, fresh keys]; allowed [B, Hkv or 1, L] says which cached keys a KV head sees."""
    b, hq, lq, d = q.shape
    hkv = k.shape[1]
    rep = hq // hkv
    kk = torch.cat([k, kf], 2).repeat_interleave(rep, 1)
    vv = torch.cat([v, vf], 2).repeat_interleave(rep, 1)
    allowed = allowed.expand(b, hkv, k.shape[2])
    mask = torch.cat([allowed, torch.ones(b, hkv, lq, dtype=torch.bool)], -1).repeat_interleave(rep, 1)
    return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask[:, :, None, :])


@given(problems())
@SETTINGS
def test_kernel_matches_reference_and_dense_over_selected_keys(case):
    q, k, v, kf, vf, real, keep_ratio = case
    packed = select_salient_keys(q, k, v, real, keep_ratio)
    got = run_triton(q, packed, kf, vf)
    ref = reference_packed_kv_attention(q, packed, kf, vf)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    # the same thing, as dense attention over the full cache restricted (per KV head) to the kept positions
    b, hkv, length = k.shape[:3]
    kept = torch.zeros(b, hkv, length + 1, dtype=torch.bool)
    kept.scatter_(2, torch.where(packed.indices < 0, length, packed.indices), True)
    dense = dense_attention(q, k, v, kf, vf, kept[..., :length])
    torch.testing.assert_close(got, dense, atol=1e-5, rtol=1e-5)


@given(problems())
@SETTINGS
def test_keep_ratio_one_equals_dense_attention(case):
    q, k, v, kf, vf, real, _ = case
    packed = select_salient_keys(q, k, v, real, 1.0)
    assert torch.equal(packed.lengths, real.sum(-1, keepdim=True).expand_as(packed.lengths).int())
    dense = dense_attention(q, k, v, kf, vf, real[:, None, :])
    torch.testing.assert_close(run_triton(q, packed, kf, vf), dense, atol=1e-5, rtol=0)
    torch.testing.assert_close(reference_packed_kv_attention(q, packed, kf, vf), dense, atol=1e-5, rtol=0)


@given(problems(), st.sampled_from(["prob", "logit"]))
@settings(max_examples=40, deadline=None)
def test_selection_keeps_the_most_salient_real_keys_per_head(case, saliency):
    q, k, v, kf, vf, real, keep_ratio = case
    packed = select_salient_keys(q, k, v, real, keep_ratio, saliency=saliency)
    b, hq, lq, d = q.shape
    hkv, length = k.shape[1], k.shape[2]
    rep = hq // hkv
    n_real = real.sum(-1)
    want = keep_count(n_real, keep_ratio)
    assert packed.lengths.dtype == torch.int32 and packed.lengths.shape == (b, hkv)
    s = (q.reshape(b, hkv, rep * lq, d) @ k.transpose(-1, -2)) / math.sqrt(d)
    s = s.masked_fill(~real[:, None, None, :], float("-inf"))
    if saliency == "prob":
        s = torch.softmax(s, -1).nan_to_num(0.0)
    sal = s.amax(2).masked_fill(~real[:, None, :], float("-inf"))
    for bi in range(b):
        kb = int(want[bi])
        assert kb == math.ceil(round(keep_ratio * int(n_real[bi]), 6)) or (kb == 1 and n_real[bi] > 0)
        for h in range(hkv):
            assert int(packed.lengths[bi, h]) == kb
            idx = packed.indices[bi, h, :kb]
            assert torch.all(idx[1:] > idx[:-1])  # unique, in original order
            assert bool(real[bi, idx].all())
            assert bool((packed.indices[bi, h, kb:] == -1).all())
            assert bool((packed.keys[bi, h, kb:] == 0).all())
            torch.testing.assert_close(packed.keys[bi, h, :kb], k[bi, h, idx], atol=0, rtol=0)
            torch.testing.assert_close(packed.values[bi, h, :kb], v[bi, h, idx], atol=0, rtol=0)
            if 0 < kb < int(n_real[bi]):  # every kept key is at least as salient as every dropped real key
                kept = torch.zeros(length, dtype=torch.bool)
                kept[idx] = True
                dropped = real[bi] & ~kept
                assert sal[bi, h, idx].min() >= sal[bi, h, dropped].max() - 1e-6


def test_heads_select_different_keys():
    g = torch.Generator().manual_seed(0)
    d = 16
    k = torch.randn(1, 2, 12, d, generator=g)
    q = torch.zeros(1, 2, 1, d)
    q[0, 0, 0] = k[0, 0, 3] * 4  # head 0 looks at key 3, head 1 at key 9
    q[0, 1, 0] = k[0, 1, 9] * 4
    packed = select_salient_keys(q, k, k.clone(), None, 1 / 12)
    assert packed.indices[0, :, 0].tolist() == [3, 9]


def test_empty_cache_attends_to_the_block_only():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 2, 5, 16, generator=g)
    k = torch.randn(2, 1, 7, 16, generator=g)
    kf, vf = torch.randn(2, 1, 5, 16, generator=g), torch.randn(2, 1, 5, 16, generator=g)
    real = torch.ones(2, 7, dtype=torch.bool)
    real[1] = False  # row 1 has no real cached key
    packed = select_salient_keys(q, k, k, real, 0.5)
    assert packed.lengths[:, 0].tolist() == [4, 0]
    got = run_triton(q, packed, kf, vf)
    only_block = F.scaled_dot_product_attention(q[1:], kf[1:].expand(1, 2, 5, 16), vf[1:].expand(1, 2, 5, 16))
    torch.testing.assert_close(got[1:], only_block, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs(dtype):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 9, 32, generator=g).to(dtype)
    k, v = torch.randn(1, 2, 30, 32, generator=g).to(dtype), torch.randn(1, 2, 30, 32, generator=g).to(dtype)
    kf, vf = torch.randn(1, 2, 9, 32, generator=g).to(dtype), torch.randn(1, 2, 9, 32, generator=g).to(dtype)
    packed = select_salient_keys(q, k, v, None, 0.5)
    assert packed.keys.dtype == dtype
    got = run_triton(q, packed, kf, vf)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), reference_packed_kv_attention(q, packed, kf, vf).float(),
                               atol=1e-2, rtol=1e-2)


def test_non_contiguous_inputs_and_block_sizes():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 9, 4, 24, generator=g).transpose(1, 2)  # [2, 4, 9, 24] with odd strides
    k = torch.randn(2, 2, 33, 24, generator=g)
    kf = torch.randn(2, 9, 2, 24, generator=g).transpose(1, 2)
    packed = select_salient_keys(q, k, k, None, 0.6)
    ref = reference_packed_kv_attention(q, packed, kf, kf)
    for bm, bn in ((16, 16), (32, 32)):
        torch.testing.assert_close(run_triton(q, packed, kf, kf, block_m=bm, block_n=bn), ref, atol=1e-5, rtol=1e-5)


def test_dispatch_and_argument_checks(monkeypatch):
    q = torch.randn(1, 2, 3, 8)
    k = torch.randn(1, 1, 5, 8)
    packed = select_salient_keys(q, k, k, None, 1.0)
    kf = torch.randn(1, 1, 3, 8)
    packed_kv_attention(q, packed, kf, kf)
    assert _backend.last_backend("packed_kv_attention") == "torch"
    monkeypatch.setattr(pka, "reference_packed_kv_attention", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    run_triton(q, packed, kf, kf)  # the Triton path does not fall back on torch
    with pytest.raises(ValueError):
        select_salient_keys(q, k, k, None, 0.0)
    with pytest.raises(ValueError):
        select_salient_keys(q, k, k, None, 1.5)
    with pytest.raises(ValueError):
        packed_kv_attention(q, packed, kf[:, :, :2], kf)
    bad = PackedKV(packed.keys, packed.values, packed.lengths[:, :0], packed.indices)
    with pytest.raises(ValueError):
        packed_kv_attention(q, bad, kf, kf)
