"""What one call of a regular canvas does when its work allowances run out, and that its answers stay sound.

A call adds at most `expand_budget` states to its request's explored set, computes rows other than the left
frontier's up to ROW_WORK states, and decides the frontier exactly; no allowance reads the clock
(tests/test_determinism.py checks that the answers do not follow it). The tests force the allowances to run out
(tiny budgets) on small automata with brute-force oracles (tests/constraint_support.py).
"""
from __future__ import annotations

import random
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constraint_support import brute_force_allowed, brute_force_completable, regex_accepts, tiny_info
from dllm_constrain.constraints import ConstraintCompiler
from dllm_constrain.constraints import canvas as canvas_mod
from dllm_constrain.constraints.bounds import INF
from dllm_constrain.constraints import compiler as compiler_mod
from dllm_constrain.constraints.canvas_frontier import FrontierSearch
from dllm_constrain.constraints.deadline import CallDeadline, activate, fire_active
from dllm_constrain.constraints.deriv import DEAD, START
from dllm_constrain.constraints.set_algebra import ENDED_BIT, START_BIT, Budget
from dllm_constrain.errors import ConstraintTimeoutError

TOKENS = [b"a", b"b", b"ab", b"ba", b"abab"]
PATTERN = r"(ab|ba)*(a|bb)?b{0,2}"
EOS, MASK = len(TOKENS), len(TOKENS) + 1


def compile_fresh(pattern: str = PATTERN, tokens: list[bytes] = TOKENS):
    return ConstraintCompiler(tiny_info(tokens), cache=False).compile_regex(pattern)


def random_canvas(rng: random.Random, n: int, opens: int) -> list[int]:
    """A canvas of n positions with `opens` open ones and random committed tokens (EOS among them)."""
    canvas = [rng.choice(range(len(TOKENS) + 1)) for _ in range(n)]
    for p in rng.sample(range(n), opens):
        canvas[p] = MASK
    return canvas


def exact_successors(alg, F: int) -> int:
    """The step over an open position computed member by member, without any memo."""
    r = 0
    acc = alg.dfa.accepting
    for q in alg.members(F):
        if q == 0:
            r |= ENDED_BIT
            continue
        r |= alg.ta.trans(q).succ_bits
        if acc[q]:
            r |= ENDED_BIT
    return r


# ---------------------------------------------------------------- sets cut by the budget
def test_a_set_whose_new_members_exceed_the_allowance_is_followed_through_explored_members_only() -> None:
    cc = compile_fresh()
    alg = cc.algebra
    F = alg.step_open(alg.step_open(START_BIT))
    members = [q for q in alg.members(F) if q != 0]
    assert len(members) >= 2
    short = Budget(len(members) - 1)  # all new members or none: none here
    inside = alg.step_open(F, short)
    assert short.cuts == 1 and short.known == 0 and inside & ~exact_successors(alg, F) == 0
    enough = Budget(len(members))
    assert alg.step_open(F, enough) == exact_successors(alg, F)
    assert enough.cuts == 0 and enough.known == F & ~ENDED_BIT


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000))
def test_the_bounded_can_finish_search_never_contradicts_the_exact_one(seed: int) -> None:
    rng = random.Random(seed)
    cc = compile_fresh()
    alg = cc.algebra
    F = START_BIT
    for _ in range(rng.randrange(0, 4)):
        F = alg.step_open(F)
    for q in alg.members(F):
        if q == 0:
            continue
        m = rng.randrange(0, 6)
        bounded = alg.finish_bounded(q, m, rng.choice([1, 2, 8, 64]))
        assert bounded is None or bounded == alg.finish3(q, m)


# ---------------------------------------------------------------- rows past ROW_WORK
def test_rows_past_the_row_work_stay_empty_and_the_frontier_row_is_the_exact_one() -> None:
    cc = compile_fresh()
    n = 8
    canvas = [MASK] * n
    capped = cc.new_canvas_state(n, timeout_s=None)
    capped.row_states = 0  # every row after the frontier's is past the allowance
    rows = capped.allowed_tokens(canvas, list(range(n)))
    exact = cc.new_canvas_state(n, expand_budget=None, timeout_s=None).allowed_tokens(canvas, list(range(n)))
    assert rows[0].tolist() == exact[0].tolist() and rows[0].any()
    assert not rows[2:].any() and capped.rows_deferred >= n - 2


# ---------------------------------------------------------------- exact completability by a witness search
@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_select_commits_and_is_completable_decide_exactly_when_the_budget_proves_nothing(seed: int) -> None:
    assert_exact_decisions(random.Random(seed), lambda cc, n: cc.new_canvas_state(n, expand_budget=0, timeout_s=None))


