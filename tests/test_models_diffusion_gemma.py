"""engine/models/diffusion_gemma.py: the adapter runs transformers' DiffusionGemma exactly, row by row."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from checkpoints import build_diffusion_gemma, left_pad
from dllm_constrain.engine.loader import load_checkpoint
from dllm_constrain.engine.models.diffusion_gemma import DiffusionGemmaAdapter

CANVAS = 8


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> DiffusionGemmaAdapter:
    # sliding_window=4 < the longest prompt, so the sliding-layer cache is truncated in these tests
    folder = build_diffusion_gemma(tmp_path_factory.mktemp("dg") / "ckpt", canvas_length=CANVAS, sliding_window=4)
    return load_checkpoint(folder, dtype=torch.float32).model


def canvas_of(seed: int, vocab: int, n: int = CANVAS) -> torch.Tensor:
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


def test_loads_with_the_engine_attributes(model: DiffusionGemmaAdapter) -> None:
    assert model.family == "diffusion_gemma"
    assert model.canvas_length == CANVAS and model.vocab_size == 320
    assert (model.special.eos_id, model.special.pad_id, model.special.bos_id, model.special.mask_id) == (1, 0, 2, 4)


def test_denoise_step_shapes(model: DiffusionGemmaAdapter) -> None:
    prompt_ids, mask = left_pad([[5, 6, 7], [8, 9]], pad_id=0)
    with torch.no_grad():
        state = model.init_canvas(model.encode_prompt(prompt_ids, mask))
        out = model.denoise_step(state)
    assert out.hidden.shape == (2, CANVAS, 32)
    assert out.logits.shape == (2, CANVAS, 320) and out.logits.dtype == torch.float32


def test_denoise_step_equals_the_transformers_forward(model: DiffusionGemmaAdapter) -> None:
    """Same prompt, canvas and self-conditioning logits as DiffusionGemmaForBlockDiffusion.forward."""
    prompt = torch.tensor([[2, 10, 11, 12, 13, 14]])
    canvas = canvas_of(1, 320)
    sc = torch.randn(1, CANVAS, 320, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = model.hf(input_ids=prompt, decoder_input_ids=canvas, self_conditioning_logits=sc).logits
        state = model.init_canvas(model.encode_prompt(prompt))
        model.advance(state, canvas, torch.ones_like(canvas, dtype=torch.bool), self_conditioning_logits=sc)
        ours = model.denoise_step(state).logits
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=0)


def test_logits_are_soft_capped(model: DiffusionGemmaAdapter) -> None:
    hidden = torch.randn(3, 32) * 1e3
    assert model.logits(hidden).abs().max() <= model.softcap


def test_left_padded_batch_matches_each_row_alone(model: DiffusionGemmaAdapter) -> None:
    prompts = [[2, 10, 11, 12, 13, 14, 15, 16], [2, 20, 21], [2, 30, 31, 32, 33]]
    canvases = [canvas_of(i, 320) for i in range(3)]
    scs = [torch.randn(1, CANVAS, 320, generator=torch.Generator().manual_seed(10 + i)) for i in range(3)]
    ids, mask = left_pad(prompts, pad_id=0)
    with torch.no_grad():
        state = model.init_canvas(model.encode_prompt(ids, mask))
        model.advance(state, torch.cat(canvases), torch.ones(3, CANVAS, dtype=torch.bool),
                      self_conditioning_logits=torch.cat(scs))
        batch = model.denoise_step(state)
        for b, prompt in enumerate(prompts):
            alone_state = model.init_canvas(model.encode_prompt(torch.tensor([prompt])))
            model.advance(alone_state, canvases[b], torch.ones(1, CANVAS, dtype=torch.bool),
                          self_conditioning_logits=scs[b])
            alone = model.denoise_step(alone_state)
            torch.testing.assert_close(batch.hidden[b], alone.hidden[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(batch.logits[b], alone.logits[0], atol=1e-5, rtol=0)


def test_extend_prompt_equals_encoding_the_concatenation(model: DiffusionGemmaAdapter) -> None:
    """Block diffusion appends a finished canvas to the cache; that must equal encoding it with the prompt."""
    first, finished = [2, 10, 11, 12], [40, 41, 42, 43, 44]
    canvas = canvas_of(3, 320)
    with torch.no_grad():
        whole = model.init_canvas(model.encode_prompt(torch.tensor([first + finished])))
        extended_prompt = model.encode_prompt(torch.tensor([first]))
        model.extend_prompt(extended_prompt, torch.tensor([finished]))
        extended = model.init_canvas(extended_prompt)
        for state in (whole, extended):
            model.advance(state, canvas, torch.ones_like(canvas, dtype=torch.bool), self_conditioning_logits=None)
        torch.testing.assert_close(model.denoise_step(extended).logits, model.denoise_step(whole).logits,
                                   atol=1e-5, rtol=0)


def test_a_fresh_canvas_is_all_open_noise_without_self_conditioning(model: DiffusionGemmaAdapter) -> None:
    with torch.no_grad():
        state = model.init_canvas(model.encode_prompt(torch.tensor([[2, 3, 5]])), canvas_length=6,
                                  generator=torch.Generator().manual_seed(0))
    assert state.canvas.shape == (1, 6) and not state.accepted.any()
    assert state.self_conditioning_logits is None and state.position_ids.tolist() == [[3, 4, 5, 6, 7, 8]]


def test_advance_keeps_accepted_tokens_and_renoises_the_rest(model: DiffusionGemmaAdapter) -> None:
    with torch.no_grad():
        state = model.init_canvas(model.encode_prompt(torch.tensor([[2, 3, 5]])))
    tokens = torch.full((1, CANVAS), 7)
    accepted = torch.tensor([[True, False] * (CANVAS // 2)])
    sc = torch.zeros(1, CANVAS, 320)
    model.advance(state, tokens, accepted, self_conditioning_logits=sc, generator=torch.Generator().manual_seed(0))
    assert (state.canvas[accepted] == 7).all()
    assert (state.canvas[~accepted] != 7).any()  # fresh uniform noise (7 itself has probability 1/320)
    assert torch.equal(state.accepted, accepted) and state.self_conditioning_logits is sc and state.step == 1


def test_advance_reads_mask_ids_as_open_positions(model: DiffusionGemmaAdapter) -> None:
    """An engine canvas marks open positions with mask_id; the model must never see that marker."""
    mask_id = model.special.mask_id
    with torch.no_grad():
        state = model.init_canvas(model.encode_prompt(torch.tensor([[2, 3, 5]])))
    engine_canvas = torch.tensor([[9, mask_id, 9, mask_id, mask_id, 9, 9, mask_id]])
    for seed in range(5):
        model.advance(state, engine_canvas, self_conditioning_logits=None, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(state.accepted, engine_canvas != mask_id)
        assert (state.canvas[state.accepted] == 9).all()


def test_one_shot_hidden_states_match_the_cached_path(model: DiffusionGemmaAdapter) -> None:
    """The DiffusionLM contract (prompt + canvas in one tensor) runs the same computation as denoise_step."""
    prompts = [[2, 10, 11, 12, 13, 14], [2, 20, 21]]
    canvas = torch.cat([canvas_of(5, 320), canvas_of(6, 320)])
    ids, mask = left_pad(prompts, pad_id=0)
    full = torch.cat([ids, canvas], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(canvas, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        one_shot = model.hidden_states(full, key_padding_mask=full_mask, canvas_length=CANVAS)
        state = model.init_canvas(model.encode_prompt(ids, mask))
        model.advance(state, canvas, torch.ones_like(canvas, dtype=torch.bool), self_conditioning_logits=None)
        cached = model.denoise_step(state).hidden
    assert one_shot.shape == (2, ids.shape[1] + CANVAS, 32)
    torch.testing.assert_close(one_shot[:, -CANVAS:], cached, atol=1e-5, rtol=0)


def test_one_shot_contract_refuses_a_canvas_without_prompt(model: DiffusionGemmaAdapter) -> None:
    with pytest.raises(ValueError, match="prompt"):
        model.hidden_states(torch.tensor([[1, 2, 3]]), canvas_length=3)


def test_checkpoint_folder_layout_is_transformers(model: DiffusionGemmaAdapter, tmp_path: Path) -> None:
    """save_pretrained names (encoder/decoder, tied head stored once) are what the loader reads back."""
    from dllm_constrain.engine.loader import save_checkpoint
    from checkpoints import sentencepiece_style_tokenizer

    save_checkpoint(model, sentencepiece_style_tokenizer(), tmp_path)
    reloaded = load_checkpoint(tmp_path, dtype=torch.float32).model
    hidden = torch.randn(2, 32)
    torch.testing.assert_close(reloaded.logits(hidden), model.logits(hidden))
