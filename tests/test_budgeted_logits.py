"""The budgeted logits path: row chunks under a byte budget, masks applied inside each chunk, outputs identical to
the unbudgeted path (one projection of all rows, `engine.sampling.reduce_logits`), greedy and seeded sampling."""
from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_llada
from engine_fakes import DIGITS, EOS, MASK, DigitsConstraint, ScriptedModel

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.logits import MAX_BUDGET, MIN_BUDGET, LogitsPath, default_logits_budget
from dllm_constrain.engine.state import Request, SamplingParams

TINY_BUDGET = 1  # below one row's workspace: every chunk is a single row


def _generate(model, config: EngineConfig, prompts, constraint_factory=None, **params):
    engine = LLMEngine(model, config=config)
    p = SamplingParams(**{**dict(max_new_tokens=16, block_length=8), **params})
    reqs = [Request(ids, p, constraint_factory() if constraint_factory else None) for ids in prompts]
    return engine.generate(reqs), engine


@pytest.mark.parametrize("kv_cache", ["none", "dual"])
@pytest.mark.parametrize("params", [
    dict(temperature=0.0),
    dict(temperature=0.9, seed=7),
    dict(temperature=0.9, seed=7, policy="threshold", threshold=0.3),
    dict(temperature=0.5, seed=1, policy="entropy"),
])
def test_tiny_budget_equals_unbudgeted_on_llada(params, kv_cache) -> None:
    """The fused hidden x LM-head path (LLaDA exposes its head), one row per chunk, vs all rows at once."""
    model = build_tiny_llada()
    prompts = [[10, 11, 12, 13, 14], [20, 21]]
    want, _ = _generate(model, EngineConfig(kv_cache=kv_cache, budgeted_logits=False), prompts, **params)
    got, engine = _generate(model, EngineConfig(kv_cache=kv_cache, logits_budget_bytes=TINY_BUDGET), prompts,
                            **params)
    assert [r.canvas_ids for r in got] == [r.canvas_ids for r in want]
    assert [r.nfe for r in got] == [r.nfe for r in want]
    assert engine.logits_path.weight is not None
    assert engine.logits_path.chunks > sum(r.nfe for r in got)  # many chunks per step


def _digits_constraint():
    return DigitsConstraint(digits=[d + 100 for d in DIGITS], vocab_size=260, eos_id=1, mask_id=3)


@pytest.mark.parametrize("temperature, seed", [(0.0, None), (1.0, 11)])
def test_tiny_budget_equals_unbudgeted_under_a_constraint(temperature, seed) -> None:
    """Masks are applied inside each chunk before any statistic: constrained outputs are identical too."""
    model = build_tiny_llada()
    kw = dict(temperature=temperature, seed=seed, max_new_tokens=12, block_length=4)
    want, _ = _generate(model, EngineConfig(budgeted_logits=False), [[10, 11, 12]], _digits_constraint, **kw)
    got, _ = _generate(model, EngineConfig(logits_budget_bytes=TINY_BUDGET), [[10, 11, 12]], _digits_constraint, **kw)
    assert [r.canvas_ids for r in got] == [r.canvas_ids for r in want]
    assert _digits_constraint().accepts(got[0].token_ids)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_models_without_a_head_weight_project_chunk_by_chunk(temperature) -> None:
    """A model with only `logits()` (no `lm_head_weight`) is projected per chunk; no chunk exceeds the budget's
    rows, and the results equal the unbudgeted path."""
    script = [{DIGITS[i % 10]: 0.5 + 0.04 * i} for i in range(8)] + [{EOS: 0.9}] * 4
    kw = dict(max_new_tokens=12, block_length=12, temperature=temperature, seed=3)
    model_a = ScriptedModel(script, prompt_len=2)
    want, _ = _generate(model_a, EngineConfig(budgeted_logits=False), [[0, 4]], DigitsConstraint, **kw)
    model_b = ScriptedModel(script, prompt_len=2)
    per_row = 8 * model_b.vocab_size * (20 // 8 if temperature > 0 else 1)  # the torch workspace per row
    got, engine = _generate(model_b, EngineConfig(logits_budget_bytes=3 * per_row), [[0, 4]], DigitsConstraint, **kw)
    assert [r.canvas_ids for r in got] == [r.canvas_ids for r in want]
    assert engine.logits_path.weight is None
    assert model_b.logit_shapes and max(s[0] for s in model_b.logit_shapes) <= 3
    assert max(s[0] for s in model_a.logit_shapes) == 12  # the unbudgeted path projects the whole block


def test_default_budget_comes_from_free_memory(monkeypatch) -> None:
    import dllm_constrain.engine.logits as logits_mod

    budget = default_logits_budget("cpu")
    assert MIN_BUDGET <= budget <= MAX_BUDGET
    monkeypatch.setattr(logits_mod, "available_ram_bytes", lambda: 1 << 30)
    assert default_logits_budget("cpu") == (1 << 30) // 16
    monkeypatch.setattr(logits_mod, "available_ram_bytes", lambda: 1 << 20)
    assert default_logits_budget("cpu") == MIN_BUDGET


def test_row_chunks_follow_the_budget() -> None:
    model = build_tiny_llada()
    path = LogitsPath(model, budget_bytes=5 * 8 * model.vocab_size)  # five greedy rows of float32 logits + scratch
    assert path.rows_per_chunk(model.vocab_size, sampling=False, device=torch.device("cpu")) == 5
    assert path.rows_per_chunk(model.vocab_size, sampling=True, device=torch.device("cpu")) == 2
    hidden = torch.randn(13, 32)
    allowed = torch.ones(13, model.vocab_size, dtype=torch.bool)
    allowed[:, MASK] = False
    stats = path.row_stats(hidden, allowed, 0.0, None)
    assert path.chunks == 3 and len(stats) == 13
    torch.testing.assert_close(stats.token, model.logits(hidden).masked_fill(~allowed, -1e9).argmax(-1))


def test_the_unbudgeted_seam_runs_the_kernels_row_statistics(monkeypatch) -> None:
    """One implementation of the row statistics: engine.sampling.reduce_logits (the unbudgeted path) is the kernels'
    dispatcher, so the two paths cannot drift apart."""
    from dllm_constrain.engine import sampling
    from dllm_constrain.kernels import masked_row_stats as mrs

    calls = []
    real = mrs.masked_row_stats

    def spy(*args, **kwargs):
        calls.append(kwargs.get("backend"))
        return real(*args, **kwargs)

    monkeypatch.setattr(mrs, "masked_row_stats", spy)
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(0))
    stats = sampling.reduce_logits(logits, None, 0.0, None)
    assert calls == ["auto"] and stats.token.tolist() == logits.argmax(-1).tolist()
    assert sampling.RowStats is mrs.RowStats and sampling.gumbel_noise is mrs.gumbel_noise
