"""DiffusionGemma through the engine: prompt cache, uniform-noise canvas, self-conditioning, lockstep blocks."""
from __future__ import annotations

import pytest
import torch
from checkpoints import build_diffusion_gemma
from engine_fakes import DigitsConstraint

from dllm_constrain.engine.llm_engine import LLMEngine, is_block_diffusion
from dllm_constrain.engine.loader import load_checkpoint
from dllm_constrain.engine.state import POLICY_NAMES, Request, SamplingParams

EOS, MASK = 1, 4  # the tiny DiffusionGemma checkpoint's ids (pad 0, bos 2)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory):
    folder = build_diffusion_gemma(tmp_path_factory.mktemp("dg") / "ckpt", canvas_length=8)
    return load_checkpoint(folder, dtype=torch.float32).model


class Recorder:
    """Wraps the adapter to record what the engine feeds the decoder at each step."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.advances: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self.extends = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def advance(self, state, tokens, accepted=None, *, self_conditioning_logits, generator=None):
        self.advances.append((tokens.clone(), self_conditioning_logits))
        return self.inner.advance(state, tokens, accepted, self_conditioning_logits=self_conditioning_logits,
                                  generator=generator)

    def extend_prompt(self, prompt, ids):
        self.extends += 1
        return self.inner.extend_prompt(prompt, ids)


def _req(prompt: list[int], constraint=None, **params) -> Request:
    base = dict(max_new_tokens=16, block_length=8, temperature=0.8, seed=0)
    return Request(prompt, SamplingParams(**{**base, **params}), constraint)


def test_the_adapter_is_driven_as_a_block_diffusion_model(gemma) -> None:
    assert is_block_diffusion(gemma)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_completes_a_diffusion_gemma_canvas(gemma, policy: str) -> None:
    (res,) = LLMEngine(gemma).generate([_req([5, 6, 7], policy=policy)])
    assert len(res.canvas_ids) == 16 and MASK not in res.canvas_ids
    assert 1 <= res.nfe <= 16


def test_open_positions_get_fresh_noise_and_the_previous_logits_condition_the_next_step(gemma) -> None:
    rec = Recorder(gemma)
    LLMEngine(rec).generate([_req([5, 6, 7], max_new_tokens=8, steps=8)])
    (t0, sc0), (t1, sc1) = rec.advances[:2]
    assert sc0 is None and sc1 is not None and sc1.shape == (1, 8, gemma.vocab_size)
    committed_after_first = (t1 != t0).sum().item()
    assert committed_after_first >= 6  # 7 open positions re-noised (uniform over 320 ids) + 1 commit


def test_finished_blocks_are_appended_to_the_prompt_cache(gemma) -> None:
    """Every block before the one that ends the answer (or before the last) is encoded into the cache."""
    rec = Recorder(gemma)
    (res,) = LLMEngine(rec).generate([_req([5, 6, 7], max_new_tokens=24, block_length=8)])
    last_block = 2 if res.finish_reason == "length" else len(res.token_ids) // 8
    assert rec.extends == last_block


def test_a_request_gets_the_same_answer_alone_and_in_a_batch(gemma) -> None:
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12]]
    batched = LLMEngine(gemma).generate([_req(p) for p in prompts])
    for p, res in zip(prompts, batched):
        (alone,) = LLMEngine(gemma).generate([_req(p)])
        assert res.canvas_ids == alone.canvas_ids and res.nfe == alone.nfe


def test_a_constraint_holds_on_diffusion_gemma(gemma) -> None:
    constraint = DigitsConstraint(digits=list(range(10, 20)), vocab_size=gemma.vocab_size, eos_id=EOS, mask_id=MASK)
    (res,) = LLMEngine(gemma).generate([_req([5, 6], constraint, policy="entropy_bound")])
    assert constraint.accepts(res.token_ids), res.canvas_ids


def test_under_a_constraint_open_positions_are_renoised_from_the_masked_distribution(gemma) -> None:
    """After the first step, every open position the decoder sees holds a token the constraint allowed there."""
    digits = list(range(10, 20))
    constraint = DigitsConstraint(digits=digits, vocab_size=gemma.vocab_size, eos_id=EOS, mask_id=MASK)
    rec = Recorder(gemma)
    LLMEngine(rec).generate([_req([5, 6], constraint, max_new_tokens=8, steps=8)])
    for tokens, _ in rec.advances[1:]:
        assert set(tokens[0].tolist()) <= set(digits) | {EOS}
