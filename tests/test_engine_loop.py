"""The denoising loop on a tiny random LLaDA: every policy, determinism, batching, budgets, bad input."""
from __future__ import annotations

import pytest
import torch
from engine_fakes import ScriptedModel

from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.state import POLICY_NAMES, Request, SamplingParams
from dllm_constrain.errors import InvalidRequestError, PromptTooLongError

SPECIAL_IDS = {0, 2, 3}  # bos, pad, mask never appear in an answer (eos 1 ends it)


def _run(model, tokenizer, prompts: list[str], **params) -> list:
    engine = LLMEngine(model, tokenizer)
    reqs = [Request(tokenizer.encode(p).ids, SamplingParams(**params)) for p in prompts]
    return engine.generate(reqs)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_fills_the_canvas_with_ordinary_tokens(tiny_llada, tiny_tokenizer, policy: str) -> None:
    """Each policy terminates with a fully committed canvas: no mask, no BOS/PAD, EOS only as the tail."""
    (res,) = _run(tiny_llada, tiny_tokenizer, ["hello"], max_new_tokens=16, block_length=8, policy=policy,
                  temperature=0.7, seed=0)
    assert len(res.canvas_ids) == 16
    assert not SPECIAL_IDS & set(res.canvas_ids)
    assert 1 not in res.token_ids
    assert all(t == 1 for t in res.canvas_ids[len(res.token_ids):])
    assert 1 <= res.nfe <= 16


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_same_seed_gives_the_same_answer(tiny_llada, tiny_tokenizer, policy: str) -> None:
    """Sampling at T > 0 is reproducible from the seed."""
    kw = dict(max_new_tokens=12, block_length=4, policy=policy, temperature=1.0, seed=123)
    a = _run(tiny_llada, tiny_tokenizer, ["abc"], **kw)[0]
    b = _run(tiny_llada, tiny_tokenizer, ["abc"], **kw)[0]
    assert a.canvas_ids == b.canvas_ids and a.nfe == b.nfe


def test_different_seeds_give_different_samples(tiny_llada, tiny_tokenizer) -> None:
    kw = dict(max_new_tokens=16, block_length=16, temperature=1.0)
    a = _run(tiny_llada, tiny_tokenizer, ["abc"], seed=1, **kw)[0]
    b = _run(tiny_llada, tiny_tokenizer, ["abc"], seed=2, **kw)[0]
    assert a.canvas_ids != b.canvas_ids


def test_greedy_decoding_repeats_exactly_without_a_seed(tiny_llada, tiny_tokenizer) -> None:
    """Temperature 0 is deterministic even with no seed."""
    a = _run(tiny_llada, tiny_tokenizer, ["xyz"], max_new_tokens=12, block_length=4)[0]
    b = _run(tiny_llada, tiny_tokenizer, ["xyz"], max_new_tokens=12, block_length=4)[0]
    assert a.canvas_ids == b.canvas_ids


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_request_gets_the_same_answer_alone_and_in_a_left_padded_batch(tiny_llada, tiny_tokenizer,
                                                                         temperature: float) -> None:
    """Left padding + key-padding mask + real-token position ids + per-request generators."""
    prompts = ["a much longer prompt than the other", "hi", "medium one"]
    kw = dict(max_new_tokens=12, block_length=4, temperature=temperature, seed=5)
    batched = _run(tiny_llada, tiny_tokenizer, prompts, **kw)
    for prompt, res in zip(prompts, batched):
        (alone,) = _run(tiny_llada, tiny_tokenizer, [prompt], **kw)
        assert res.canvas_ids == alone.canvas_ids
        assert res.nfe == alone.nfe


def test_results_come_back_in_request_order_with_counters(tiny_llada, tiny_tokenizer) -> None:
    res = _run(tiny_llada, tiny_tokenizer, ["one", "two"], max_new_tokens=8, block_length=8)
    assert len(res) == 2
    for r in res:
        assert r.nfe > 0 and r.wall_time > 0 and r.tokens_per_forward > 0
        assert r.finish_reason in ("eos", "length")
        assert isinstance(r.text, str)


def test_quota_policy_commits_canvas_over_steps_tokens_per_forward() -> None:
    """16 positions, 2 blocks, 8 steps: exactly 2 commits per forward, 8 forwards (no EOS in the script)."""
    model = ScriptedModel([{5 + i % 8: 0.9} for i in range(16)], prompt_len=2)
    engine = LLMEngine(model)
    (res,) = engine.generate([Request([0, 4], SamplingParams(max_new_tokens=16, block_length=8, steps=8))])
    assert res.nfe == 8 and model.forwards == 8
    assert res.tokens_per_forward == 2.0
    assert res.finish_reason == "length"


def test_logits_are_projected_only_for_open_rows_of_the_active_block_in_chunks() -> None:
    """Never [batch, canvas, vocab]: at most min(block open rows, max_logit_rows) rows per projection."""
    model = ScriptedModel([{5: 0.9}] * 32, prompt_len=1)
    engine = LLMEngine(model, max_logit_rows=3)
    engine.generate([Request([0], SamplingParams(max_new_tokens=32, block_length=8, steps=32))] * 2)
    assert model.logit_shapes and all(len(s) == 2 and s[0] <= 3 for s in model.logit_shapes)


def test_a_block_length_that_does_not_divide_the_canvas_leaves_a_shorter_last_block() -> None:
    model = ScriptedModel([{6: 0.9}] * 10, prompt_len=1)
    (res,) = LLMEngine(model).generate([Request([0], SamplingParams(max_new_tokens=10, block_length=4, steps=10))])
    assert res.canvas_ids == [6] * 10
    assert res.nfe == 10


def test_progress_callback_sees_every_step_with_open_positions_masked(tiny_llada, tiny_tokenizer) -> None:
    events = []
    engine = LLMEngine(tiny_llada, tiny_tokenizer)
    engine.generate([Request([5, 6], SamplingParams(max_new_tokens=8, block_length=8))], progress=events.append)
    assert events and events[-1].snapshots[0].done
    first = events[0].snapshots[0]
    assert sum(first.committed) == 1
    assert all(t == 3 for t, c in zip(first.canvas, first.committed) if not c)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(steps=0), "steps"),
        (dict(block_length=0), "block_length"),
        (dict(temperature=-0.5), "temperature"),
        (dict(policy="nope"), "policy"),
    ],
)
def test_bad_sampling_parameters_raise_an_error_naming_the_field(tiny_llada, params: dict, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        LLMEngine(tiny_llada).generate([Request([5], SamplingParams(**params))])


def test_an_empty_prompt_is_refused(tiny_llada) -> None:
    with pytest.raises(InvalidRequestError, match="empty"):
        LLMEngine(tiny_llada).generate([Request([], SamplingParams())])


def test_a_prompt_that_does_not_fit_the_context_is_refused(tiny_llada) -> None:
    """The tiny model has a 256-token context."""
    with pytest.raises(PromptTooLongError, match="256"):
        LLMEngine(tiny_llada).generate([Request([5] * 200, SamplingParams(max_new_tokens=64))])


def test_generation_runs_without_autograd(tiny_llada) -> None:
    """The loop is inference-only; no graph is kept alive across steps."""
    engine = LLMEngine(tiny_llada)
    res = engine.generate([Request([5], SamplingParams(max_new_tokens=4, block_length=4))])
    assert res[0].nfe >= 1
    assert torch.is_grad_enabled()
