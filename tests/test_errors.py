"""Typed errors say what happened in words a user can act on."""
from __future__ import annotations

from dllm_constrain.errors import ConstraintTooLongError


def test_a_constraint_with_no_completion_is_not_reported_as_needing_a_billion_tokens() -> None:
    err = ConstraintTooLongError(ConstraintTooLongError.NO_OUTPUT, 32)
    assert "no output" in str(err) and "1073741824" not in str(err)
    assert err.min_tokens == ConstraintTooLongError.NO_OUTPUT and err.max_new_tokens == 32


def test_a_constraint_longer_than_the_canvas_names_both_lengths() -> None:
    assert "at least 40 tokens" in str(ConstraintTooLongError(40, 32))
    assert "max_new_tokens is 32" in str(ConstraintTooLongError(40, 32))


def test_no_output_is_the_automata_infinity() -> None:
    from dllm_constrain.constraints.bounds import INF

    assert ConstraintTooLongError.NO_OUTPUT == INF
