"""A canvas state is made for one canvas length; a canvas of another length, or a non-positive length, is a
malformed request (`InvalidRequestError`, still a ValueError for callers that catch that), for both the
regular-language state and the grammar state."""
from __future__ import annotations

import pytest

from conftest import build_tiny_tokenizer
from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.constraints.cfg import GrammarCanvasState
from dllm_constrain.constraints.compiler import CompileCache
from dllm_constrain.errors import InvalidRequestError


@pytest.fixture(scope="module")
def compiler() -> ConstraintCompiler:
    info = TokenizerInfo.from_tokenizer(build_tiny_tokenizer(), eos_id=1, vocab_size=260)
    return ConstraintCompiler(info, cache=CompileCache(4))


@pytest.mark.parametrize("kind", ["regex", "grammar"])
def test_a_canvas_of_another_length_is_a_typed_error(compiler, kind) -> None:
    compiled = (compiler.compile(regex="[0-9]+") if kind == "regex"
                else compiler.compile(grammar='start: NUM\nNUM: /[0-9]+/\n'))
    state = compiled.new_canvas_state(4)
    canvas = [compiled.mask_id] * 6
    with pytest.raises(InvalidRequestError, match="6 positions.*made for a canvas of 4 positions"):
        state.allowed_tokens(canvas, [0])
    assert issubclass(InvalidRequestError, ValueError)


def test_a_grammar_state_for_no_positions_is_a_typed_error(compiler) -> None:
    compiled = compiler.compile(grammar='start: "a"\n')
    with pytest.raises(InvalidRequestError, match="positive integer, got 0"):
        GrammarCanvasState(compiled, 0)


def test_a_length_the_fit_check_left_undecided_is_refused_as_too_long_by_the_first_mask(compiler, monkeypatch):
    # the fit check of new_canvas_state decides by work (what the start state tells, then min_tokens within
    # MIN_TOKENS_STATES states) and lets an undecided length in; the first mask call, whose frontier row is exact,
    # proves that nothing fits
    from dllm_constrain.errors import ConstraintTooLongError

    compiled = compiler.compile(regex="(ab){12}")  # 24 bytes; the byte-level tokenizer spells ab in no fewer than 12
    compiled.ta.single_byte_complete = False  # no shortcut from the byte distance
    monkeypatch.setattr(compiled, "fits", lambda n, timeout_s=None: True)  # left undecided: let in
    state = compiled.new_canvas_state(6)
    with pytest.raises(ConstraintTooLongError, match="at least 7 tokens.*max_new_tokens is 6"):
        state.allowed_tokens([compiled.mask_id] * 6, [0, 3])


def test_a_length_the_fewest_token_search_refutes_is_refused_when_the_state_is_made(compiler) -> None:
    from dllm_constrain.errors import ConstraintTooLongError

    compiled = compiler.compile(regex="(ab){12}")
    compiled.ta.single_byte_complete = False
    with pytest.raises(ConstraintTooLongError, match="max_new_tokens is 6"):
        compiled.new_canvas_state(6)


def test_a_request_whose_shortest_text_fits_by_its_bytes_is_admitted_without_the_fewest_token_search(
        compiler, monkeypatch) -> None:
    """The tiny tokenizer spells every byte with a token of its own, so a shortest text of 5 bytes fits a canvas of
    8 positions: the breadth-first search for the fewest tokens (milliseconds per state on a real vocabulary) is not
    run to admit it."""
    from dllm_constrain.constraints.compiler import CompiledConstraint, new_request_state

    compiled = compiler.compile(regex="[0-9]{5}")

    def no_search(self, timeout_s=None):
        raise AssertionError("min_tokens searched to admit a request that fits")

    monkeypatch.setattr(CompiledConstraint, "min_tokens", no_search)
    assert new_request_state(compiled, 8).n == 8


def test_a_request_whose_shortest_text_does_not_fit_is_refused_with_its_fewest_tokens(compiler) -> None:
    from dllm_constrain.constraints.compiler import new_request_state
    from dllm_constrain.errors import ConstraintTooLongError

    with pytest.raises(ConstraintTooLongError) as e:
        new_request_state(compiler.compile(regex="[0-9]{12}"), 8)
    assert e.value.min_tokens == 12 and e.value.max_new_tokens == 8


def test_a_request_too_long_by_its_bytes_is_refused_at_admission_even_when_the_fit_check_cannot_decide(
        compiler, monkeypatch) -> None:
    """The fewest-token search decides what the time-bounded fit check may leave undecided: the request is refused
    before any forward, not at its first mask call."""
    from dllm_constrain.constraints.compiler import CompiledConstraint, new_request_state
    from dllm_constrain.errors import ConstraintTooLongError

    monkeypatch.setattr(CompiledConstraint, "fits", lambda self, n, timeout_s=None: True)  # undecided: fits
    with pytest.raises(ConstraintTooLongError):
        new_request_state(compiler.compile(regex="[0-9]{12}"), 8)
