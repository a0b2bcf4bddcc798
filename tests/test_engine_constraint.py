"""The loop under a CanvasConstraint: masks before confidence, joint verification, forced tokens, backtracking."""
from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from engine_fakes import EOS, MASK, DigitsConstraint, ScriptedModel

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.state import POLICY_NAMES, Request, SamplingParams

Z = 15  # an ordinary token that is not a digit


def _run(script, constraint, events=None, **params):
    model = ScriptedModel(script, prompt_len=1)
    (res,) = LLMEngine(model).generate([Request([0], SamplingParams(**params), constraint)],
                                       progress=events.append if events is not None else None)
    return res, model


def test_masks_are_applied_before_confidence_so_policies_rank_constrained_probabilities() -> None:
    """Position 0 is 90% sure of a non-digit, but among digits it hesitates (0.5); position 1 is 60% sure
    of a digit, ~90% among digits. Unconstrained ranking would commit position 0 first; the engine
    commits position 1 first, and never the disallowed token."""
    script = [{Z: 0.9, 4: 0.05, 5: 0.05}, {6: 0.6, Z: 0.3}, {EOS: 0.7}, {EOS: 0.7}]
    events = []
    res, _ = _run(script, DigitsConstraint(), events, max_new_tokens=4, block_length=4, steps=4)
    first = events[0].snapshots[0]
    assert first.canvas == [MASK, 6, MASK, MASK]
    assert res.canvas_ids == [4, 6, EOS, EOS]
    assert Z not in res.canvas_ids


def test_jointly_conflicting_commits_are_verified_and_the_loser_stays_open() -> None:
    """EOS at 1 and a digit at 2 are each allowed alone but not together: the more confident digit wins,
    the EOS proposal is remasked (counted) and position 1 later gets a digit."""
    script = [{4: 0.99}, {EOS: 0.97}, {5: 0.98}, {EOS: 0.6}]
    constraint = DigitsConstraint()
    res, _ = _run(script, constraint, max_new_tokens=4, block_length=4, policy="threshold", threshold=0.9)
    assert res.remasks == 1
    assert res.canvas_ids[0] == 4 and res.canvas_ids[2] == 5
    assert res.canvas_ids[1] != EOS
    assert constraint.accepts(res.token_ids)


class KeepOnlyBest(DigitsConstraint):
    """Joint verification that keeps a single proposal per step: the engine must obey it."""

    def select_commits(self, canvas, proposals):
        return super().select_commits(canvas, proposals)[:1]


def test_the_engine_commits_exactly_what_select_commits_returns() -> None:
    script = [{4: 0.99}, {5: 0.99}, {6: 0.99}, {7: 0.99}]
    res, _ = _run(script, KeepOnlyBest(), max_new_tokens=4, block_length=4, policy="threshold", threshold=0.5)
    assert res.nfe == 4
    assert res.remasks == 3 + 2 + 1
    assert res.canvas_ids == [4, 5, 6, 7]


def test_forced_tokens_are_committed_without_model_confidence() -> None:
    """With a single digit '7', position 0 is forced (committed after the first forward, which reads the canvas all
    open); once EOS lands at 2 the EOS tail is forced too. Only position 1 and the EOS need the model."""
    seven = 11
    script = [{Z: 0.99}, {seven: 0.9}, {EOS: 0.99}, {Z: 0.9}, {Z: 0.9}, {Z: 0.9}]
    res, model = _run(script, DigitsConstraint(digits=[seven]), max_new_tokens=6, block_length=6, steps=6)
    assert res.canvas_ids == [seven, seven, EOS, EOS, EOS, EOS]
    assert res.forced_tokens == 4  # position 0, then 3..5 (position 1 could still be 7 or EOS)
    assert res.nfe == model.forwards == 2


def test_a_fully_forced_canvas_needs_no_forward() -> None:
    res, model = _run([{4: 0.9}], DigitsConstraint(digits=[4]), max_new_tokens=1, block_length=1)
    assert res.canvas_ids == [4]
    assert res.nfe == 0 and model.forwards == 0
    assert res.forced_tokens == 1 and res.forwards_saved == 1


class RejectsNineFirst(DigitsConstraint):
    """An approximate constraint: its masks allow digit token 13 at position 0, but the canvas is then not
    completable. The engine must undo that commit and never make it again."""

    def is_completable(self, canvas: Sequence[int]) -> bool:
        return canvas[0] != 13 and super().is_completable(canvas)


def test_a_commit_that_makes_the_canvas_uncompletable_is_undone_and_banned() -> None:
    script = [{13: 0.99}, {5: 0.9}, {EOS: 0.9}]
    res, _ = _run(script, RejectsNineFirst(), max_new_tokens=3, block_length=3, steps=3)
    assert res.backtracks == 1
    assert res.canvas_ids[0] not in (13, MASK, EOS)
    assert res.canvas_ids[1:] == [5, EOS]


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_produces_valid_output_under_a_constraint_on_a_random_model(
        tiny_llada, tiny_tokenizer, policy: str) -> None:
    """A random LLaDA never wants digits; the constraint still gets a valid digit string from each policy."""
    digits = [tiny_tokenizer.token_to_id(str(d)) for d in range(10)]
    constraint = DigitsConstraint(digits=digits, vocab_size=260)
    req = Request(tiny_tokenizer.encode("number:").ids,
                  SamplingParams(max_new_tokens=8, block_length=4, policy=policy, temperature=0.8, seed=3),
                  constraint)
    (res,) = LLMEngine(tiny_llada, tiny_tokenizer).generate([req])
    assert constraint.accepts(res.token_ids), res.canvas_ids
    assert res.text.isdigit()
    # serially, one mask call per forward (mask workers add a one-position probe first: StructuredOutputManager.prepare)
    serial = DigitsConstraint(digits=digits, vocab_size=260)
    (res,) = LLMEngine(tiny_llada, tiny_tokenizer, config=EngineConfig(mask_workers=0)).generate(
        [Request(req.prompt_ids, req.params, serial)])
    assert serial.accepts(res.token_ids) and serial.calls["allowed_tokens"] == res.nfe


def _random_script(seed: int, n: int) -> list[dict[int, float]]:
    """Per-position distributions over a few random tokens (digits, EOS, non-digits), random confidences."""
    gen = torch.Generator().manual_seed(seed)
    script = []
    for _ in range(n):
        toks = torch.randperm(12, generator=gen)[:3] + 1  # ids 1..12: EOS, specials 2/3 excluded below
        probs = torch.rand(3, generator=gen)
        probs = 0.95 * probs / probs.sum()
        script.append({int(t): float(p) for t, p in zip(toks, probs) if int(t) not in (2, 3)})
    return script


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 12), block=st.integers(1, 12),
       policy=st.sampled_from(POLICY_NAMES), temperature=st.sampled_from([0.0, 1.0]))
def test_any_script_any_policy_gives_valid_output_within_the_step_bound(seed, n, block, policy, temperature) -> None:
    """Property: whatever the model wants, the constrained canvas ends valid and the loop terminates."""
    constraint = DigitsConstraint()
    res, model = _run(_random_script(seed, n), constraint, max_new_tokens=n, block_length=block, policy=policy,
                      temperature=temperature, seed=seed)
    assert constraint.accepts(res.token_ids), res.canvas_ids
    assert all(t == EOS for t in res.canvas_ids[len(res.token_ids):])
    assert res.nfe == model.forwards <= n
