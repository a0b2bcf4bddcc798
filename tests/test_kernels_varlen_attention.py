"""Varlen attention (kernels/varlen_attention.py): one call for every sequence of a step.

Specifications:
  * the grouped torch path equals the per-sequence reference (allclose) for any mix of sequences: query lengths, key
    counts, scattered key slots, grouped-query heads, the keep mask on some sequences;
  * it is bitwise batch invariant on the CPU: a sequence's rows are the same alone and inside any batch (whatever
    the other sequences' lengths, i.e. whatever the key padding);
  * the Triton kernel (CPU interpreter) equals the reference, float32 and bfloat16, rows outside every sequence zero,
    from a layout built for it alone (no grouped metadata), which the torch path refuses;
  * the call is ONE op at the dispatcher (torch.ops.dllm_constrain.varlen_attention), whose fake implementation
    agrees with its real one (torch.library.opcheck);
  * the salient-key selection keeps, per KV head, exactly what kernels.packed_kv_attention.select_salient_keys keeps.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_constrain.kernels import _backend
from dllm_constrain.kernels import packed_kv_attention as pka
from dllm_constrain.kernels import varlen_attention as va
from dllm_constrain.kernels.varlen_attention import (
    VarlenLayout,
    keep_counts,
    reference_varlen_attention,
    varlen_attention,
)

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def steps(draw, max_seqs: int = 5, max_keys: int = 150, max_q: int = 40):
    """A step: sequences with their query rows (packed in order, maybe padding rows after them), distinct key slots
    of a shared pool, keep-mask flags; q, k, v and a keep mask with at least one kept key per sequence."""
    n = draw(st.integers(1, max_seqs))
    hkv = draw(st.integers(1, 2))
    rep = draw(st.sampled_from([1, 2, 3]))
    d = draw(st.sampled_from([8, 16, 32]))
    q_lens = [draw(st.integers(1, max_q)) for _ in range(n)]
    k_lens = [draw(st.integers(1, max_keys)) for _ in range(n)]
    use_keep = [draw(st.booleans()) for _ in range(n)]
    pad_rows = draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    pool = sum(k_lens) + draw(st.integers(0, 20))
    perm = torch.randperm(pool, generator=g)
    slots, at = [], 0
    for nk in k_lens:
        slots.append(perm[at:at + nk])
        at += nk
    keep = torch.rand(hkv, pool, generator=g) < 0.5
    for s in slots:
        keep[:, s[0]] = True
    t = sum(q_lens) + pad_rows
    q = torch.randn(hkv * rep, t, d, generator=g)
    k = torch.randn(hkv, pool, d, generator=g)
    v = torch.randn(hkv, pool, d, generator=g)
    return q_lens, slots, use_keep, q, k, v, keep


def _starts(q_lens: list[int]) -> list[int]:
    return [sum(q_lens[:b]) for b in range(len(q_lens))]


def _layout(q_lens, slots, use_keep, rows) -> VarlenLayout:
    return VarlenLayout.build(_starts(q_lens), q_lens, slots, use_keep, rows)


@SETTINGS
@given(step=steps())
def test_the_batched_call_equals_the_reference_and_each_sequence_alone_bitwise(step) -> None:
    q_lens, slots, use_keep, q, k, v, keep = step
    layout = _layout(q_lens, slots, use_keep, q.shape[1])
    out = varlen_attention(q, k, v, layout, keep, backend="torch")
    ref = reference_varlen_attention(q, k, v, layout.cu_seqlens_q, layout.cu_seqlens_k, layout.key_slots, keep,
                                     layout.use_keep)
    real = sum(q_lens)
    torch.testing.assert_close(out[:, :real], ref[:, :real], atol=2e-5, rtol=1e-5)
    assert torch.isfinite(out).all()
    for b, start in enumerate(_starts(q_lens)):
        rows = slice(start, start + q_lens[b])
        alone = VarlenLayout.build([0], [q_lens[b]], [slots[b]], [use_keep[b]], q_lens[b])
        assert torch.equal(varlen_attention(q[:, rows].clone(), k, v, alone, keep, backend="torch"), out[:, rows])


def test_a_sequence_is_bitwise_the_same_beside_a_much_longer_one() -> None:
    """The longer neighbour pads the short sequence's keys by several whole chunks."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(4, 40, 16, generator=g), torch.randn(2, 400, 16, generator=g), torch.randn(2, 400, 16)
    short, long_ = torch.arange(0, 30), torch.arange(30, 400)
    both = VarlenLayout.build([0, 20], [20, 20], [short, long_], [False, False], 40)
    alone = VarlenLayout.build([0], [20], [short], [False], 20)
    assert torch.equal(varlen_attention(q, k, v, both)[:, :20], varlen_attention(q[:, :20].clone(), k, v, alone))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(step=steps(max_seqs=3, max_keys=40, max_q=20))
