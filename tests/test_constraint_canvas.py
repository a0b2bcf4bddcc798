"""Per-position canvas masks for regular constraints: exactness against brute force on tiny vocabularies,
joint commits, forced tokens, lengths, and random decoding that always ends valid."""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dllm_constrain.constraints import CanvasConstraint, ConstraintCompiler
from dllm_constrain.errors import ConstraintTooLongError, InvalidRegexError

from constraint_support import (brute_force_allowed, brute_force_completable, canvas_text, regex_accepts,
                                     small_regexes, tiny_info, tiny_vocabularies)


@st.composite
def canvases(draw, n_tokens: int, eos: int, mask: int, max_len: int = 5, max_open: int = 4):
    n = draw(st.integers(1, max_len))
    cells = []
    for _ in range(n):
        cells.append(draw(st.one_of(st.just(mask), st.integers(0, n_tokens - 1), st.just(eos))))
    opens = [i for i, c in enumerate(cells) if c == mask]
    assume(len(opens) <= max_open)
    return cells


def _compiled(pattern, tokens):
    info = tiny_info(tokens)
    return ConstraintCompiler(info).compile_regex(pattern), info


def _allowed_sets(state, canvas, positions):
    m = state.allowed_tokens(canvas, positions)
    return [set(torch.nonzero(m[j]).flatten().tolist()) for j in range(len(positions))]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_mask_equals_the_brute_force_set_of_completable_tokens(data):
    _masks_equal_brute_force(data)


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_masks_are_the_same_when_sparse_tokens_go_through_the_bool_scatter(data):
    """Packed rows set few sparse tokens bit by bit and many through a bool row and packbits
    (token_automaton.SCATTER_MAX); tiny vocabularies never reach the threshold, so it is lowered to zero here."""
    from dllm_constrain.constraints import clear_cache, token_automaton

    saved = token_automaton.SCATTER_MAX
    token_automaton.SCATTER_MAX = 0
    clear_cache()  # no rows cached by the other path
    try:
        _masks_equal_brute_force(data)
    finally:
        token_automaton.SCATTER_MAX = saved


def _masks_equal_brute_force(data) -> None:
    tokens = data.draw(tiny_vocabularies())
    pattern = data.draw(small_regexes())
    cc, info = _compiled(pattern, tokens)
    canvas = data.draw(canvases(len(tokens), info.eos_id, info.mask_id))
    try:
        state = cc.new_canvas_state(len(canvas), expand_budget=None, timeout_s=None)
    except ConstraintTooLongError:
        assert not brute_force_completable([info.mask_id] * len(canvas), tokens, info.eos_id, info.mask_id,
                                           regex_accepts(pattern))
        return
    opens = [i for i, c in enumerate(canvas) if c == info.mask_id]
    expected = brute_force_allowed(canvas, tokens, info.eos_id, info.mask_id, regex_accepts(pattern))
    got = _allowed_sets(state, canvas, opens)
    for i, g in zip(opens, got):
        assert g == expected[i], (pattern, tokens, canvas, i)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_is_completable_equals_brute_force(data):
    tokens = data.draw(tiny_vocabularies())
    pattern = data.draw(small_regexes())
    cc, info = _compiled(pattern, tokens)
    canvas = data.draw(canvases(len(tokens), info.eos_id, info.mask_id))
    try:
        state = cc.new_canvas_state(len(canvas), expand_budget=None, timeout_s=None)
    except ConstraintTooLongError:
        return
    assert state.is_completable(canvas) == brute_force_completable(canvas, tokens, info.eos_id, info.mask_id,
                                                                   regex_accepts(pattern))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_mask_is_never_empty_while_the_canvas_is_completable(data):
    tokens = data.draw(tiny_vocabularies())
    pattern = data.draw(small_regexes())
    cc, info = _compiled(pattern, tokens)
    canvas = data.draw(canvases(len(tokens), info.eos_id, info.mask_id, max_len=8, max_open=8))
    try:
        state = cc.new_canvas_state(len(canvas), expand_budget=None, timeout_s=None)
    except ConstraintTooLongError:
        return
    opens = [i for i, c in enumerate(canvas) if c == info.mask_id]
    if opens and state.is_completable(canvas):
        assert all(_allowed_sets(state, canvas, opens))


