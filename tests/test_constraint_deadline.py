"""Per-call deadlines on the constraint path: a call that would expand an exploding automaton returns within its
limit (plus a small salvage allowance) with a sound answer or ConstraintTimeoutError, the shared compiled
constraint stays intact, and through the public API a request ends valid or with ConstraintTimeoutError while
the other requests of its batch finish."""
from __future__ import annotations

import random
import re
import time

import pytest

import dllm_constrain as dc
from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo

from dllm_constrain.constraints.deriv import DEAD, START
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.state import Request, SamplingParams
from dllm_constrain.errors import ConstraintTimeoutError, InvalidRequestError

# the 21st character from the end is an `a`: its minimal DFA remembers the last 21 characters (2^21 states), and
# the forward sets of an open canvas double at each position
EXPLODE = r"(a|b)*a(a|b){20}"
A, B, EOS, MASK = 0, 1, 2, 3
SLACK_S = 1.0  # scheduling noise on a loaded 2-core machine


def info() -> TokenizerInfo:
    return TokenizerInfo([b"a", b"b", None, None], eos_id=EOS, mask_id=MASK, vocab_size=4)


def compile_fresh():
    return ConstraintCompiler(info(), cache=False).compile_regex(EXPLODE)


def completable(canvas: list[int]) -> bool:
    """Oracle for EXPLODE over single-byte tokens: some text length l (first EOS at l, or l = n) works."""
    n = len(canvas)
    for length in range(21, n + 1):
        if any(t == EOS for t in canvas[:length]):
            break
        if any(t not in (EOS, MASK) for t in canvas[length:]):
            continue
        if canvas[length - 21] in (A, MASK):
            return True
    return False


def test_the_deadline_fires_inside_an_exploding_expansion_and_every_answer_is_sound() -> None:
    cc = compile_fresh()
    limit = 0.3
    st = cc.new_canvas_state(64, expand_budget=None, timeout_s=limit)  # unbounded work units: only time stops it
    canvas = [MASK] * 64
    canvas[0] = B
    t0 = time.perf_counter()
    try:
        masks = st.allowed_tokens(canvas, list(range(1, 64)))
    except ConstraintTimeoutError as err:
        masks = None
        assert "allowed_tokens" in str(err) and err.kind == "regex"
    elapsed = time.perf_counter() - t0
    assert elapsed < limit + SLACK_S, elapsed
    assert st.deadline_hits == 1
    if masks is not None:
        certified = st._certified[1]
        for p, row in certified.items():  # every token of a sound row keeps the canvas completable
            for t in row.nonzero()[0].tolist():
                c = list(canvas)
                c[p] = t
                assert completable(c), (p, t)
        assert masks[0].any()  # the frontier always has a token to propose
        proposals = [(1, t, 1.0 - 0.1 * t) for t in masks[0].nonzero().flatten().tolist()]
        t0 = time.perf_counter()
        try:
            kept = st.select_commits(canvas, proposals)
        except ConstraintTimeoutError:
            kept = []
        assert time.perf_counter() - t0 < limit + SLACK_S
        c = list(canvas)
        for p, t in kept:
            c[p] = t
        assert not kept or completable(c)  # never an unverified commit


def test_select_commits_and_is_completable_never_answer_without_proof() -> None:
    cc = compile_fresh()
    st = cc.new_canvas_state(64, expand_budget=None, timeout_s=0.05)
    canvas = [MASK] * 64
    # a commit far right of the frontier: verifying it needs the forward sets through 40 open positions
    with pytest.raises(ConstraintTimeoutError) as info_:
        st.select_commits(canvas, [(40, A, 1.0)])
    err = info_.value
    assert err.operation == "select_commits" and err.timeout_s == 0.05
    assert "frontier at position 0" in str(err)
    canvas[40] = A
    try:
        assert st.is_completable(canvas) is completable(canvas)
    except ConstraintTimeoutError as e:
        assert e.operation == "is_completable"