def test_the_triton_kernel_equals_the_reference(step, dtype) -> None:
    q_lens, slots, use_keep, q, k, v, keep = step
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    layout = VarlenLayout.build(_starts(q_lens), q_lens, slots, use_keep, q.shape[1], grouped=False)
    assert not layout.grouped and layout.counts == [] and layout.q_index == []
    out = varlen_attention(q, k, v, layout, keep, backend="triton")
    assert _backend.last_backend("varlen_attention") == "triton"
    assert _backend.load_kernels(va._KERNEL_MODULE).INTERPRETED is True
    ref = reference_varlen_attention(q, k, v, layout.cu_seqlens_q, layout.cu_seqlens_k, layout.key_slots, keep,
                                     layout.use_keep)
    tol = dict(atol=2e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    real = sum(q_lens)
    torch.testing.assert_close(out[:, :real].float(), ref[:, :real].float(), **tol)
    assert (out[:, real:] == 0).all()


def test_the_torch_path_refuses_a_layout_built_for_triton_alone() -> None:
    layout = VarlenLayout.build([0], [2], [torch.arange(3)], [False], 2, grouped=False)
    with pytest.raises(ValueError, match="grouped=True"):
        varlen_attention(torch.zeros(2, 2, 8), torch.zeros(2, 3, 8), torch.zeros(2, 3, 8), layout, backend="torch")


@pytest.mark.parametrize("with_keep", [False, True])
def test_the_call_is_one_op_at_the_dispatcher_and_its_fake_agrees(with_keep: bool) -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    g = torch.Generator().manual_seed(0)
    q_lens, k_lens = [5, 17, 3], [40, 70, 9]
    slots = list(torch.randperm(sum(k_lens), generator=g).split(k_lens))
    q = torch.randn(sum(q_lens), 4, 12, generator=g).transpose(0, 1)  # [4, 25, 12], strided as the model's
    k, v = torch.randn(2, sum(k_lens), 12, generator=g), torch.randn(2, sum(k_lens), 12, generator=g)
    keep = (torch.rand(2, sum(k_lens), generator=g) < 0.5) if with_keep else None
    layout = _layout(q_lens, slots, [True, False, True], sum(q_lens))
    seen: list[str] = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Ops():
        out = varlen_attention(q, k, v, layout, keep, backend="torch")
    assert seen == ["dllm_constrain.varlen_attention.default"]
    assert out.is_contiguous() and out.shape == q.shape
    op_args = (q, k, v, keep, layout.cu_seqlens_q, layout.cu_seqlens_k, layout.key_slots, layout.use_keep,
               layout.max_seqlen_q, layout.q_index, layout.key_index, layout.key_bias, layout.key_valid,
               layout.group_keep, layout.out_index, layout.counts, layout.group_rows, layout.group_keys, 0.3, "torch")
    torch.library.opcheck(torch.ops.dllm_constrain.varlen_attention.default, op_args,
                          test_utils=("test_schema", "test_faketensor"))


def test_bad_shapes_are_refused() -> None:
    layout = VarlenLayout.build([0], [2], [torch.arange(3)], [False], 2)
    with pytest.raises(ValueError, match="shape mismatch"):
        varlen_attention(torch.zeros(3, 2, 8), torch.zeros(2, 3, 8), torch.zeros(2, 3, 8), layout)


@SETTINGS
@given(n_seqs=st.integers(1, 3), data=st.data())
def test_selection_keeps_what_the_packed_selection_keeps(n_seqs, data) -> None:
    """Per sequence: span queries [a, b) of its n keys; the keys outside the span are the candidates."""
    hkv, rep, d = data.draw(st.integers(1, 2)), data.draw(st.sampled_from([1, 2])), 16
    ratio = data.draw(st.sampled_from([0.25, 0.5, 0.9]))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    seqs = []
    for _ in range(n_seqs):
        n = data.draw(st.integers(3, 90))
        a = data.draw(st.integers(0, n - 1))
        b = data.draw(st.integers(a + 1, min(n, a + 35)))
        seqs.append((n, a, b))
    pool = sum(n for n, _, _ in seqs)
    k = torch.randn(hkv, pool, d, generator=g)
    qs = [torch.randn(hkv * rep, b - a, d, generator=g) for _, a, b in seqs]
    q = torch.cat(qs, dim=1)
    q_lens = [b - a for _, a, b in seqs]
    slots, outside, at = [], [], 0
    for n, a, b in seqs:
        slots.append(torch.arange(at, at + n))
        mask = torch.ones(n, dtype=torch.bool)
        mask[a:b] = False
        outside.append(mask)
        at += n
    layout = VarlenLayout.build(_starts(q_lens), q_lens, slots, [False] * n_seqs, q.shape[1], key_valid=outside)
    counts = keep_counts([n - (b - a) for n, a, b in seqs], ratio)
    needs = [torch.tensor([counts[i] for i in members]) for members in layout.group_seqs]
    chosen = va.select_salient_keys(q, k, layout, needs, [int(x.max()) for x in needs], scale=1.0 / math.sqrt(d))
    for g, members in enumerate(layout.group_seqs):
        for j, i in enumerate(members):
            n, a, b = seqs[i]
            kf = k[:, slots[i]][None]  # [1, Hkv, n, D]
            packed = pka.select_salient_keys(qs[i][None], kf, kf, outside[i][None], ratio)
            for h in range(hkv):
                expect = set(packed.indices[0, h, :int(packed.lengths[0, h])].tolist())
                assert set(torch.nonzero(chosen[g][h, j, :n]).flatten().tolist()) == expect


def test_a_step_builds_only_the_metadata_its_backend_reads_and_both_give_the_same_rows(tiny_llada) -> None:
    """On Triton (CUDA; here its interpreter) the grouped torch path's per-group metadata is neither built nor
    copied; the GIL-free forward's twin, which runs the grouped path on any device, asks for it."""
    from dllm_constrain.engine.attention_step import StepAttention
    from dllm_constrain.engine.config import EngineConfig
    from dllm_constrain.engine.llm_engine import LLMEngine
    from dllm_constrain.engine.model_runner import ModelRunner
    from dllm_constrain.engine.state import Request, SamplingParams

    engine = LLMEngine(tiny_llada)
    params = SamplingParams(max_new_tokens=8, block_length=4)
    states = [engine._new_state(i, Request(p, params)) for i, p in enumerate([[10, 11, 12], list(range(20, 45))])]
    runner = ModelRunner(tiny_llada, tiny_llada.special.pad_id, EngineConfig(gil_free_forward=False))
    runner.reset(states)
    hidden = {}
    with torch.inference_mode():
        runner.forward_rows(states[:1])
        segments = runner.plan(states)
        ids, pos, _, total = runner._packed_inputs(segments)
        for backend in ("triton", "torch"):
            step = StepAttention.build(segments, runner.cache, ids.shape[1], runner.device, backend=backend)
            assert step.backend == backend and step.layout.grouped == (backend == "torch")
            assert (step.layout.counts == []) == (backend == "triton")
            hidden[backend] = tiny_llada.hidden_states_cached(ids, pos, step.attend)[0, :total]
    torch.testing.assert_close(hidden["triton"], hidden["torch"], atol=1e-5, rtol=1e-5)


def test_the_sparse_selection_is_one_op_that_declares_its_write_of_the_keep_mask(tiny_llada) -> None:
    from dllm_constrain.engine.attention_step import StepAttention
    from dllm_constrain.engine.config import EngineConfig
    from dllm_constrain.engine.llm_engine import LLMEngine
    from dllm_constrain.engine.model_runner import ModelRunner
    from dllm_constrain.engine.state import Request, SamplingParams

    engine = LLMEngine(tiny_llada)
    params = SamplingParams(max_new_tokens=8, block_length=4)
    states = [engine._new_state(i, Request(p, params)) for i, p in enumerate([[10, 11, 12], list(range(20, 45))])]
    runner = ModelRunner(tiny_llada, tiny_llada.special.pad_id, EngineConfig(gil_free_forward=False, keep_ratio=0.5))
    runner.reset(states)
    with torch.inference_mode():
        runner.forward_rows(states[:1])  # the pool exists, with its keep mask
        segments = runner.plan(states)  # request 0 reuses, request 1 refreshes: its keys are selected
        step = StepAttention.build(segments, runner.cache, sum(seg.length for seg in segments), runner.device, 0.5)
    sel = step.selection
    assert sel is not None and runner.cache is not None
    keys, _, keep = runner.cache.layer(0, torch.zeros(2, 1, 8))
    g = torch.Generator().manual_seed(1)
    q = torch.randn(4, step.layout.rows, 8, generator=g)
    lay = sel.layout
    args = (q, keys, keep.clone(), lay.q_index, lay.key_index, lay.key_valid, lay.query_valid, lay.counts,
            lay.group_rows, lay.group_keys, sel.needs, sel.kmaxes, sel.spans, sel.src, sel.dst, 0.35)
    torch.library.opcheck(torch.ops.dllm_constrain.mark_salient_keys_.default, args,
                          test_utils=("test_schema", "test_faketensor"))