def _proposal_case(data):
    """A drawn regex and tiny vocabulary, an all-open canvas of 2-5 positions, an exact state that has computed the
    canvas's masks, and proposals (position, a token its mask allows, a score) at some positions: (tokens, pattern,
    info, compiled, state, canvas, proposals), or None when the canvas is too short for the regex."""
    tokens = data.draw(tiny_vocabularies())
    pattern = data.draw(small_regexes())
    cc, info = _compiled(pattern, tokens)
    n = data.draw(st.integers(2, 5))
    try:
        state = cc.new_canvas_state(n, expand_budget=None, timeout_s=None)
    except ConstraintTooLongError:
        return None
    canvas = [info.mask_id] * n
    allowed = _allowed_sets(state, canvas, list(range(n)))
    proposals = [(i, data.draw(st.sampled_from(sorted(allowed[i]))), data.draw(st.integers(0, 10**6)))
                 for i in range(n) if allowed[i] and data.draw(st.booleans())]
    return tokens, pattern, info, cc, state, canvas, proposals


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_select_commits_keeps_a_jointly_consistent_greedy_subset(data):
    case = _proposal_case(data)
    if case is None:
        return
    tokens, pattern, info, _, state, canvas, proposals = case
    kept = state.select_commits(canvas, proposals)
    if proposals:
        assert kept, "never empty when each proposal was allowed alone"
        assert kept[0] == max(proposals, key=lambda p: p[2])[:2]
    c = list(canvas)
    for p, t in kept:
        c[p] = t
    accepts = regex_accepts(pattern)
    assert brute_force_completable(c, tokens, info.eos_id, info.mask_id, accepts)
    # greedy maximality: every rejected proposal conflicts with the kept ones
    for p, t, _ in proposals:
        if (p, t) in kept:
            continue
        c2 = list(c)
        if c2[p] == info.mask_id:
            c2[p] = t
            assert not brute_force_completable(c2, tokens, info.eos_id, info.mask_id, accepts)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_first_commit_allowed_by_the_last_masks_needs_no_search_and_the_choice_is_unchanged(data):
    """On the canvas of the last mask call, the best proposal whose token its (sound) row allows is kept without a
    completability search; the commits kept are those a state without those masks keeps."""
    case = _proposal_case(data)
    if case is None:
        return
    _, _, _, cc, masked, canvas, proposals = case
    assume(proposals)
    plain = cc.new_canvas_state(len(canvas), expand_budget=None, timeout_s=None)
    searched: list[tuple] = []
    search = masked._completable

    def counting(c: tuple) -> bool:
        searched.append(c)
        return search(c)

    masked._completable = counting
    kept = masked.select_commits(canvas, proposals)
    assert kept == plain.select_commits(canvas, proposals)
    assert len(searched) == len(proposals) - 1  # every proposal but the first kept one was searched
    best = max(proposals, key=lambda p: p[2])
    assert all(c[best[0]] == best[1] for c in searched)


