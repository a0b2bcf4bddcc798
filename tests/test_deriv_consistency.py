"""The lazy derivative DFA is shared by every request of a compiled constraint: an exception raised while it
grows (a deadline, MemoryError, an asynchronous timeout) must leave it consistent, so that later calls work
and agree with a fresh automaton. With either term algebra: the C one (when built) and the Python fallback."""
from __future__ import annotations

import functools
import random

import numpy as np
import pytest

from dllm_constrain.constraints import deriv
from dllm_constrain.constraints.deriv import DEAD, START, DerivDFA, Terms
from dllm_constrain.constraints.native_terms import NativeTerms
from dllm_constrain.constraints.regex_parser import parse_regex
from dllm_constrain.errors import CompilationTimeoutError

from constraint_support import DeadlineAfter

PATTERN = r"(ab|cd|e[f-h]){0,60}z[0-9]{1,3}"  # a few hundred states: the tables grow past 64 and 128 rows


def words(seed: int = 0, n: int = 60) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        body = "".join(rng.choice(["ab", "cd", "eg", "eh", "ax"]) for _ in range(rng.randrange(0, 70)))
        out.append((body + "z" + str(rng.randrange(0, 2000))).encode())
    return out


@pytest.fixture(params=["python", "native"])
def new_dfa(request):
    """A DerivDFA factory on one term algebra (the C one skips when the extension is not built)."""
    if request.param == "native":
        _terms = pytest.importorskip("dllm_constrain.constraints._terms", reason="the C term algebra is not built")
        make_terms = functools.partial(NativeTerms, _terms.TermStore)
    else:
        make_terms = Terms
    return lambda node: DerivDFA(node, terms=make_terms())


