"""EOS on a fixed canvas: the tail is EOS padding, text stops at the first EOS, finished answers stop early."""
from __future__ import annotations

from engine_fakes import EOS, MASK, ScriptedModel

from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.state import Request, SamplingParams

A, B, C, Z = 10, 11, 12, 15


def _generate(script, events=None, **params):
    model = ScriptedModel(script, prompt_len=2)
    engine = LLMEngine(model)
    (res,) = engine.generate([Request([0, 4], SamplingParams(**params))], progress=events.append if events is not None else None)
    return res, model


def test_an_answer_that_ends_in_the_first_block_skips_the_later_blocks() -> None:
    """'abc' + EOS fills block 0; blocks 1-3 are EOS padding and cost no forward (4 NFE instead of 16)."""
    script = [{A: 0.9}, {B: 0.9}, {C: 0.9}, {EOS: 0.95}] + [{EOS: 0.99}] * 12
    res, model = _generate(script, max_new_tokens=16, block_length=4, steps=16)
    assert res.token_ids == [A, B, C]
    assert res.canvas_ids == [A, B, C] + [EOS] * 13
    assert res.finish_reason == "eos"
    assert res.nfe == 4 and model.forwards == 4


def test_an_eos_with_open_positions_on_its_left_does_not_end_the_answer() -> None:
    """The confident EOS at position 3 is committed first; generation continues until 0..2 are filled."""
    script = [{A: 0.9}, {B: 0.9}, {C: 0.9}, {EOS: 0.95}] + [{EOS: 0.99}] * 4
    events = []
    res, _ = _generate(script, events, max_new_tokens=8, block_length=4, steps=8)
    first = events[0].snapshots[0]
    assert first.canvas[:4] == [MASK, MASK, MASK, EOS] and not first.done
    assert res.token_ids == [A, B, C]


def test_output_stops_at_the_first_eos_and_everything_after_it_becomes_eos() -> None:
    """A token committed right of the first EOS (Z at position 2) is padding, not answer."""
    script = [{A: 0.9}, {EOS: 0.95}, {Z: 0.99}, {A: 0.5}] + [{B: 0.9}] * 4
    res, _ = _generate(script, max_new_tokens=8, block_length=4, steps=8)
    assert res.token_ids == [A]
    assert res.canvas_ids == [A] + [EOS] * 7
    assert res.finish_reason == "eos"


def test_a_canvas_filled_without_eos_finishes_for_length() -> None:
    res, _ = _generate([{A: 0.9}] * 6, max_new_tokens=6, block_length=3)
    assert res.token_ids == [A] * 6
    assert res.finish_reason == "length"


def test_tokens_per_forward_counts_the_answer_and_its_eos_not_the_padding() -> None:
    """3 answer tokens + 1 EOS in 4 forwards: 1.0 token per forward, whatever the canvas length."""
    script = [{A: 0.9}, {B: 0.9}, {C: 0.9}, {EOS: 0.95}] + [{EOS: 0.99}] * 28
    res, _ = _generate(script, max_new_tokens=32, block_length=4, steps=32)
    assert res.nfe == 4
    assert res.tokens_per_forward == 1.0


def test_a_finished_request_leaves_the_batch_while_others_continue() -> None:
    """Same script, two block lengths: with blocks of 2 the answer ends after 2 forwards; with one block of 8
    the confident EOS padding is committed first and it takes 8. The batch runs 8 forwards, not 10."""
    model = ScriptedModel([{A: 0.9}] + [{EOS: 0.99}] * 7, prompt_len=2)
    reqs = [Request([0, 4], SamplingParams(max_new_tokens=8, block_length=2, steps=8)),
            Request([0, 4], SamplingParams(max_new_tokens=8, block_length=8, steps=8))]
    res = LLMEngine(model).generate(reqs)
    assert [r.token_ids for r in res] == [[A], [A]]
    assert [r.nfe for r in res] == [2, 8]
    assert model.forwards == 8