def assert_exact_decisions(rng: random.Random, make_state) -> None:
    """On a random canvas: is_completable, and select_commits of one random proposal, agree with brute force for the
    state `make_state(compiled, n)`."""
    n = rng.randint(2, 5)
    canvas = random_canvas(rng, n, rng.randint(1, min(3, n)))
    accepts = regex_accepts(PATTERN)
    st_ = make_state(compile_fresh(), n)
    assert st_.is_completable(canvas) == brute_force_completable(canvas, TOKENS, EOS, MASK, accepts)
    p = rng.choice([i for i, c in enumerate(canvas) if c == MASK])
    t = rng.randrange(len(TOKENS) + 1)
    after = list(canvas)
    after[p] = t
    want = brute_force_completable(after, TOKENS, EOS, MASK, accepts)
    assert st_.select_commits(canvas, [(p, t, 1.0)]) == ([(p, t)] if want else [])


# ---------------------------------------------------------------- the can-finish search's bounds
FAR_TOKENS = [b"a", b"b", b"bbbbbbbb"]  # the long token makes "ceil(distance / longest token)" a weak bound
FAR = r"a{6}|b"
FAR_MASK = len(FAR_TOKENS) + 1




















# ---------------------------------------------------------------- min_tokens and the fit check
def shortest_in_tokens(cc, tokens: list[bytes]) -> int:
    """Plain breadth-first search over token walks of the DFA (no bounds, no pruning)."""
    dfa = cc.dfa
    seen, level, k = {START}, [START], 0
    while level:
        if any(dfa.accepting[s] for s in level):
            return k
        nxt = []
        for s in level:
            for b in tokens:
                u = dfa.walk(s, b)
                if u != DEAD and u not in seen:
                    seen.add(u)
                    nxt.append(u)
        level, k = nxt, k + 1
    return 1 << 30


@pytest.mark.parametrize("pattern", [PATTERN + "c", r"(abab|b){2,5}a", r"a{6}|b{3}", r"(ab){4}(ba){2}"])
def test_min_tokens_is_the_shortest_token_path(pattern: str) -> None:
    tokens = TOKENS + [b"c"]
    cc = ConstraintCompiler(tiny_info(tokens), cache=False).compile_regex(pattern)
    assert cc.min_tokens(timeout_s=None) == shortest_in_tokens(cc, tokens)




def test_the_tokenizer_token_set_is_built_at_compile_time() -> None:
    info = tiny_info(TOKENS)
    assert info._byte_set is None
    ConstraintCompiler(info, cache=False).compile_regex(PATTERN)
    assert info._byte_set is not None  # not in the first request's call


# ---------------------------------------------------------------- deadlines
def test_a_deadline_stopped_early_reports_the_call_limit() -> None:
    d = CallDeadline(30.0, "regex", "allowed_tokens", stop_s=0.0)
    with activate(d), pytest.raises(ConstraintTimeoutError) as info:
        time.sleep(0.001)
        from dllm_constrain.constraints.deadline import check_active

        check_active()
    assert info.value.timeout_s == 30.0 and info.value.operation == "allowed_tokens"


def test_fire_active_raises_the_active_call_deadline_error() -> None:
    with activate(CallDeadline(0.5, "json_schema", "select_commits")), pytest.raises(ConstraintTimeoutError) as info:
        fire_active("deciding the frontier")
    err = info.value
    assert err.kind == "json_schema" and err.operation == "select_commits" and "deciding the frontier" in str(err)




def longest_match_tokens_on_shortest_path(alg, q: int) -> int:
    """Reference for greedy_tokens_to_accept: spell q's shortest byte continuation (`_greedy_next`'s bytes), then count
    the tokens of its longest-match tokenization, every lookahead the vocabulary's longest token."""
    path, s = bytearray(), q
    while not alg.dfa.accepting[s]:
        b, s = alg._greedy_next(s)
        if b < 0:
            return INF
        path.append(b)
    count, L = 0, alg.ta.max_token_len
    while path:
        k = alg.ta.longest_token_prefix(bytes(path[:L]))
        if k == 0:
            return INF
        del path[:k]
        count += 1
    return count


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text("abc{}:\"", min_size=1, max_size=5), min_size=1, max_size=12), st.sampled_from(
    [r'\{"ab":(a|bc)*\}', r"(abc){2,4}c?", r'a{3}b*"c"', r"(ab|c){0,5}\}"]))
