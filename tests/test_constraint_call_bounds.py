"""What one call of a regular canvas does when its allowances run out, and that its answers stay sound.

A call computes new token transitions for at most EXPAND_S, rows for positions other than the left frontier until
ROWS_S, the frontier's can-finish decisions until FRONTIER_S into the call (then it keeps the completions it found),
and a bounded number of can-finish search steps; sets cut short are resumed by later calls from the members still
unknown. The tests force each allowance to run out (the
module constants set to 0, tiny budgets) on small automata with brute-force oracles (tests/constraint_support.py).
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


# ---------------------------------------------------------------- sets cut by the budget are resumed
def test_a_forward_set_cut_by_the_budget_keeps_its_unknown_members_and_comes_back_exact() -> None:
    cc = compile_fresh()
    alg = cc.algebra
    F1 = alg.step_open(START_BIT)  # exact: only the start's transitions were needed
    assert len(alg.members(F1)) >= 3
    cut = alg.step_open(F1, Budget(1))
    remaining = alg._open_part[F1][2]
    assert remaining and all(q not in alg.ta.succ_bits for q in remaining)
    full = alg.step_open(F1)  # resumed from the members left unknown
    assert full == exact_successors(alg, F1)
    assert cut & ~full == 0  # the cut set was a subset (sound)
    assert F1 not in alg._open_part


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_masks_under_a_one_transition_budget_are_sound_and_grow_back_to_exact(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 4)
    canvas = random_canvas(rng, n, rng.randint(1, min(3, n)))
    oracle = brute_force_allowed(canvas, TOKENS, EOS, MASK, regex_accepts(PATTERN))
    opens = sorted(oracle)
    cc = compile_fresh()
    st_ = cc.new_canvas_state(n, expand_budget=1, timeout_s=None)
    frontier = opens[0]
    for _ in range(40):  # each call computes one new transition at most; the cut sets are resumed
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(canvas_mod, "ROWS_S", 60.0)  # no row deferred: only the transition budget cuts
            masks = st_.allowed_tokens(canvas, opens)
        rows = {p: set(masks[j].nonzero().flatten().tolist()) for j, p in enumerate(opens)}
        for p in opens:
            assert rows[p] <= oracle[p], (canvas, p)
        assert rows[frontier] == oracle[frontier]  # the left frontier is exact under any budget
        if rows == oracle:
            break
    assert rows == oracle


# ---------------------------------------------------------------- rows past ROWS_S
def test_rows_past_the_soft_time_stay_empty_and_the_frontier_row_is_exact(monkeypatch) -> None:
    monkeypatch.setattr(canvas_mod, "ROWS_S", -1.0)  # every row after the frontier's is past it
    canvas = [MASK] * 4
    oracle = brute_force_allowed(canvas, TOKENS, EOS, MASK, regex_accepts(PATTERN))
    st_ = compile_fresh().new_canvas_state(4)
    masks = st_.allowed_tokens(canvas, [0, 1, 2, 3])
    assert set(masks[0].nonzero().flatten().tolist()) == oracle[0]
    assert not masks[1:].any()
    assert st_.rows_deferred == 3
    assert st_.select_commits(canvas, [(0, TOKENS.index(b"ab"), 1.0)]) == [(0, 2)]  # the exact row certifies


def test_exact_mode_computes_every_row_whatever_the_soft_time(monkeypatch) -> None:
    monkeypatch.setattr(canvas_mod, "ROWS_S", -1.0)
    canvas = [MASK] * 4
    oracle = brute_force_allowed(canvas, TOKENS, EOS, MASK, regex_accepts(PATTERN))
    st_ = compile_fresh().new_canvas_state(4, expand_budget=None, timeout_s=None)
    masks = st_.allowed_tokens(canvas, [0, 1, 2, 3])
    assert [set(m.nonzero().flatten().tolist()) for m in masks] == [oracle[p] for p in range(4)]
    assert st_.rows_deferred == 0


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


def test_a_can_finish_search_out_of_steps_is_undecided_never_refuted() -> None:
    cc = compile_fresh(FAR, FAR_TOKENS)
    alg = cc.algebra
    w = cc.ta.delta(START, 0)  # after "a": five more needed
    spent = Budget(128)
    spent.visits = 0
    assert alg.finish3(w, 2, spent) is None
    assert w >= len(alg._fin_false) or alg._fin_false[w] == -1  # nothing remembered from an undecided search
    assert alg.finish3(w, 2) is False and alg.can_finish(w, 5) is True


def test_a_can_finish_question_budgets_left_undecided_is_searched_again_at_exponentially_spaced_visits() -> None:
    """A search cut by the same budget every call would cost every mask call the same work for nothing: later calls
    search it again at their 2nd, 4th, 8th, ... visit only, answer undecided (sound) in between, and an exact call
    (no budget) or a budget that suffices on a searching visit still decides it."""
    cc = compile_fresh(FAR, FAR_TOKENS)
    alg = cc.algebra
    w = cc.ta.delta(START, 0)  # after "a": five more needed, so "within 2" needs a search (greedy bound 5)
    searched: list[int] = []
    for visit in range(1, 10):
        spent = Budget(128)
        spent.visits = 0  # any search is cut at once
        assert alg.finish3(w, 2, spent) is None
        if spent.visits != 0:  # a search took (and ran out of) a step
            searched.append(visit)
    assert searched == [1, 2, 4, 8]
    assert alg.finish3(w, 2) is False  # exact: decided whatever the back-off
    fresh = compile_fresh(FAR, FAR_TOKENS)
    spent = Budget(128)
    spent.visits = 0
    assert fresh.algebra.finish3(w, 2, spent) is None
    assert fresh.algebra.finish3(w, 2, Budget(128)) is False  # its second visit searches, with steps enough


def test_the_frontier_leaves_out_undecided_states_and_does_not_remember_them_as_refuted() -> None:
    cc = compile_fresh(FAR, FAR_TOKENS)
    alg, n = cc.algebra, 3
    c = (None,) * n
    spent = Budget(128)
    spent.visits = 0
    memo: dict = {}
    bounded = FrontierSearch(alg, n, c, [0] * (n + 2), -1, memo, spent)
    bi, bn = bounded.sets(START_BIT, 0)
    assert bounded.undecided
    w_a, w_b = cc.ta.delta(START, 0), cc.ta.delta(START, 1)
    assert (bn >> w_b) & 1 and not (bn >> w_a) & 1
    assert memo.get(1, {}).get(w_a) is None
    exact = FrontierSearch(alg, n, c, [0] * (n + 2), -1, {}, None)
    assert exact.sets(START_BIT, 0) == (bi, bn) and not exact.undecided


def test_a_frontier_search_with_a_spent_budget_explores_each_state_and_position_once() -> None:
    """With the can-finish budget spent, refutations that met an undecided state are not memoised across calls;
    within the call each (position, state) is still explored once (re-walking them per path reaching them made
    one unbounded call run for over 20 minutes on a fixture schema)."""
    tokens = [b"a", b"b", b"ab", b"ba", b"abab", b"c"]
    cc = ConstraintCompiler(tiny_info(tokens), cache=False).compile_regex(r"(a|b|ab|ba)*c(a|b){3}")
    n = 10
    c = tuple(4 if i == 7 else None for i in range(n))  # "abab" at 7: no completion, and states right of it undecided
    spent = Budget(128)
    spent.visits = 0
    search = FrontierSearch(cc.algebra, n, c, [0] * (n + 2), -1, {}, spent)
    expanded: dict[tuple[int, int], int] = {}
    children = search.children

    def counted(v: int, i: int) -> list[int]:
        expanded[(v, i)] = expanded.get((v, i), 0) + 1
        return children(v, i)

    search.children = counted  # type: ignore[method-assign]
    search.sets(START_BIT, 0)
    assert search.undecided
    assert max(expanded.values()) == 1


def test_a_frontier_left_empty_by_undecided_states_answers_from_the_prefix_check_at_once(monkeypatch) -> None:
    cc = compile_fresh(r"a{6}", FAR_TOKENS)
    st_ = cc.new_canvas_state(7, timeout_s=5.0)
    real = type(cc.algebra).finish3

    def spent_search(self, q, m, budget=None):  # every bounded can-finish decision comes out undecided
        if budget is not None and not (q == 0 or self.dfa.accepting[q]):
            return None
        return real(self, q, m, budget)

    monkeypatch.setattr(type(cc.algebra), "finish3", spent_search)
    canvas = [FAR_MASK] * 7
    t0 = time.perf_counter()
    masks = st_.allowed_tokens(canvas, [0])
    assert time.perf_counter() - t0 < 5.0  # not held to the call's limit
    assert st_.deadline_hits == 1 and st_.prefix_fallbacks == 1 and st_.frontier_cuts == 1
    assert set(masks[0].nonzero().flatten().tolist()) == {0}  # the tokens that keep a prefix of the language
    assert st_.select_commits(canvas, [(0, 1, 1.0)]) == []  # never an unverified commit
    assert st_.select_commits(canvas, [(0, 0, 1.0)]) == [(0, 0)]  # verified exactly


def test_the_frontier_past_its_time_keeps_the_completions_it_found_and_leaves_the_rest_out() -> None:
    cc = compile_fresh()
    alg, n = cc.algebra, 4
    c = (None,) * n
    exact = FrontierSearch(alg, n, c, [0] * (n + 2), -1, {}, None)
    ebi, ebn = exact.sets(START_BIT, 0)
    assert len(alg.members(ebn)) >= 2
    late = Budget(128, -1.0)  # the search's time is over before it starts
    bounded = FrontierSearch(alg, n, c, [0] * (n + 2), -1, {}, late)
    bi, bn = bounded.sets(START_BIT, 0)
    assert bn and bn & ~ebn == 0 and bi & ~ebi == 0  # a witness, and nothing the exact search refutes
    assert bn != ebn and bounded.undecided  # the other successors were left out, and that is reported


def test_a_mask_call_past_the_frontier_time_still_offers_a_valid_token_there(monkeypatch) -> None:
    monkeypatch.setattr(canvas_mod, "FRONTIER_S", -1.0)
    monkeypatch.setattr(canvas_mod, "FRONTIER_MIN_S", 0.0)
    monkeypatch.setattr(canvas_mod, "EXPAND_S", 0.0)  # the budget cuts: the frontier takes the exact search
    canvas = [MASK] * 4
    oracle = brute_force_allowed(canvas, TOKENS, EOS, MASK, regex_accepts(PATTERN))
    st_ = compile_fresh().new_canvas_state(4, timeout_s=5.0)
    row = set(st_.allowed_tokens(canvas, [0])[0].nonzero().flatten().tolist())
    assert row and row <= oracle[0]


def test_finishers_past_their_stop_time_leave_members_undecided_and_resume_them() -> None:
    alg = compile_fresh(r"a{6}", [b"a", b"aaa"]).algebra  # the start needs 6 bytes, 2 tokens: not decided by length
    assert alg.finishers(START_BIT, 2, Budget(128), stop_at=0.0) == 0  # past at once: left out, not refuted
    assert (START_BIT, 2) in alg._fin_part and (START >= len(alg._fin_false) or alg._fin_false[START] == -1)
    assert alg.finishers(START_BIT, 2, Budget(128)) == START_BIT  # resumed: decided now
    assert alg.finishers(START_BIT, 1, None) == 0


def test_a_cold_shortest_continuation_past_the_budget_time_gives_no_bound_and_is_not_remembered() -> None:
    cc = compile_fresh(FAR, FAR_TOKENS)
    alg = cc.algebra
    w = cc.ta.delta(START, 0)  # after "a": five more
    assert alg.greedy_tokens_to_accept(w, Budget(128, -1.0)) >= 1 << 30
    assert w not in alg._greedy
    assert alg.greedy_tokens_to_accept(w) == 5


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


def test_min_tokens_out_of_search_time_is_a_lower_bound_and_not_remembered(monkeypatch) -> None:
    monkeypatch.setattr(compiler_mod, "MIN_TOKENS_S", 0.0)
    cc = compile_fresh(r"(ab){4}(ba){2}")
    lb = cc.min_tokens(timeout_s=0.5)
    exact = shortest_in_tokens(cc, TOKENS)
    assert 1 <= lb <= exact
    assert cc.min_tokens(timeout_s=None) == exact  # the unbounded call is not cut by the search time


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


def test_the_fit_check_out_of_time_lets_the_request_in_and_decides_when_unbounded(monkeypatch) -> None:
    monkeypatch.setattr(compiler_mod, "FIT_S", 0.0)  # the check stops at once
    cc = compile_fresh(r"(ab){4}(ba){2}")  # 12 bytes: at least 3 tokens ("abab" twice, then "ba" twice: 4)
    assert cc.fits(2, timeout_s=0.5) is True  # undecided: never refuses what might fit
    assert cc.fits(2, timeout_s=None) is False
    assert cc.fits(4, timeout_s=None) is True


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


def test_past_the_exploration_allowance_a_call_explores_nothing_ahead_of_the_frontier() -> None:
    """A compiled constraint's automaton is shared and never shrinks: once it holds its allowance, a mask call
    computes new transitions only for its left frontier, where budgets alone would explore every open row."""
    canvas = [MASK] * 4
    ahead = compile_fresh()
    ahead.new_canvas_state(4, timeout_s=None).allowed_tokens(canvas, [0, 1, 2, 3])
    capped = compile_fresh()
    capped.algebra.explore_max_bytes = 0
    masks = capped.new_canvas_state(4, timeout_s=None).allowed_tokens(canvas, [0, 1, 2, 3])
    assert capped.ta.known_count < ahead.ta.known_count
    oracle = brute_force_allowed(canvas, TOKENS, EOS, MASK, regex_accepts(PATTERN))
    rows = [set(m.nonzero().flatten().tolist()) for m in masks]
    assert rows[0] == oracle[0]  # the left frontier stays exact
    assert all(rows[p] <= oracle[p] for p in range(4))  # the other rows stay sound


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000))
def test_past_the_exploration_allowance_commits_are_still_decided_exactly(seed: int) -> None:
    def past_the_allowance(cc, n: int):
        cc.algebra.explore_max_bytes = 0
        return cc.new_canvas_state(n, timeout_s=None)

    assert_exact_decisions(random.Random(seed), past_the_allowance)
