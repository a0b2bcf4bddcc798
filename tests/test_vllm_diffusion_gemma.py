"""Constrained DiffusionGemma inside vLLM (dllm_constrain/vllm_plugin/diffusion_gemma.py, block_constraint.py).

The block constraint (masks for a block's rows of the flat logits, joint check and repair of a committed block) is
vLLM-independent and tested here in any venv, on blocks committed from random logits the way vLLM's uniform-noise
sampler commits them (each position its row's argmax). The vLLM classes are tested where vLLM's DiffusionGemma
module imports (it needs transformers' Gemma4 processor, hence torchvision, which vLLM's CPU install here must
remove), and a constrained generation where there is also a GPU and a DiffusionGemma checkpoint
(DLLM_CONSTRAIN_DIFFUSION_GEMMA=<folder>); otherwise those skip with the reason.
"""
from __future__ import annotations

import json
import os

from types import SimpleNamespace

import jsonschema
import numpy as np
import pytest
import torch

from conftest import build_tiny_tokenizer
from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.engine.state import STRICT_SCHEMA_OPTIONS
from dllm_constrain.vllm_plugin.block_constraint import MASKED_LOGIT, BlockConstraint, mask_flat_logits

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
VOCAB = 272  # logits wider than the tokenizer's 260 ids, as a padded vocabulary is
EOS = 1


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def compiler(tok):
    return ConstraintCompiler(TokenizerInfo.from_tokenizer(tok, eos_id=EOS, vocab_size=260))


def _text(tok, ids: list[int]) -> str:
    end = ids.index(EOS) if EOS in ids else len(ids)
    return tok.decode(ids[:end])


def _denoise(bc: BlockConstraint, width: int, gen: torch.Generator) -> list[int]:
    """Commit blocks of `width` from random logits until the canvas is full: each block's positions are their
    masked rows' argmax, as vLLM's sampler commits a converged block."""
    while not bc.finished():
        logits = torch.randn((width, VOCAB), generator=gen)
        rows = bc.block_rows(width, VOCAB)
        masked = mask_flat_logits(logits, [0], [rows])
        block = masked.argmax(dim=1).tolist()[:bc.max_tokens - bc.block_start]
        bc.commit(block, masked)
    return bc.committed


def test_block_rows_allow_only_tokens_that_start_a_valid_answer(compiler, tok) -> None:
    bc = BlockConstraint.for_request(compiler.compile(schema=PERSON, **STRICT_SCHEMA_OPTIONS), max_tokens=40)
    rows = bc.block_rows(4, VOCAB)
    assert rows.shape == (4, VOCAB) and not rows[:, 260:].any()  # no id past the tokenizer's
    first = [tok.decode([t]) for t in torch.nonzero(rows[0]).flatten().tolist()]
    assert first and all(text.startswith("{") for text in first)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("width", [4, 8, 16])
def test_blocks_committed_from_noise_make_a_schema_valid_answer(compiler, tok, seed: int, width: int) -> None:
    bc = BlockConstraint.for_request(compiler.compile(schema=PERSON, **STRICT_SCHEMA_OPTIONS), max_tokens=40)
    ids = _denoise(bc, width, torch.Generator().manual_seed(seed))
    jsonschema.validate(json.loads(_text(tok, ids)), PERSON)


def test_a_block_valid_position_by_position_but_not_jointly_is_repaired(compiler, tok) -> None:
    """"ab" or "ba": each position may be a or b alone, "aa" is no answer; the lower-scored position is
    replaced by the best token its exact row allows once the other is placed."""
    bc = BlockConstraint.for_request(compiler.compile(regex="ab|ba"), max_tokens=3)
    a, b = tok.encode("a").ids[0], tok.encode("b").ids[0]
    rows = bc.block_rows(3, VOCAB)
    assert rows[0, a] and rows[0, b] and rows[1, a] and rows[1, b]
    scores = torch.zeros((3, VOCAB))
    scores[0, a], scores[1, a], scores[1, b], scores[2, EOS] = 5.0, 3.0, 1.0, 1.0
    assert bc.commit([a, a, EOS], scores) == [a, b, EOS]
    assert bc.repaired == 1


def test_masks_go_on_their_requests_rows_only_with_a_finite_value() -> None:
    logits = torch.zeros((7, 5))
    masks = torch.tensor([[True, False, True, False, True]] * 3)
    out = mask_flat_logits(logits, [0, 2, 5], [None, masks, None])
    assert out is not logits and torch.equal(logits, torch.zeros((7, 5)))  # the runner's tensor is left alone
    assert torch.equal(out[2:5], torch.where(masks, 0.0, MASKED_LOGIT))
    assert not out[:2].any() and not out[5:].any() and torch.isfinite(out).all()
    assert mask_flat_logits(logits, [0], [None]) is logits


