"""Engine performance settings through the public API: pass-through, defaults, and what the counters report."""
from __future__ import annotations

import pytest

from dllm_constrain.api import LLM
from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.errors import InvalidRequestError


@pytest.fixture(scope="module")
def llm(tiny_checkpoint):
    return LLM(tiny_checkpoint, prompt_format="raw")


def test_defaults_use_the_kv_cache_refreshed_once_per_block(llm) -> None:
    assert llm.engine.config == EngineConfig(max_logit_rows=32)  # the LLM default row cap
    assert (EngineConfig().kv_cache, EngineConfig().refresh, EngineConfig().keep_ratio) == ("dual", "block", 1.0)
    (res,) = llm.generate("hello", max_new_tokens=16, block_length=8, steps=16)
    assert res.nfe == 16 and res.refreshes == 2  # one full forward per block, reuse otherwise


def test_settings_pass_through_generate(llm) -> None:
    kw = dict(max_new_tokens=16, block_length=8, steps=16)
    (full,) = llm.generate("hello", kv_cache="none", **kw)
    assert full.refreshes == full.nfe == 16
    (every,) = llm.generate("hello", refresh="steps", refresh_steps=1, **kw)
    assert every.canvas_ids == full.canvas_ids
    (adaptive,) = llm.generate("hello", refresh="adaptive", refresh_threshold=0.25, **kw)
    assert adaptive.refreshes == 2 * 4  # 8 commits per block, a refresh every 2
    (sparse,) = llm.generate("hello", keep_ratio=0.5, logits_budget_bytes=1, **kw)
    assert sparse.nfe == 16 and len(sparse.canvas_ids) == 16
    assert llm.engine.config == EngineConfig(max_logit_rows=32)  # per-call settings do not stick


def test_module_level_generate_passes_settings(llm) -> None:
    from dllm_constrain.api import generate

    a = generate("hello", model=llm, max_new_tokens=8, block_length=8, kv_cache="none", return_result=True)
    b = generate("hello", model=llm, max_new_tokens=8, block_length=8, refresh="steps", refresh_steps=1,
                 return_result=True)
    assert a.canvas_ids == b.canvas_ids and a.refreshes == 8


@pytest.mark.parametrize("bad", [dict(kv_cache="always"), dict(refresh="sometimes"), dict(keep_ratio=0.0),
                                 dict(refresh_steps=0), dict(logits_budget_bytes=-5)])
def test_bad_settings_raise_typed_errors(llm, bad) -> None:
    with pytest.raises(InvalidRequestError):
        llm.generate("hello", max_new_tokens=8, **bad)