def test_the_greedy_token_bound_equals_longest_match_over_the_whole_lookahead(words, pattern):
    spelled = [b"abc", b"abcabc", b'{"ab":', b"aaab", b"bc}"]  # tokens longer than a byte along shortest paths
    tokens = list(dict.fromkeys([w.encode() for w in words] + spelled + [bytes([b]) for b in b'abc{}:"']))
    alg = compile_fresh(pattern, tokens).algebra
    seen, todo = {START}, [START]
    while todo:  # every live DFA state reachable from the start
        s = todo.pop()
        alg.dfa.expand(s)
        for u in set(alg.dfa.T[s].tolist()) - {DEAD} - seen:
            seen.add(u)
            todo.append(u)
    for s in sorted(seen):
        assert alg.greedy_tokens_to_accept(s) == longest_match_tokens_on_shortest_path(alg, s)


def _reachable_states(dfa, limit: int = 400) -> list[int]:
    seen, todo = {START}, [START]
    while todo and len(seen) < limit:
        s = todo.pop()
        dfa.expand(s)
        for u in set(dfa.T[s].tolist()) - {DEAD} - seen:
            seen.add(u)
            todo.append(u)
    return sorted(seen)


@pytest.mark.parametrize("constraint", [
    ("regex", r'\{"ab":(a|bc)*\}'), ("regex", r"(abc){2,4}c?|x+y"), ("regex", r"(ab|c){0,5}\}"),
    ("schema", {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                 "tags": {"type": "array", "items": {"enum": ["a", "bc"]}}},
                "required": ["name", "age"]}),
    ("schema", {"anyOf": [{"type": "boolean"}, {"type": "object", "properties": {"k": {"const": 1}},
                                                "required": ["k"]}]}),
])
def test_the_first_byte_read_off_the_terms_starts_a_shortest_continuation(constraint) -> None:
    """The greedy continuation's next byte comes from the terms (no derivative per byte class): it is always one
    byte closer to acceptance, for every reachable state, regular expressions and JSON objects alike."""
    kind, spec = constraint
    tokens = [bytes([b]) for b in range(32, 127)]
    compiler = ConstraintCompiler(tiny_info(tokens), cache=False)
    cc = compiler.compile_regex(spec) if kind == "regex" else compiler.compile_json_schema(spec)
    dfa = cc.algebra.dfa
    terms = dfa.terms
    decided = 0
    for s in _reachable_states(dfa):
        t = dfa.term_of[s]
        b = terms.shortest_first_byte(t)
        if terms.minlen(t) in (0, INF):
            assert b == -1
        elif b is not None:
            decided += 1
            assert terms.minlen(terms.deriv(t, b)) == terms.minlen(t) - 1
    assert decided > 0


@pytest.mark.parametrize("spec", [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]},
    {"type": "object", "properties": {"a": {"enum": ["xyz", "w"]}, "b": {"type": "array", "minItems": 2}},
     "required": ["b", "a"]},
])
def test_the_greedy_bound_on_fresh_automata_spells_an_accepted_text_and_bounds_the_token_distance(spec) -> None:
    tokens = [bytes([b]) for b in range(32, 127)] + [b'{"', b'":', b'","', b'"}', b"name", b"age"]
    cc = ConstraintCompiler(tiny_info(tokens), cache=False).compile_json_schema(spec)
    alg, dfa = cc.algebra, cc.algebra.dfa
    g = alg.greedy_tokens_to_accept(START)  # nothing expanded yet: the continuation is read off the terms
    assert g < INF
    text, s = bytearray(), START
    while not dfa.accepting[s]:
        b, s = alg._greedy_next(s)
        text.append(b)
    assert cc.accepts_text(bytes(text)) and len(text) == int(dfa.dist[START])
    # the exact token distance (breadth-first over token transitions) is at most the bound
    depth, layer, seen = 0, [START], {START}
    while not any(dfa.accepting[q] for q in layer):
        layer = [u for q in layer for u in cc.ta.trans(q).succ if u not in seen and not seen.add(u)]
        depth += 1
    assert depth <= g


# ---------------------------------------------------------------- the automaton's exploration allowance
def test_the_footprint_estimate_grows_with_the_transitions_a_call_computes() -> None:
    cc = compile_fresh()
    before = cc.ta.footprint_bytes()
    cc.new_canvas_state(4, expand_budget=None, timeout_s=None).allowed_tokens([MASK] * 4, [0, 1, 2, 3])
    assert cc.ta.footprint_bytes() > before
    assert cc.algebra.exploration_full() is False  # a tiny automaton is far below the default allowance




@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000))
def test_past_the_exploration_allowance_commits_are_still_decided_exactly(seed: int) -> None:
    saved = canvas_mod.EXPLORE_MAX_STATES
    canvas_mod.EXPLORE_MAX_STATES = 0  # no call adds a state to its request's explored set
    try:
        assert_exact_decisions(random.Random(seed), lambda cc, n: cc.new_canvas_state(n, timeout_s=None))
    finally:
        canvas_mod.EXPLORE_MAX_STATES = saved
