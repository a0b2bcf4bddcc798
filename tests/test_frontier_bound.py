"""The left frontier's search under its work allowance (canvas.FRONTIER_WORK; docs/constraints.md, "Time
bounds"): it visits states in an order that does not depend on the automaton's state numbering or transition cache, so
a request gets the same frontier rows with a cold or a warm automaton and under any clock; what the allowance leaves
undecided is left out (never a token outside the constraint), and a row it would leave empty is decided exactly."""
from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from constraint_support import tiny_info
from test_determinism import jumping_clock

from dllm_constrain.constraints import ConstraintCompiler

TOKENS = [b"a", b"b", b"ab", b"ba", b"abab", b"c", b"ca"]
# committed tokens far right constrain the open positions before them: a search from the frontier has to go through
# every open position to refute a successor, which is what the allowance bounds
PATTERN = r"(ab|ba|c)*a(b|c){0,3}(abab|ca)*c?"
EOS, MASK = len(TOKENS), len(TOKENS) + 1


def compile_fresh():
    return ConstraintCompiler(tiny_info(TOKENS), cache=False).compile_regex(PATTERN)


def tight(cc, n: int, question: int = 1, call: int = 2):
    """A canvas state whose every mask call is cut by the budget (expand_budget=0: the frontier is searched) and whose
    frontier search may expand `question` states per question and `call` per call."""
    st_ = cc.new_canvas_state(n, expand_budget=0, timeout_s=None)
    st_.question_states, st_.frontier_call_states = question, call
    return st_


def frontier_walk(cc, seed: int, n: int = 12, steps: int = 8) -> tuple[list[bytes], int]:
    """A seeded walk committing tokens of the frontier row at random open positions, masks of every open position
    asked at each step; (the masks' bytes step by step, the frontier rows the allowance left undecided)."""
    rng = random.Random(seed)
    st_ = tight(cc, n)
    canvas = [MASK] * n
    for p in rng.sample(range(n), 3):  # committed tokens right of the frontier, kept only if the canvas stays valid
        kept = st_.select_commits(canvas, [(p, rng.randrange(len(TOKENS)), 1.0)])
        for q, t in kept:
            canvas[q] = t
    out = []
    for _ in range(steps):
        open_pos = [i for i, t in enumerate(canvas) if t == MASK]
        if not open_pos:
            break
        rows = st_.allowed_tokens(canvas, open_pos)
        out.append(rows.numpy().tobytes())
        toks = rows[0].nonzero().flatten().tolist()
        assert toks, "the frontier row is never empty on a completable canvas"
        for p, t in st_.select_commits(canvas, [(open_pos[0], rng.choice(toks), 1.0)]):
            canvas[p] = t
    return out, st_.frontier_undecided


def test_bounded_frontier_rows_are_the_same_cold_warm_and_under_a_jumping_clock() -> None:
    seeds = range(6)
    reference = {s: frontier_walk(compile_fresh(), s) for s in seeds}
    assert sum(u for _, u in reference.values()) > 0  # the allowance did leave questions undecided
    warm = compile_fresh()
    for s in range(20, 26):  # other requests discover (and number) the automaton's states first
        frontier_walk(warm, s)
        warm.new_canvas_state(12, expand_budget=None, timeout_s=None).allowed_tokens([MASK] * 12, list(range(12)))
    assert {s: frontier_walk(warm, s) for s in seeds} == reference
    with jumping_clock():
        assert {s: frontier_walk(compile_fresh(), s) for s in seeds} == reference


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4), st.integers(1, 8))
def test_a_bounded_frontier_row_is_within_the_exact_one_and_empty_only_when_it_is(seed: int, question: int,
                                                                                 call: int) -> None:
    rng = random.Random(seed)
    cc = compile_fresh()
    n = rng.randrange(4, 12)
    canvas = [MASK] * n
    exact = cc.new_canvas_state(n, expand_budget=None, timeout_s=None)
    for p in rng.sample(range(1, n), rng.randrange(1, n // 2 + 1)):
        canvas[p] = rng.randrange(len(TOKENS) + 1)
        if not exact.is_completable(canvas):
            canvas[p] = MASK
    f = canvas.index(MASK)
    want = exact.allowed_tokens(canvas, [f])[0]
    got = tight(cc, n, question, call).allowed_tokens(canvas, [f])[0]
    assert not (got & ~want).any()
    assert got.any() == want.any()


def repeated_rows(cc, canvas: list[int], times: int) -> list[list[bool]]:
    st_ = tight(cc, len(canvas), question=1, call=1)
    return [st_.allowed_tokens(canvas, [canvas.index(MASK)])[0].tolist() for _ in range(times)]


def test_asked_again_on_the_same_canvas_the_frontier_row_grows_towards_the_exact_one_the_same_way_cold_or_warm() -> None:
    rng = random.Random(5)
    cc = compile_fresh()
    grew = False
    for _ in range(30):
        n = rng.randrange(6, 12)
        exact_state = cc.new_canvas_state(n, expand_budget=None, timeout_s=None)
        canvas = [MASK] * n
        for p in rng.sample(range(1, n), n // 2):
            canvas[p] = rng.randrange(len(TOKENS) + 1)
            if not exact_state.is_completable(canvas):
                canvas[p] = MASK
        exact = exact_state.allowed_tokens(canvas, [canvas.index(MASK)])[0].tolist()
        rows = repeated_rows(compile_fresh(), canvas, 6)
        for a, b in zip(rows, rows[1:] + [exact]):
            assert all(y or not x for x, y in zip(a, b))  # each row within the next, the last within the exact one
        grew |= rows[0] != rows[-1]
        assert repeated_rows(cc, canvas, 6) == rows  # cc: warm, explored by the canvases before
    assert grew  # some canvas needed the doubled allowance