# ---------------------------------------------------------------------------------------------- the sampler wrapper
class _NoiseSampler:
    """A stand-in with vLLM's DiffusionSampler call contract: reads the flat logits, commits every decoding
    request's block (its rows' argmax) on every step, and exposes an attribute of its own."""

    penalties_state = "inner's"

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []
        self.added: list[int] = []

    def add_request(self, req_idx: int, sampling_params: object) -> None:
        self.added.append(req_idx)

    def __call__(self, logits: torch.Tensor, input_batch: SimpleNamespace, draft_logits: object = None):
        self.seen.append(logits)
        n, width = input_batch.num_reqs, input_batch.num_draft_tokens
        sampled = torch.zeros((n, width), dtype=torch.int32)
        num_sampled = torch.zeros(n, dtype=torch.int32)
        rows = np.diff(input_batch.cu_num_logits_np[:n + 1])
        start = 0
        for i in range(n):
            if rows[i]:
                sampled[i, :rows[i]] = logits[start:start + rows[i]].argmax(dim=1).to(torch.int32)
                num_sampled[i] = int(rows[i])
                start += int(rows[i])
        return SimpleNamespace(sampled_token_ids=sampled, num_sampled=num_sampled)


def test_the_wrapper_masks_constrained_rows_and_repairs_their_commits_only(compiler, tok) -> None:
    """Slots 5 (constrained), 2 (in prefill: no rows) and 7 (unconstrained) share a step; the constrained
    request's answer, block by block, is schema-valid; the unconstrained rows reach the sampler untouched."""
    from dllm_constrain.vllm_plugin.core import EXTRA_KEY
    from dllm_constrain.vllm_plugin.diffusion_sampler import ConstrainedDiffusionSampler

    inner = _NoiseSampler()
    sampler = ConstrainedDiffusionSampler(inner, lambda: compiler.tokenizer_info)
    spec = {"kind": "json_schema", "source": json.dumps(PERSON), "strict": True}
    sampler.add_request(5, SimpleNamespace(extra_args={EXTRA_KEY: spec}, max_tokens=40))
    sampler.add_request(7, SimpleNamespace(extra_args=None, max_tokens=40))
    assert inner.added == [5, 7] and set(sampler.requests) == {5} and sampler.penalties_state == "inner's"
    width, gen, answer = 8, torch.Generator().manual_seed(0), []
    batch = SimpleNamespace(num_reqs=3, num_draft_tokens=width, idx_mapping_np=np.array([5, 2, 7]),
                            cu_num_logits_np=np.array([0, width, width, 2 * width]))
    for _ in range(5):
        logits = torch.randn((2 * width, VOCAB), generator=gen)
        out = sampler(logits, batch)
        assert torch.equal(inner.seen[-1][width:], logits[width:])  # slot 7's rows: untouched
        assert (inner.seen[-1][:width] == MASKED_LOGIT).any()
        answer += out.sampled_token_ids[0].tolist()
    jsonschema.validate(json.loads(_text(tok, answer)), PERSON)
    sampler.forget(5)
    logits = torch.randn((2 * width, VOCAB), generator=gen)
    sampler(logits, batch)
    assert inner.seen[-1] is logits  # nothing constrained left: vLLM's step as it was


