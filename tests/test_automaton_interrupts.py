"""A compiled constraint stays whole whatever interrupts a call into it (KeyboardInterrupt in a notebook, a
signal-based timeout): the next call gives what an uninterrupted automaton gives, and the compile cache never hands
back an object an interrupted compilation left half built.

The interrupts are injected by a tracing hook that raises at the n-th Python event (a call, a line, a return) inside
the package, for every n that an uninterrupted run reaches: every point where a signal handler could run. Lines that
open a `with` block are left out: a tracer sees such a line again when the block ends normally, before `__exit__`
runs (a lock would stay held), where CPython never runs a signal handler (it checks for signals at calls and
backward jumps, and the line before the exit is inside the block)."""
from __future__ import annotations

import gc

import functools
import linecache
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from conftest import build_tiny_tokenizer
import dllm_constrain
from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.constraints.compiler import CompileCache, CompiledConstraint
from dllm_constrain.constraints.deriv import START
from dllm_constrain.constraints.regex_parser import parse_regex
from dllm_constrain.constraints.token_automaton import TokenAutomaton

PACKAGE = os.path.dirname(dllm_constrain.__file__)
PATTERN = r'[a-z0-9]+(,"[a-z ]{0,3}")*'


class Injected(BaseException):
    """What the hook raises: like KeyboardInterrupt, not an Exception a caller would catch."""


@pytest.fixture(scope="module")
def info() -> TokenizerInfo:
    return TokenizerInfo.from_tokenizer(build_tiny_tokenizer(), eos_id=1, vocab_size=260)


def run_traced(fn: Callable[[], Any], stop_at: int | None = None) -> int:
    """Run fn with a hook counting the Python events (call, line, return) in the package's frames; with
    `stop_at`, raise Injected at that event. Returns the count of events (fn ran whole)."""
    count = [0]

    def hook(frame: Any, event: str, arg: Any) -> Any:
        if not frame.f_code.co_filename.startswith(PACKAGE):
            return None
        if event == "line" and opens_with_block(frame.f_code.co_filename, frame.f_lineno):
            return hook
        count[0] += 1
        if count[0] == stop_at:
            raise Injected(f"event {stop_at}")
        return hook

    sys.settrace(hook)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count[0]


@functools.lru_cache(maxsize=None)
def opens_with_block(filename: str, lineno: int) -> bool:
    return linecache.getline(filename, lineno).lstrip().startswith("with ")


def explore(ta: TokenAutomaton) -> list[int]:
    """Every state reachable from the start, each one's transitions computed (breadth first)."""
    seen, todo = [START], [START]
    while todo:
        q = todo.pop(0)
        for u in ta.trans(q).targets:
            if u not in seen:
                seen.append(u)
                todo.append(u)
    return seen


def observed(ta: TokenAutomaton) -> dict:
    """What callers see of an automaton, up to the numbering of its states (an interrupted DFA expansion may leave
    an unreachable state behind, so later states can take other ids): per reachable state, numbered breadth first
    with each state's targets in the order of their smallest token, whether it accepts, the tokens into each target
    and every allowed token (through the interned rows), the mask row the row store builds from it; and that the
    interned rows and the row store are in step."""
    states = explore(ta)
    every = sum(1 << q for q in states)

    def tokens(tt: Any, u: int) -> tuple[int, ...]:
        if u in tt.dense:
            return tuple(np.flatnonzero(np.unpackbits(ta.allp[tt.dense[u]], bitorder="little")).tolist())
        return tuple(tt.sparse[u].tolist())

    canon = {START: 0}
    order = [START]
    for q in order:
        tt = ta.trans(q)
        for u in sorted(tt.targets, key=lambda u: tokens(tt, u)[0]):  # noqa: B023
            if u not in canon:
                canon[u] = len(canon)
                order.append(u)
    out: dict = {"in_step": ta.n_allp == ta.row_store.n_rows, "states": len(order)}
    for q in order:
        tt = ta.trans(q)
        row, unknown = ta.set_row(1 << q, every)
        out[canon[q]] = (bool(ta.dfa.accepting[q]), {canon[u]: tokens(tt, u) for u in tt.targets},
                         ta.packed_row([q], [], False).tobytes(), row.tobytes(), unknown)
    return out


def fresh(info: TokenizerInfo) -> CompiledConstraint:
    return ConstraintCompiler(info, cache=False).compile(regex=PATTERN)


def test_the_reference_automaton_uses_the_row_store_and_interned_rows(info) -> None:
    cc = fresh(info)
    reference = observed(cc.ta)
    assert cc.ta.row_store is not None and cc.ta.n_allp > 0  # the publication paths under test are reached
    assert reference["states"] > 3 and reference["in_step"]


def test_an_interrupt_at_any_point_of_trans_leaves_the_automaton_as_if_uninterrupted(info) -> None:
    reference = observed(fresh(info).ta)
    untouched = fresh(info)
    n_events = run_traced(lambda: explore(untouched.ta))
    assert n_events > 100
    for n in range(1, n_events + 1):
        cc = fresh(info)
        with pytest.raises(Injected):
            run_traced(lambda: explore(cc.ta), stop_at=n)  # noqa: B023
        assert observed(cc.ta) == reference, f"interrupted at event {n}"


class _InterruptAfterAddState:
    """A row store whose next add_state completes and then raises, as a signal handler running right after it
    would: the window between the row store's entry and the automaton's table."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.armed = True

    def add_state(self, *args: Any) -> None:
        self.store.add_state(*args)
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_an_interrupt_after_the_row_store_entry_does_not_poison_the_state(info) -> None:
    reference = observed(fresh(info).ta)
    cc = fresh(info)
    cc.ta.row_store = _InterruptAfterAddState(cc.ta.row_store)
    with pytest.raises(KeyboardInterrupt):
        cc.ta.trans(START)
    assert cc.ta.known_trans(START) is None  # not published: the next call computes it again
    cc.ta.row_store = cc.ta.row_store.store
    assert observed(cc.ta) == reference


def test_an_interrupted_compile_is_never_cached(info) -> None:
    """The compile cache stores a constraint only once its build returned: after an interrupt at any point of a
    compilation the cache holds nothing for it, or (interrupted after the build) a whole constraint."""
    reference = observed(fresh(info).ta)
    compiler = ConstraintCompiler(info, cache=CompileCache())
    parse_regex.cache_clear()  # the parse runs (and is interrupted) in every compilation below
    n_events = run_traced(lambda: compiler.compile(regex=PATTERN))
    for n in range(1, n_events + 1):
        parse_regex.cache_clear()
        cache = CompileCache()
        compiler = ConstraintCompiler(info, cache=cache)
        try:
            run_traced(lambda: compiler.compile(regex=PATTERN), stop_at=n)  # noqa: B023
        except Injected:
            pass
        finally:
            # an interrupt inside the compilation's `finally` (before it turns the cyclic collector back on) leaves
            # the collector off, as it would after a real signal there; the tests after this one need it on
            gc.enable()
        cc = compiler.compile(regex=PATTERN)
        assert isinstance(cc, CompiledConstraint) and observed(cc.ta) == reference, f"interrupted at event {n}"
        assert len(cache) == 1 and compiler.compile(regex=PATTERN) is cc