def _exact_case(data):
    """A drawn regex, tiny vocabulary and canvas: (its exact canvas state, the canvas, the brute-force allowed sets
    per open position, the mask id), or None when the canvas is too short for the regex."""
    tokens = data.draw(tiny_vocabularies())
    pattern = data.draw(small_regexes())
    cc, info = _compiled(pattern, tokens)
    canvas = data.draw(canvases(len(tokens), info.eos_id, info.mask_id))
    try:
        state = cc.new_canvas_state(len(canvas), expand_budget=None, timeout_s=None)
    except ConstraintTooLongError:
        return None
    return state, canvas, brute_force_allowed(canvas, tokens, info.eos_id, info.mask_id, regex_accepts(pattern)), \
        info.mask_id


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_forced_tokens_are_exactly_the_positions_with_one_completion_token(data):
    case = _exact_case(data)
    if case is None:
        return
    state, canvas, expected, _ = case
    want = {i: next(iter(s)) for i, s in expected.items() if len(s) == 1}
    assert state.forced_tokens(canvas) == want


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_prefix_forced_token_is_the_frontier_mask_whole(data):
    """The cheap hint the engine uses to choose between committing before the forward and masks beside it: when
    it names a token, that token is the only one any completion puts at the frontier (sound); elsewhere than the
    frontier it names nothing."""
    case = _exact_case(data)
    if case is None:
        return
    state, canvas, expected, mask_id = case
    assume(any(expected.values()))  # the engine keeps its canvas completable
    opens = [i for i, c in enumerate(canvas) if c == mask_id]
    state.allowed_tokens(canvas, opens)  # the transitions the hint reads are known after a mask call
    for i in range(len(canvas)):
        hint = state.prefix_hint(canvas, i)
        if i != (opens[0] if opens else None):
            assert hint is None
        elif hint is not None:
            assert expected[i] == {hint}


@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(0, 2**32 - 1))
def test_a_repeated_prefix_hint_answers_as_a_state_that_never_asked(data, seed):
    """The hint remembers its last answer for a committed prefix while no token transition is learnt: over a
    decoding whose frontier stays put for several steps while mask calls learn transitions, each answer is the one
    a fresh state of the same compiled constraint (the same known transitions, no memo) gives."""
    rnd = random.Random(seed)
    tokens = data.draw(tiny_vocabularies())
    cc, info = _compiled(data.draw(small_regexes()), tokens)
    n = data.draw(st.integers(1, 8))
    try:
        state = cc.new_canvas_state(n, expand_budget=None, timeout_s=None)
    except ConstraintTooLongError:
        return
    m = info.mask_id
    canvas = [m] * n
    while m in canvas:
        frontier = canvas.index(m)
        fresh = cc.new_canvas_state(n, expand_budget=None, timeout_s=None).prefix_hint(canvas, frontier)
        assert state.prefix_hint(canvas, frontier) == fresh
        opens = [i for i, c in enumerate(canvas) if c == m]
        if rnd.random() < 0.5:  # learn transitions, then ask again
            state.allowed_tokens(canvas, opens)
            fresh = cc.new_canvas_state(n, expand_budget=None, timeout_s=None).prefix_hint(canvas, frontier)
            assert state.prefix_hint(canvas, frontier) == fresh
        # commit right of the frontier when there is room (the prefix stays put), else at it
        pos = rnd.choice(opens[1:] or opens)
        ids = torch.nonzero(state.allowed_tokens(canvas, [pos])[0]).flatten().tolist()
        assert ids, "an open position of a completable canvas always has an allowed token"
        canvas[pos] = rnd.choice(ids)


def test_the_prefix_forced_token_follows_the_committed_prefix_only():
    tokens = [b"a", b"b", b"c", b"d"]
    cc, info = _compiled("ab[cd]", tokens)
    m, eos = info.mask_id, info.eos_id
    state = cc.new_canvas_state(4, expand_budget=None, timeout_s=None)
    state.allowed_tokens([m] * 4, [0, 1, 2, 3])
    assert state.prefix_hint([m, m, m, m], 0) == 0  # "a"
    assert state.prefix_hint([0, m, m, m], 1) == 1  # "b" after "a"
    assert state.prefix_hint([0, 1, m, m], 2) is None  # "c" or "d"
    assert state.prefix_hint([0, 1, m, m], 3) is None  # not the frontier
    assert state.prefix_hint([0, 1, 2, m], 3) == eos  # the text is whole: only EOS
    # forced by a committed token to its right, not by the prefix: not reported (the masks find it)
    assert state.prefix_hint([0, 1, m, eos], 2) is None


