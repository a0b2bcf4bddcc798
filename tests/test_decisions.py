"""Typed decisions (LLM.decide): every answer is exactly one of its question's labels, one canvas per question or
all questions jointly on one pinned canvas, with per-label probabilities that sum to 1 and mean what
dllm_constrain.decisions says (the slot's product of marginals from one forward, renormalised over the labels)."""
from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_constrain.decisions import MAX_JOINT_QUESTIONS, Question, question_from_dict, regex_literal
from dllm_constrain.engine.state import POLICY_NAMES
from dllm_constrain.errors import InvalidRequestError
from llm_fixtures import bundled, tiny  # noqa: F401 - module-scoped fixtures, used by name

WORDS = ["yes", "no", "red", "green", "blue", "New York", "a", "ab", "abc", "7"]


questions_st = st.lists(
    st.one_of(
        st.builds(lambda i: Question("predicate", i), st.sampled_from(["red?", "big?"])),
        st.builds(lambda opts: Question("choice", "which?", options=tuple(opts)),
                  st.lists(st.sampled_from(WORDS), min_size=2, max_size=3, unique=True)),
        st.builds(lambda opts: Question("score", "how?", options=tuple(opts)),
                  st.lists(st.sampled_from(WORDS), min_size=2, max_size=3, unique=True)),
    ), min_size=1, max_size=3)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(qs=questions_st, joint=st.booleans(), policy=st.sampled_from(POLICY_NAMES), seed=st.integers(0, 5))
def test_every_answer_is_one_of_its_labels_with_probabilities_summing_to_one(tiny, qs, joint, policy, seed) -> None:
    result = tiny.decide("x", qs, joint=joint, policy=policy, seed=seed)
    assert len(result.decisions) == len(qs)
    for q, d in zip(qs, result.decisions):
        assert d.label in q.labels
        assert d.value == q.value_of(q.labels.index(d.label))
        assert len(d.probabilities) == len(q.labels)
        assert all(0.0 <= p <= 1.0 for p in d.probabilities)
        assert math.isclose(sum(d.probabilities), 1.0, abs_tol=1e-9)
        assert 0.0 <= d.confidence <= d.probabilities[q.labels.index(d.label)] + 1e-12


def test_joint_questions_share_one_canvas_with_their_text_pinned(tiny) -> None:
    qs = [Question("predicate", "Is it red?"), Question("choice", "Which city?", options=("Paris", "New York"))]
    result = tiny.decide("input", qs, joint=True, seed=0)
    [canvas] = result.canvases
    assert re.fullmatch(r"Q1: Is it red\?\nA: (yes|no) *\nQ2: Which city\?\nA: (Paris|New York) *\n", canvas)
    answers = re.findall(r"A: ([^\n]*?) *\n", canvas)
    assert answers == [d.label for d in result.decisions]


def test_one_request_per_question_without_joint(tiny) -> None:
    qs = [Question("predicate", "Is it red?"), Question("score", "How big?", options=("small", "large"))]
    result = tiny.decide("input", qs, seed=0)
    assert [c for c in result.canvases] == [d.label for d in result.decisions]
    assert result.nfe >= 2  # one canvas each: at least one forward per question


def test_probabilities_are_the_slots_product_of_marginals_renormalised_over_labels(tiny) -> None:
    q = Question("choice", "Which one?", options=("ab", "b", "abc"))
    [d] = tiny.decide("input", [q], seed=0).decisions
    # the documented reading, computed here by hand: the slot is decided at the first forward (prompt + the
    # all-open slot of 3 positions); each label's tokens then EOS padding, the product of the model's
    # probabilities there, renormalised
    from dllm_constrain.decisions import _prompt

    prompt = tiny.encode(tiny.format(_prompt("input", [q], joint=False)))
    sp = tiny.model.special
    ids = torch.tensor([prompt + [sp.mask_id] * 3])
    with torch.inference_mode():
        logp = torch.log_softmax(tiny.model.logits(tiny.model.hidden_states(ids))[0, len(prompt):].float(), -1)
    fills = [tiny.encode_text(x) + [sp.eos_id] * (3 - len(tiny.encode_text(x))) for x in q.labels]
    scores = [math.exp(sum(float(logp[j, t]) for j, t in enumerate(f))) for f in fills]
    expected = [s / sum(scores) for s in scores]
    assert d.probabilities == pytest.approx(expected, rel=1e-5)
    assert d.confidence == pytest.approx(scores[q.labels.index(d.label)], rel=1e-5)


def test_values_follow_the_question_type(bundled) -> None:
    qs = [question_from_dict({"type": "predicate", "instructions": "Is Ada in London?"}),
          question_from_dict({"type": "choice", "instructions": "Is the record complete?",
                              "choices": [{"value": True}, {"value": False}, {"value": "unsure"}]}),
          question_from_dict({"type": "score", "instructions": "How old is Ada?",
                              "levels": [{"label": "young"}, {"label": "middle aged"}, {"label": "old"}]})]
    for joint in (False, True):
        pred, choice, score = bundled.decide("Ada Lovelace lives in London; age 36.", qs, joint=joint,
                                             seed=0).decisions
        assert pred.value is (pred.label == "yes")
        assert choice.value in (True, False, "unsure") and choice.label in ("true", "false", "unsure")
        assert score.value in (0, 1, 2) and score.label == qs[2].options[score.value]
        assert 0.0 <= score.expected_score <= 2.0


@pytest.mark.parametrize("question, match", [
    ({"type": "choice", "instructions": "x", "choices": [{"value": "a"}]}, "2-255 options"),
    ({"type": "score", "instructions": "x", "levels": [{"label": str(i)} for i in range(11)]}, "2-10 options"),
    ({"type": "choice", "instructions": "x", "choices": [{"value": "a"}, {"value": "a"}]}, "distinct"),
    ({"type": "choice", "instructions": "x", "choices": [{"value": " a"}, {"value": "b"}]}, "whitespace"),
    ({"type": "vote", "instructions": "x"}, "question type"),
])
def test_a_bad_question_is_a_typed_error(question, match) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        question_from_dict(question)


def test_call_limits_are_typed_errors(tiny) -> None:
    with pytest.raises(InvalidRequestError, match="joint: at most 64"):
        tiny.decide("x", [Question("predicate", "q")] * (MAX_JOINT_QUESTIONS + 1), joint=True)
    with pytest.raises(InvalidRequestError, match="1-200"):
        tiny.decide("x", [])
    with pytest.raises(InvalidRequestError, match="regex"):
        tiny.decide("x", [Question("predicate", "q")], regex="a")


@settings(max_examples=50, deadline=None)
@given(text=st.text(max_size=20))
def test_a_regex_literal_matches_exactly_its_text(text) -> None:
    assert re.fullmatch(regex_literal(text), text)
