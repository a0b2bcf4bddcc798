"""Dream (shifted prediction inside the adapter) through the generic loop: same guarantees as LLaDA."""
from __future__ import annotations

import pytest
from checkpoints import build_dream

from dllm_constrain.engine.llm_engine import LLMEngine, is_block_diffusion
from dllm_constrain.engine.loader import load_checkpoint
from dllm_constrain.engine.state import POLICY_NAMES, Request, SamplingParams


@pytest.fixture(scope="module")
def dream(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("dream") / "ckpt"
    build_dream(folder)
    return load_checkpoint(folder)


def _req(prompt: list[int], **params) -> Request:
    return Request(prompt, SamplingParams(**{**dict(max_new_tokens=12, block_length=4, temperature=0.7, seed=2),
                                             **params}))


def test_dream_runs_the_generic_loop(dream) -> None:
    assert not is_block_diffusion(dream.model)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_completes_a_dream_canvas(dream, policy: str) -> None:
    (res,) = LLMEngine(dream.model, dream.tokenizer).generate([_req([10, 11, 12], policy=policy)])
    assert dream.model.special.mask_id not in res.canvas_ids
    assert isinstance(res.text, str) and res.nfe >= 1


def test_dream_gives_the_same_answer_alone_and_in_a_left_padded_batch(dream) -> None:
    prompts = [[10, 11, 12, 13, 14, 15, 16], [20, 21]]
    engine = LLMEngine(dream.model, dream.tokenizer)
    batched = engine.generate([_req(p) for p in prompts])
    for p, res in zip(prompts, batched):
        (alone,) = engine.generate([_req(p)])
        assert res.canvas_ids == alone.canvas_ids