@settings(max_examples=40, deadline=None)
@given(st.data(), st.integers(0, 2**32 - 1))
def test_random_decoding_with_random_commit_orders_always_ends_valid(data, seed):
    rnd = random.Random(seed)
    tokens = data.draw(tiny_vocabularies())
    pattern = data.draw(small_regexes())
    cc, info = _compiled(pattern, tokens)
    n = data.draw(st.integers(1, 10))
    try:
        state = cc.new_canvas_state(n, expand_budget=None, timeout_s=None)
    except ConstraintTooLongError:
        return
    canvas = [info.mask_id] * n
    while info.mask_id in canvas:
        opens = [i for i, c in enumerate(canvas) if c == info.mask_id]
        pick = rnd.sample(opens, rnd.randint(1, len(opens)))
        masks = state.allowed_tokens(canvas, pick)
        proposals = []
        for j, p in enumerate(pick):
            ids = torch.nonzero(masks[j]).flatten().tolist()
            assert ids, "an open position of a completable canvas always has an allowed token"
            proposals.append((p, rnd.choice(ids), rnd.random()))  # random logits
        kept = state.select_commits(canvas, proposals)
        assert kept
        for p, t in kept:
            canvas[p] = t
    text = canvas_text(canvas, tokens, info.eos_id)
    assert text is not None and regex_accepts(pattern)(text)


def test_canvas_state_satisfies_the_protocol():
    cc, info = _compiled("ab", [b"a", b"b"])
    assert isinstance(cc.new_canvas_state(3, expand_budget=None, timeout_s=None), CanvasConstraint)


def test_a_constraint_longer_than_the_canvas_is_refused_with_its_minimum_length():
    cc, info = _compiled("a{5}", [b"a", b"aa"])
    assert cc.min_tokens() == 3
    cc.new_canvas_state(3, expand_budget=None, timeout_s=None)
    with pytest.raises(ConstraintTooLongError) as e:
        cc.new_canvas_state(2, expand_budget=None, timeout_s=None)
    assert e.value.min_tokens == 3 and e.value.max_new_tokens == 2


def test_text_that_fills_the_whole_canvas_needs_no_eos():
    cc, info = _compiled("abab", [b"a", b"b", b"ab"])
    state = cc.new_canvas_state(2, expand_budget=None, timeout_s=None)
    m = state.allowed_tokens([info.mask_id, info.mask_id], [0, 1])
    assert set(torch.nonzero(m[0]).flatten().tolist()) == {2}
    assert set(torch.nonzero(m[1]).flatten().tolist()) == {2}


def test_eos_is_allowed_only_where_everything_to_its_right_can_be_eos():
    cc, info = _compiled("a+", [b"a", b"b"])
    eos, mask = info.eos_id, info.mask_id
    state = cc.new_canvas_state(4, expand_budget=None, timeout_s=None)
    # a committed text token at position 3 forbids EOS anywhere before it
    m = state.allowed_tokens([mask, mask, mask, 0], [0, 1, 2])
    assert not m[:, eos].any()
    m = state.allowed_tokens([0, mask, mask, mask], [1, 2, 3])
    assert m[:, eos].all()


def test_committed_token_right_of_open_positions_constrains_them():
    # "é" = c3 a9; a committed continuation byte at position 1 forces the lead byte at position 0
    toks = [b"\xc3", b"\xa9", b"a", b"\xc3\xa9"]
    cc, info = _compiled("(é|a)+", toks)
    state = cc.new_canvas_state(3, expand_budget=None, timeout_s=None)
    m = state.allowed_tokens([info.mask_id, 1, info.mask_id], [0, 2])
    assert set(torch.nonzero(m[0]).flatten().tolist()) == {0}
    # the last position cannot start a character it has no room to finish
    assert set(torch.nonzero(m[1]).flatten().tolist()) == {2, 3, info.eos_id}


def test_mask_width_is_the_model_vocab_and_extra_ids_are_never_allowed():
    from dllm_constrain.constraints import TokenizerInfo

    info = TokenizerInfo([b"a", b"b", None, None], eos_id=2, mask_id=3, vocab_size=10)
    cc = ConstraintCompiler(info).compile_regex("[ab]*")
    m = cc.new_canvas_state(2, expand_budget=None, timeout_s=None).allowed_tokens([3, 3], [0, 1])
    assert m.shape == (2, 10)
    assert not m[:, 3:].any() and not m[:, 3].any()
    assert m[:, :3].all()


