"""engine/kv_pool.py: pages per request for life, sized from a byte budget, no allocation per Refresh."""
from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_llada
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.kv_pool import PAGE, KVPool
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.model_runner import ModelRunner
from dllm_constrain.engine.scheduler import kv_bytes_per_token
from dllm_constrain.engine.state import Request, SamplingParams
from dllm_constrain.errors import InvalidRequestError


@settings(max_examples=30, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(1, 70)), max_size=30))
def test_running_requests_never_share_a_slot(ops) -> None:
    """Any sequence of admissions and releases: every running request has its own len(tokens) distinct slots."""
    pool = KVPool(None)
    for admit, index, length in ops:
        if admit:
            pool.admit(index, length)
        else:
            pool.release(index)
        slots = [pool.slots(i) for i in pool.owned]
        assert all(s.numel() == pool.lengths[i] for s, i in zip(slots, pool.owned))
        flat = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.long)
        assert flat.unique().numel() == flat.numel() and (flat < pool.pages * PAGE).all()


def test_a_byte_budget_preallocates_and_page_rounding_grows_it_by_what_is_lacking() -> None:
    pool = KVPool(KVPool.capacity_for(bytes_per_token=100, memory=100 * 3 * PAGE, device=torch.device("cpu")))
    assert pool.capacity_tokens == 3 * PAGE and pool.pages == 3
    pool.admit(0, PAGE + 1)  # 2 pages for 17 tokens
    pool.admit(1, PAGE + 1)  # the budget's 48 tokens hold both (34), their pages need one more
    assert pool.pages == 4 and len(pool.free) == 0
    pool.release(0)
    pool.admit(2, 2 * PAGE)  # freed pages are reused before any growth
    assert pool.pages == 4
    assert KVPool.capacity_for(100, None, torch.device("cpu")) is None  # the CPU without a budget: nothing up front


def test_refreshes_write_into_the_same_preallocated_tensors() -> None:
    model = build_tiny_llada()
    engine = LLMEngine(model)
    config = EngineConfig(refresh="steps", refresh_steps=1, gil_free_forward=False,
                          kv_cache_memory=kv_bytes_per_token(model) * 8 * PAGE)
    runner = ModelRunner(model, model.special.pad_id, config)
    assert runner.kv_capacity_tokens == 8 * PAGE
    states = [engine._new_state(i, Request([10 + i, 11], SamplingParams(max_new_tokens=8, block_length=4)))
              for i in range(3)]
    runner.reset(states)
    with torch.inference_mode():
        runner.forward_rows(states)
        pointers = [t.data_ptr() for t in runner.cache.k + runner.cache.v]
        for _ in range(3):
            runner.forward_rows(states)  # a Refresh every forward
        assert [t.data_ptr() for t in runner.cache.k + runner.cache.v] == pointers
    assert runner.cache.k[0].shape[1] == 8 * PAGE
    runner.release(1)
    assert 1 not in runner.cache and len(runner.cache.free) == 8 - 2


def test_a_bad_kv_cache_memory_is_a_typed_error() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidRequestError):
            EngineConfig(kv_cache_memory=bad).validate()


def test_admission_keeps_the_running_requests_within_the_kv_pool() -> None:
    """A pool of a fixed size (kv_cache_memory, or free CUDA memory) bounds the tokens the scheduler admits, even
    without a separate kv_budget_bytes."""
    model = build_tiny_llada()
    engine = LLMEngine(model)
    engine.runner.kv_capacity_tokens = 5 * PAGE  # as a pool sized from free device memory would be
    limits = engine._scheduler_config(EngineConfig(), engine.scheduler_config)
    assert limits.max_num_tokens == 5 * PAGE