def assert_consistent_and_equal_to_fresh(dfa: DerivDFA) -> None:
    n = dfa.n_states
    assert dfa.T.shape[0] == dfa.expanded.shape[0] == dfa.accepting.shape[0] == dfa.dist.shape[0] >= n
    assert len(dfa.term_of) == n
    fresh = DerivDFA(parse_regex(PATTERN).node)
    for w in words():
        for k in (len(w), len(w) // 2, 5):
            a, b = dfa.walk(START, w[:k]), fresh.walk(START, w[:k])
            assert (a == DEAD) == (b == DEAD), w[:k]
            if a != DEAD:
                assert bool(dfa.accepting[a]) == bool(fresh.accepting[b]), w[:k]
                assert int(dfa.dist[a]) == int(fresh.dist[b]), w[:k]
        assert dfa.matches(w) == fresh.matches(w)
    for s in range(1, dfa.n_states):  # every state that exists is whole: its row fields agree with its term
        t = dfa.term_of[s]
        if t >= 0:
            assert bool(dfa.accepting[s]) == dfa.terms.nullable(t)
            assert int(dfa.dist[s]) == dfa.terms.minlen(t)


class _FailingNumpy:
    """Stands in for numpy inside deriv.py: the `fail_at`-th allocation of a grown table (first dimension
    `rows`) raises, as a deadline or an asynchronous timeout delivered during the resize would."""

    def __init__(self, rows: int, fail_at: int) -> None:
        self.rows, self.fail_at, self.seen = rows, fail_at, 0

    def __getattr__(self, name):
        return getattr(np, name)

    def zeros(self, shape, *args, **kwargs):
        first = shape[0] if isinstance(shape, tuple) else shape
        if first == self.rows:
            self.seen += 1
            if self.seen == self.fail_at:
                raise CompilationTimeoutError("deadline delivered while the automaton grew")
        return np.zeros(shape, *args, **kwargs)


@pytest.mark.parametrize("fail_at", [1, 2, 3, 4])
def test_an_exception_while_the_tables_grow_leaves_the_automaton_usable(monkeypatch, new_dfa, fail_at: int) -> None:
    dfa = new_dfa(parse_regex(PATTERN).node)
    assert dfa.T.shape[0] == 64
    monkeypatch.setattr(deriv, "np", _FailingNumpy(rows=128, fail_at=fail_at))
    with pytest.raises(CompilationTimeoutError):
        for w in words():
            dfa.walk(START, w)
    monkeypatch.setattr(deriv, "np", np)
    assert_consistent_and_equal_to_fresh(dfa)


@pytest.mark.parametrize("checks", [1, 2, 7, 40, 65])
def test_a_deadline_firing_in_the_middle_of_an_expansion_leaves_the_automaton_usable(new_dfa, checks: int) -> None:
    dfa = new_dfa(parse_regex(PATTERN).node)
    dfa.deadline = dfa.terms.deadline = DeadlineAfter(checks)
    interrupted = False
    try:
        for w in words():
            dfa.walk(START, w)
    except CompilationTimeoutError:
        interrupted = True
    assert interrupted
    dfa.deadline = dfa.terms.deadline = None
    assert_consistent_and_equal_to_fresh(dfa)


def test_an_exception_while_a_state_is_added_adds_nothing(monkeypatch, new_dfa) -> None:
    dfa = new_dfa(parse_regex(PATTERN).node)
    dfa.walk(START, b"abab")
    n = dfa.n_states
    calls = {"n": 0}
    real = dfa.terms.nullable

    def nullable(t: int) -> bool:
        calls["n"] += 1
        if calls["n"] == 1:
            raise CompilationTimeoutError("deadline expired while the state's properties were computed")
        return real(t)

    monkeypatch.setattr(dfa.terms, "nullable", nullable)
    with pytest.raises(CompilationTimeoutError):
        for w in words():
            dfa.walk(START, w)
    assert dfa.n_states >= n
    monkeypatch.setattr(dfa.terms, "nullable", real)
    assert_consistent_and_equal_to_fresh(dfa)


def test_a_request_interrupted_mid_growth_does_not_break_the_shared_compiled_constraint(monkeypatch) -> None:
    """Other requests on the same compiled constraint keep working and get the masks a fresh compile gives."""
    from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
    from conftest import build_tiny_tokenizer

    info = TokenizerInfo.from_tokenizer(build_tiny_tokenizer(), vocab_size=260, eos_id=1, mask_id=3)
    shared = ConstraintCompiler(info, cache=False).compile_regex(PATTERN)
    grown_at = shared.dfa.T.shape[0] * 2
    monkeypatch.setattr(deriv, "np", _FailingNumpy(rows=grown_at, fail_at=3))
    canvas = [3] * 48
    with pytest.raises(CompilationTimeoutError):
        shared.new_canvas_state(48, expand_budget=None, timeout_s=None).allowed_tokens(canvas, range(48))
    monkeypatch.setattr(deriv, "np", np)
    fresh = ConstraintCompiler(info, cache=False).compile_regex(PATTERN)
    got = shared.new_canvas_state(48, expand_budget=None, timeout_s=None).allowed_tokens(canvas, range(48))
    want = fresh.new_canvas_state(48, expand_budget=None, timeout_s=None).allowed_tokens(canvas, range(48))
    assert got.equal(want)
    assert shared.accepts_text("abcdegz12") and not shared.accepts_text("abz")


def test_a_term_whose_creation_was_interrupted_leaves_no_misaligned_fields() -> None:
    """An asynchronous exception between the field appends of a new term (simulated: a field appended
    alone) must not shift later terms' fields (the Python algebra; the C one creates a term in one step)."""
    dfa = DerivDFA(parse_regex(PATTERN).node, terms=Terms())
    terms = dfa.terms
    terms.a.append("half-made")  # as if interrupted right after the first append
    t = terms.lit(b"qq-new-literal")
    assert terms.a[t] == b"qq-new-literal" and len(terms.a) == len(terms.b) == len(terms.c) == len(terms.kind)
    assert_consistent_and_equal_to_fresh(dfa)