@pytest.mark.parametrize("seed", [0, 1])
def test_after_timeouts_the_shared_constraint_gives_the_masks_of_a_fresh_one(seed: int) -> None:
    rng = random.Random(seed)
    cc = compile_fresh()
    for _ in range(12):  # interrupt the shared automaton at many different points of its growth
        st = cc.new_canvas_state(48, expand_budget=None, timeout_s=rng.choice([1e-4, 1e-3, 5e-3, 2e-2]))
        canvas = [MASK] * 48
        for p in rng.sample(range(48), 6):
            canvas[p] = rng.choice([A, B])
        try:
            st.allowed_tokens(canvas, list(range(48)))
            st.select_commits(canvas, [(p, rng.choice([A, B]), rng.random()) for p in range(0, 48, 7)])
        except ConstraintTimeoutError:
            pass
    dfa = cc.dfa
    n = dfa.n_states
    assert dfa.T.shape[0] == dfa.expanded.shape[0] == dfa.accepting.shape[0] == dfa.dist.shape[0] >= n
    assert len(dfa.term_of) == n
    fresh = compile_fresh()
    for _ in range(40):  # small exact questions: both answer without a deadline and must agree
        n_pos = 26
        canvas = [rng.choice([A, B]) for _ in range(n_pos)]
        for p in rng.sample(range(n_pos), 3):
            canvas[p] = MASK
        if rng.random() < 0.3:
            canvas[-1] = EOS
        a = cc.new_canvas_state(n_pos, expand_budget=None, timeout_s=None)
        b = fresh.new_canvas_state(n_pos, expand_budget=None, timeout_s=None)
        assert a.allowed_sets(canvas) == b.allowed_sets(canvas)
        assert a.is_completable(canvas) == b.is_completable(canvas) == completable(canvas)
        word = bytes(rng.choice(b"ab") for _ in range(rng.randrange(0, 40)))
        sa, sb = dfa.walk(START, word), fresh.dfa.walk(START, word)
        assert (sa == DEAD) == (sb == DEAD)
        assert bool(dfa.accepting[sa]) == bool(fresh.dfa.accepting[sb])
        assert int(dfa.dist[sa]) == int(fresh.dfa.dist[sb])


def test_min_tokens_is_decided_by_work_and_its_time_limit_only_ends_the_call() -> None:
    cc = ConstraintCompiler(info(), cache=False).compile_regex(r"((a|b)*a(a|b){12}){3}")
    t0 = time.perf_counter()
    try:
        answer = cc.min_tokens(timeout_s=1e-4)
    except ConstraintTimeoutError:
        answer = None  # the last resort: no answer, never one that follows the clock
    assert time.perf_counter() - t0 < 0.5 + SLACK_S
    assert answer in (None, 39)
    assert cc.min_tokens(timeout_s=None) == 39


# ---------------------------------------------------------------- through the public API (tiny model)
@pytest.fixture()
def llm(tiny_llada, tiny_tokenizer) -> dc.LLM:
    return dc.LLM.from_model(tiny_llada, tiny_tokenizer)


@pytest.mark.parametrize("timeout", [1e-3, 0.05])
def test_generate_with_a_constraint_timeout_ends_valid_or_with_a_timeout_error(llm, timeout: float) -> None:
    for seed in range(3):
        try:
            text = dc.generate("x", model=llm, regex=EXPLODE, max_new_tokens=40, block_length=40, seed=seed,
                               temperature=0.9, constraint_timeout=timeout)
        except ConstraintTimeoutError as err:
            assert err.kind == "regex"
            continue
        assert re.fullmatch(EXPLODE, text), text


def test_a_timed_out_request_ends_alone_and_the_batch_finishes(llm) -> None:
    slow = llm.compile(regex=EXPLODE)
    easy = llm.compile(regex=r"[0-9]{2,4}")
    params = SamplingParams(max_new_tokens=40, block_length=40, steps=40, temperature=0.9, seed=0)
    ids = llm.encode("x")
    requests = [Request(ids, params, slow.new_canvas_state(40, expand_budget=None, timeout_s=1e-6)),
                Request(ids, params, easy.new_canvas_state(40)),
                Request(ids, params, None)]
    results = llm.engine.generate(requests, raise_errors=False)
    first = results[0]
    assert first.error is None or isinstance(first.error, ConstraintTimeoutError)
    if first.error is None:
        assert re.fullmatch(EXPLODE, first.text)
    assert results[1].error is None and re.fullmatch(r"[0-9]{2,4}", results[1].text)
    assert results[2].error is None
    assert isinstance(llm.engine, LLMEngine)


def test_constraint_timeout_is_validated(llm) -> None:
    with pytest.raises(InvalidRequestError, match="constraint_timeout"):
        dc.generate("x", model=llm, regex="[0-9]", max_new_tokens=4, constraint_timeout=0)
