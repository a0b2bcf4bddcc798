"""engine/models/base.py protocols: what each family and test double is, as the engine sees it (isinstance)."""
from __future__ import annotations

import torch
from checkpoints import DREAM_SPECIALS, byte_level_tokenizer, dream_config
from engine_fakes import ScriptedModel

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.model_runner import ModelRunner, supports_gil_free_forward, supports_packed_forward
from dllm_constrain.engine.models.base import (
    BlockDiffusionLM,
    DiffusionLM,
    LinearHeadLM,
    NeighborTokensLM,
    RenoisingLM,
    RequestStateLM,
    ScriptableLM,
    SpanForwardLM,
)
from dllm_constrain.engine.models.dream import DreamModel

ALL = (DiffusionLM, LinearHeadLM, SpanForwardLM, NeighborTokensLM, ScriptableLM, RequestStateLM, RenoisingLM,
       BlockDiffusionLM)


def protocols(model) -> set[str]:
    return {p.__name__ for p in ALL if isinstance(model, p)}


def test_llada_is_a_packed_scriptable_model_with_a_linear_head_and_neighbour_ids(tiny_llada) -> None:
    assert protocols(tiny_llada) == {"DiffusionLM", "LinearHeadLM", "SpanForwardLM", "NeighborTokensLM",
                                     "ScriptableLM"}
    assert supports_packed_forward(tiny_llada) and supports_gil_free_forward(tiny_llada)


def test_dream_has_a_span_forward_without_neighbour_ids() -> None:
    dream = DreamModel(dream_config(byte_level_tokenizer(DREAM_SPECIALS).token_to_id, num_hidden_layers=1))
    assert protocols(dream) == {"DiffusionLM", "LinearHeadLM", "SpanForwardLM", "ScriptableLM"}
    assert dream.kv_query_shift == 1


def test_the_scripted_test_double_is_only_a_diffusion_lm() -> None:
    model = ScriptedModel([{}], prompt_len=2)
    assert protocols(model) == {"DiffusionLM"}
    assert not supports_packed_forward(model)


class StatefulSpanModel(ScriptedModel):
    """A double with a span forward AND per-request state: per-request state wins, so it never packs."""

    kv_query_shift = 0

    def hidden_states_cached(self, input_ids, position_ids, attend):
        raise AssertionError("a model with per-request state must not be packed")

    def init_request_state(self, state) -> None:
        state.extra = "seen"

    def hidden_states(self, input_ids, position_ids=None, key_padding_mask=None, *, request_states=None):
        assert request_states is not None and len(request_states) == input_ids.shape[0]
        return super().hidden_states(input_ids, position_ids, key_padding_mask)

    def renoise_tokens(self, state, positions):
        return [4] * len(positions)


def test_per_request_state_turns_packing_off_and_gets_the_states() -> None:
    from dllm_constrain.engine.state import RequestState, SamplingParams

    model = StatefulSpanModel([{}] * 4, prompt_len=2)
    assert {"SpanForwardLM", "RequestStateLM", "RenoisingLM"} <= protocols(model)
    runner = ModelRunner(model, pad_id=2, config=EngineConfig())
    assert not runner.packed
    state = RequestState(index=0, prompt_ids=[0, 5], params=SamplingParams(max_new_tokens=4, block_length=4),
                         canvas=torch.full((4,), 3), committed=torch.zeros(4, dtype=torch.bool), generator=None)
    (row,) = runner.forward_rows([state])
    assert row.hidden.shape[0] == 6 and row.offset == 2
