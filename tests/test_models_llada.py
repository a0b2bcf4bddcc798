"""engine/models/llada.py through the loader's eyes: released config fields, shapes, padding invariance."""
from __future__ import annotations

import pytest
import torch

from checkpoints import LLADA_RELEASED_FIELDS, LLADA_SPECIALS, byte_level_tokenizer, left_pad, llada_config, randomize
from dllm_constrain.engine.models.base import DiffusionLM
from dllm_constrain.engine.models.llada import LLaDAConfig, LLaDAModel, row_neighbor_ids
from dllm_constrain.errors import CheckpointError

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


def test_a_wider_token_shift_mixes_in_the_second_and_third_left_neighbours() -> None:
    """token_shift_left=3: changing the token two or three places to the left changes a position's input; the
    token four places left does not (attention aside, the embedding alone is compared)."""
    model = randomize(LLaDAModel(llada_config(TOK.token_to_id, input_token_shift=True, token_shift_left=3)), seed=0)
    assert model.neighbor_offsets == (-1, 1, -2, -3)

    def embedded(ids: list[int]) -> torch.Tensor:
        t = torch.tensor([ids])
        with torch.no_grad():
            return model.embed(t, row_neighbor_ids(t, None, model.neighbor_offsets))[0, 5]

    base = [10, 11, 12, 13, 14, 15, 16]
    for offset, changes in ((2, True), (3, True), (4, False)):
        other = list(base)
        other[5 - offset] = 40
        assert (not torch.equal(embedded(other), embedded(base))) == changes, offset


def test_a_token_shift_window_below_one_is_refused() -> None:
    raw = {**llada_config(TOK.token_to_id).to_dict(), "input_token_shift": True, "token_shift_left": 0}
    with pytest.raises(CheckpointError, match="token_shift_left"):
        LLaDAConfig.from_dict(raw)