# ---------------------------------------------------------------------------------------------- admission
def test_admission_claims_a_diffusion_models_constraint_only_when_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A diffusion model's json_schema request is refused (vLLM's sampler cannot apply it) unless the server runs
    our DiffusionGemma sampler; then it travels in extra_args like an autoregressive model's, on a server started
    without --logits-processors (the V2 runner loads none)."""
    from transformers import PreTrainedTokenizerFast

    from dllm_constrain.vllm_plugin.core import EXTRA_KEY
    from dllm_constrain.vllm_plugin.routing import claim, is_enabled_for

    hf_tok = PreTrainedTokenizerFast(tokenizer_object=build_tiny_tokenizer(), eos_token="<|eos|>")
    config = SimpleNamespace(logits_processors=None, is_diffusion=True, tokenizer="tiny-test-diffusion",
                             tokenizer_revision=None, get_vocab_size=lambda: 260,
                             architectures=["DiffusionGemmaForBlockDiffusion"])

    def request() -> SimpleNamespace:
        return SimpleNamespace(structured_outputs=SimpleNamespace(json=PERSON, json_object=None, regex=None,
                                                                  choice=None), extra_args=None, max_tokens=64)

    try:  # the refusal is vLLM's typed validation error where vLLM is installed
        from vllm.exceptions import VLLMValidationError
        refusals: tuple[type[Exception], ...] = (ValueError, VLLMValidationError)
    except ImportError:
        refusals = (ValueError,)
    monkeypatch.delenv("DLLM_CONSTRAIN_VLLM_DIFFUSION", raising=False)
    assert not is_enabled_for(config)
    with pytest.raises(refusals, match="DLLM_CONSTRAIN_VLLM_DIFFUSION=1"):
        claim(request(), config, hf_tok)
    monkeypatch.setenv("DLLM_CONSTRAIN_VLLM_DIFFUSION", "1")
    assert is_enabled_for(config)
    params = request()
    spec = claim(params, config, hf_tok)
    assert params.structured_outputs is None and params.extra_args[EXTRA_KEY] == spec
    assert json.loads(spec["source"]) == PERSON
    other = SimpleNamespace(**{**vars(config), "architectures": ["AnotherDiffusionModel"]})
    assert not is_enabled_for(other)  # no sampler of ours there: its constraint would go unapplied
    with pytest.raises(refusals, match="constrains only"):
        claim(request(), other, hf_tok)


# ---------------------------------------------------------------------------------------------- vLLM's classes
def _vllm_diffusion_gemma():
    pytest.importorskip("vllm", reason="vLLM is not importable here (docs/vllm.md, 'Install')")
    try:
        from dllm_constrain.vllm_plugin import diffusion_gemma
    except (ImportError, ModuleNotFoundError) as exc:
        pytest.skip(f"vLLM's DiffusionGemma module does not import here ({exc}); it needs transformers' Gemma4 "
                    "processor, i.e. torchvision, which the CPU install must remove (docs/vllm.md, 'DiffusionGemma')")
    return diffusion_gemma


def test_the_model_class_is_vllms_with_our_state_and_sampler() -> None:
    dg = _vllm_diffusion_gemma()
    from vllm.model_executor.models.diffusion_gemma import (
        DiffusionGemmaForConditionalGeneration,
        DiffusionGemmaModelState,
    )

    assert issubclass(dg.ConstrainedDiffusionGemma, DiffusionGemmaForConditionalGeneration)
    assert dg.ConstrainedDiffusionGemma.get_model_state_cls() is dg.ConstrainedDiffusionGemmaModelState
    assert issubclass(dg.ConstrainedDiffusionGemmaModelState, DiffusionGemmaModelState)


def test_register_maps_diffusion_gemma_to_our_class_when_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("vllm", reason="vLLM is not importable here (docs/vllm.md, 'Install')")
    from vllm import ModelRegistry

    from dllm_constrain.vllm_plugin.routing import DIFFUSION_ARCH, register_diffusion_model

    monkeypatch.delenv("DLLM_CONSTRAIN_VLLM_DIFFUSION", raising=False)
    assert not register_diffusion_model()
    monkeypatch.setenv("DLLM_CONSTRAIN_VLLM_DIFFUSION", "1")
    saved = ModelRegistry.models[DIFFUSION_ARCH]
    try:
        assert register_diffusion_model()
        entry = ModelRegistry.models[DIFFUSION_ARCH]
        assert (entry.module_name, entry.class_name) == ("dllm_constrain.vllm_plugin.diffusion_gemma",
                                                         "ConstrainedDiffusionGemma")
    finally:
        ModelRegistry.models[DIFFUSION_ARCH] = saved


def test_a_constrained_diffusion_gemma_answer_is_schema_valid() -> None:
    """End to end in vLLM: needs a GPU (vLLM's V2 runner, which diffusion models need, requires Triton on a GPU)
    and a DiffusionGemma checkpoint folder in DLLM_CONSTRAIN_DIFFUSION_GEMMA (docs/vllm.md, 'DiffusionGemma')."""
    _vllm_diffusion_gemma()
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU: vLLM runs diffusion models only on its V2 model runner, which needs Triton on a GPU")
    path = os.environ.get("DLLM_CONSTRAIN_DIFFUSION_GEMMA")
    if not path:
        pytest.skip("needs a DiffusionGemma checkpoint folder in DLLM_CONSTRAIN_DIFFUSION_GEMMA")
    os.environ["DLLM_CONSTRAIN_VLLM_DIFFUSION"] = "1"
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    llm = LLM(model=path, max_model_len=1024)
    params = SamplingParams(max_tokens=128, structured_outputs=StructuredOutputsParams(json=PERSON))
    [out] = llm.generate(["Create a record with name Ada; age 36."], params)
    jsonschema.validate(json.loads(out.outputs[0].text), PERSON)
