"""engine/models/llada.py through the loader's eyes: released config fields, shapes, padding invariance."""
from __future__ import annotations

import torch

from checkpoints import LLADA_RELEASED_FIELDS, LLADA_SPECIALS, byte_level_tokenizer, left_pad, llada_config, randomize
from dllm_constrain.engine.models.base import DiffusionLM
from dllm_constrain.engine.models.llada import LLaDAConfig, LLaDAModel

TOK = byte_level_tokenizer(LLADA_SPECIALS)


def tiny() -> LLaDAModel:
    return randomize(LLaDAModel(llada_config(TOK.token_to_id)), seed=0)


def test_released_config_fields_parse() -> None:
    raw = {**llada_config(TOK.token_to_id).to_dict(), **LLADA_RELEASED_FIELDS}
    assert LLaDAConfig.from_dict(raw).extra["block_group_size"] == 1


def test_implements_the_engine_contract() -> None:
    model = tiny()
    assert isinstance(model, DiffusionLM)
    assert model.special.mask_id == TOK.token_to_id("<|mdm_mask|>")


def test_output_shapes() -> None:
    model = tiny()
    ids = torch.randint(0, 300, (3, 6))
    with torch.no_grad():
        hidden = model.hidden_states(ids)
        assert hidden.shape == (3, 6, 32)
        assert model.logits(hidden).shape == (3, 6, model.vocab_size)


def test_left_padded_batch_matches_each_row_alone() -> None:
    model = tiny()
    rows = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17, 18, 19]]
    ids, mask = left_pad(rows, pad_id=model.special.pad_id)
    with torch.no_grad():
        batch = model.hidden_states(ids, key_padding_mask=mask)
        for b, row in enumerate(rows):
            alone = model.hidden_states(torch.tensor([row]))[0]
            torch.testing.assert_close(batch[b, -len(row):], alone, atol=1e-5, rtol=0)
