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


def test_the_engine_times_its_forwards_by_kind_refreshes_among_them(llm) -> None:
    """After a generate() call, mask_timing counts its forwards and, of them, the refreshes (the costly kind), so a
    benchmark can price one call's mix of forwards at another's cost per kind."""
    from dllm_constrain.engine.llm_engine import LLMEngine
    from dllm_constrain.engine.state import Request, SamplingParams

    engine = LLMEngine(llm.model, llm.tokenizer)
    params = SamplingParams(max_new_tokens=16, block_length=8, steps=16)
    [res] = engine.generate([Request([5, 6, 7], params)])
    timing = engine.mask_timing
    assert (timing.forwards, timing.refresh_forwards) == (res.nfe, res.refreshes) == (16, 2)
    assert 0 < timing.refresh_seconds < timing.forward_seconds
    [full] = engine.generate([Request([5, 6, 7], params)], config=EngineConfig(kv_cache="none"))
    assert engine.mask_timing.forwards == engine.mask_timing.refresh_forwards == full.nfe == 16


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


_TRITON_SCRIPT = """
import sys, torch
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
from conftest import build_tiny_llada
from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.state import Request, SamplingParams
from dllm_constrain.kernels._backend import last_backend
model = build_tiny_llada()
out = {{}}
for backend in ("torch", "triton"):
    engine = LLMEngine(model, config=EngineConfig(backend=backend, keep_ratio=0.5, logits_budget_bytes=20000))
    params = SamplingParams(max_new_tokens=8, block_length=4, temperature=0.8, seed=1)
    out[backend] = [r.canvas_ids for r in engine.generate([Request([10, 11, 12, 13], params), Request([20], params)])]
    assert last_backend("masked_row_stats_from_hidden") == backend, backend
    assert last_backend("varlen_attention") == backend, backend
assert out["torch"] == out["triton"], out
print("OK")
"""


def test_the_engine_runs_the_triton_kernels_and_they_agree_with_torch() -> None:
    """backend="triton" (under TRITON_INTERPRET=1 on CPU, in a subprocess so the interpreter flag cannot leak into
    other tests): the fused logits kernel and the varlen attention kernel run inside the engine and give the same
    canvases as the torch references (sparse reuse, seeded sampling, chunked logits)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = _TRITON_SCRIPT.format(tests=str(Path(__file__).parent))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_the_checkpoint_generation_config_sets_the_default_policy(tiny_checkpoint, tmp_path) -> None:
    """generation_config.json may name the commit policy (the bundled model: threshold 0.97); callers that leave
    policy/threshold unset get it, explicit arguments win."""
    import shutil

    from dllm_constrain.api import GenerationDefaults

    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, folder)
    (folder / "generation_config.json").write_text(
        '{"max_new_tokens": 16, "block_length": 8, "policy": "threshold", "threshold": 0.0}')
    assert GenerationDefaults.from_folder(folder) == GenerationDefaults(16, 8, None, "threshold", 0.0)
    llm = LLM(folder, prompt_format="raw")
    (default,) = llm.generate("hello")
    (threshold,) = llm.generate("hello", policy="threshold", threshold=0.0)
    (quota,) = llm.generate("hello", policy="quota")
    assert default.canvas_ids == threshold.canvas_ids and default.nfe == threshold.nfe
    assert quota.nfe == 16 > default.nfe  # quota: one commit per step; threshold 0 commits whole blocks


def test_the_bundled_model_decodes_with_the_confidence_threshold_by_default() -> None:
    """The shipped defaults: the confidence threshold the held-out figures chose (docs/performance.md)."""
    from dllm_constrain.api import GenerationDefaults, bundled_model_path

    defaults = GenerationDefaults.from_folder(bundled_model_path())
    assert (defaults.policy, defaults.threshold) == ("threshold", 0.97)
    assert (defaults.max_new_tokens, defaults.block_length) == (96, 32)