def test_invalid_regex_is_a_typed_error():
    with pytest.raises(InvalidRegexError):
        _compiled("(a", [b"a"])


def test_compiling_twice_returns_the_cached_constraint():
    info = tiny_info([b"a", b"b"])
    c1 = ConstraintCompiler(info).compile_regex("a+b")
    c2 = ConstraintCompiler(info).compile_regex("a+b")
    assert c1 is c2


def test_tokens_splitting_a_multibyte_character_are_handled_exactly():
    toks = [b"\xc3", b"\xa9", b"\xc3\xa9", b"x"]
    cc, info = _compiled("é{2}", toks)
    state = cc.new_canvas_state(3, expand_budget=None, timeout_s=None)
    got = state.allowed_sets([info.mask_id] * 3)
    assert got[0] == {0, 2}
    assert got[1] == {0, 1, 2}  # [c3a9, c3, a9] / [c3, a9, c3a9] / [c3a9, c3a9, EOS]
    assert got[2] == {1, 2, info.eos_id}
    rnd = random.Random(0)
    for _ in range(20):
        c = [info.mask_id] * 3
        while info.mask_id in c:
            p = rnd.choice([i for i, x in enumerate(c) if x == info.mask_id])
            opts = sorted(state.allowed_sets(c)[p])
            c[p] = rnd.choice(opts)
        assert canvas_text(c, toks, info.eos_id) == "éé".encode()


@settings(max_examples=40, deadline=None)
@given(st.data(), st.integers(0, 2**32 - 1), st.integers(0, 3))
def test_under_a_tiny_expansion_budget_masks_stay_sound_and_the_frontier_exact(data, seed, budget):
    rnd = random.Random(seed)
    tokens = data.draw(tiny_vocabularies())
    pattern = data.draw(small_regexes())
    cc, info = _compiled(pattern, tokens)
    n = data.draw(st.integers(1, 6))
    try:
        state = cc.new_canvas_state(n, expand_budget=budget, timeout_s=None)
    except ConstraintTooLongError:
        return
    accepts = regex_accepts(pattern)
    canvas = [info.mask_id] * n
    while info.mask_id in canvas:
        opens = [i for i, c in enumerate(canvas) if c == info.mask_id]
        masks = _allowed_sets(state, canvas, opens)
        exact = brute_force_allowed(canvas, tokens, info.eos_id, info.mask_id, accepts)
        for i, m in zip(opens, masks):
            assert m <= exact[i]  # sound: only tokens of some valid completion
        assert masks[0], "the left frontier's mask is never empty while the canvas is completable"
        assert masks[0] == exact[opens[0]], "the left frontier's mask is exact under any budget"
        p = rnd.choice([q for q, m in zip(opens, masks) if m])
        t = rnd.choice(sorted(masks[opens.index(p)]))
        assert state.select_commits(canvas, [(p, t, 1.0)]) == [(p, t)]
        canvas[p] = t
    text = canvas_text(canvas, tokens, info.eos_id)
    assert text is not None and accepts(text)


@given(st.sets(st.integers(min_value=0, max_value=5000), max_size=300))
@settings(max_examples=200, deadline=None)
def test_state_set_members_are_the_set_bits_ascending(bits):
    """bits_of is exact on both of its paths (bit peeling for small sets, numpy unpacking for large ones)."""
    from dllm_constrain.constraints.canvas import bits_of

    assert bits_of(sum(1 << b for b in bits)) == sorted(bits)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(0, 5)), max_size=40))
def test_the_frontier_and_the_last_committed_position_are_found_by_their_definitions(cells):
    from dllm_constrain.constraints.canvas_frontier import first_open, last_committed

    c = tuple(cells)
    assert first_open(c) == next((i for i, x in enumerate(c) if x is None), None)
    assert last_committed(c) == max((i for i, x in enumerate(c) if x is not None), default=-1)
