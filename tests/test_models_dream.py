"""engine/models/dream.py: released layout, config parsing, the shifted-prediction adapter, padding invariance."""
from __future__ import annotations

import pytest
import torch

from checkpoints import DREAM_RELEASED_FIELDS, DREAM_SPECIALS, byte_level_tokenizer, dream_config, left_pad, randomize
from dllm_constrain.engine.models.base import DiffusionLM
from dllm_constrain.engine.models.dream import DreamConfig, DreamModel
from dllm_constrain.errors import CheckpointError

TOK = byte_level_tokenizer(DREAM_SPECIALS)


def tiny(**overrides) -> DreamModel:
    return randomize(DreamModel(dream_config(TOK.token_to_id, **overrides)), seed=0)


def test_parameter_names_are_the_released_ones() -> None:
    names = set(tiny(num_hidden_layers=1).state_dict())
    assert names == {
        "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
        "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.o_proj.weight",
        *(f"model.layers.0.self_attn.{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")),
    }


def test_released_config_fields_parse() -> None:
    raw = {**dream_config(TOK.token_to_id).to_dict(), **DREAM_RELEASED_FIELDS}
    assert DreamConfig.from_dict(raw).extra["max_window_layers"] == 28


def test_unknown_config_field_is_named() -> None:
    raw = {**dream_config(TOK.token_to_id).to_dict(), "frobnicate": 1}
    with pytest.raises(CheckpointError, match="frobnicate"):
        DreamConfig.from_dict(raw)


def test_unimplemented_feature_value_is_named() -> None:
    raw = {**dream_config(TOK.token_to_id).to_dict(), "use_sliding_window": True}
    with pytest.raises(CheckpointError, match="use_sliding_window"):
        DreamConfig.from_dict(raw)


def test_missing_required_field_is_named() -> None:
    raw = dream_config(TOK.token_to_id).to_dict()
    del raw["mask_token_id"]
    with pytest.raises(CheckpointError, match="mask_token_id"):
        DreamConfig.from_dict(raw)


def test_config_round_trips_through_to_dict() -> None:
    cfg = dream_config(TOK.token_to_id)
    assert DreamConfig.from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()


def test_implements_the_engine_contract() -> None:
    model = tiny()
    assert isinstance(model, DiffusionLM)
    assert model.family == "dream" and model.special.mask_id == TOK.token_to_id("<|mask|>")


def test_output_shapes() -> None:
    model = tiny()
    ids = torch.randint(0, 300, (2, 7))
    with torch.no_grad():
        hidden = model.hidden_states(ids)
        assert hidden.shape == (2, 7, 32)
        assert model.logits(hidden).shape == (2, 7, model.vocab_size)
        assert model(ids).shape == (2, 7, model.vocab_size)


def test_hidden_state_i_is_the_raw_state_at_i_minus_1() -> None:
    """Dream predicts token i from the state at i-1; the adapter aligns states with the tokens they predict."""
    model = tiny()
    ids = torch.randint(0, 300, (2, 9))
    with torch.no_grad():
        raw = model.raw_hidden_states(ids)
        shifted = model.hidden_states(ids)
    assert torch.equal(shifted[:, 1:], raw[:, :-1])
    assert torch.equal(shifted[:, 0], raw[:, 0])


def test_left_padded_batch_matches_each_row_alone() -> None:
    model = tiny()
    rows = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17, 18, 19]]
    ids, mask = left_pad(rows, pad_id=model.special.pad_id)
    with torch.no_grad():
        batch = model.hidden_states(ids, key_padding_mask=mask)
        for b, row in enumerate(rows):
            alone = model.hidden_states(torch.tensor([row]))[0]
            # the first real token of a padded row is never a canvas position (its shifted state is a pad's)
            torch.testing.assert_close(batch[b, -len(row) + 1:], alone[1:], atol=1e-5, rtol=0)


def test_tied_embeddings_share_the_lm_head() -> None:
    model = tiny(tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
