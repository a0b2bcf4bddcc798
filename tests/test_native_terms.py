"""The derivative term algebra in C (`_terms.c` behind `NativeTerms`) is the Python `Terms` run faster: for every
regex and schema, the two build the same automaton (the same accepting states, the same shortest completions, the
same dead transitions), and an interruption leaves the C store as usable as the Python one."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_constrain.constraints import _cwalk
from dllm_constrain.constraints.deriv import DEAD, START, DerivDFA
from dllm_constrain.constraints.deriv_terms import Terms
from dllm_constrain.constraints.native_terms import NativeTerms, new_terms
from dllm_constrain.constraints.regex_parser import parse_regex
from dllm_constrain.errors import CompilationTimeoutError

from constraint_support import DeadlineAfter

_terms = pytest.importorskip("dllm_constrain.constraints._terms", reason="the C term algebra is not built")


def native() -> NativeTerms:
    return NativeTerms(_terms.TermStore)


def assert_same_automaton(node, limit: int = 400) -> int:
    """Walk the product of the Python and the C automaton breadth-first over `limit` state pairs."""
    py, c = DerivDFA(node, terms=Terms()), DerivDFA(node, terms=native())
    seen = {(START, START)}
    queue = [(START, START)]
    k = 0
    while queue and k < limit:
        a, b = queue.pop(0)
        k += 1
        assert bool(py.accepting[a]) == bool(c.accepting[b]) and int(py.dist[a]) == int(c.dist[b])
        py.expand(a)
        c.expand(b)
        for byte in range(256):
            x, y = int(py.T[a, byte]), int(c.T[b, byte])
            assert (x == DEAD) == (y == DEAD), (a, b, byte)
            if x != DEAD and (x, y) not in seen:
                seen.add((x, y))
                queue.append((x, y))
    return k


_ATOMS = ["a", "b", "é", "中", "😀", "[a-c]", "[^x]", r"\d", ".", "[α-ω]", r"\w", "[^\"\\\\]", "(ab|cd)", "x{2,3}"]


@st.composite
def regexes(draw, depth: int = 3) -> str:
    if depth == 0 or draw(st.booleans()):
        return draw(st.sampled_from(_ATOMS))
    kind = draw(st.sampled_from(["seq", "alt", "star", "plus", "opt", "count"]))
    if kind in ("seq", "alt"):
        parts = draw(st.lists(regexes(depth - 1), min_size=2, max_size=3))
        return "".join(parts) if kind == "seq" else "(" + "|".join(parts) + ")"
    inner = "(" + draw(regexes(depth - 1)) + ")"
    if kind == "count":
        lo = draw(st.integers(0, 3))
        return inner + "{%d,%d}" % (lo, lo + draw(st.integers(0, 3)))
    return inner + {"star": "*", "plus": "+", "opt": "?"}[kind]


@settings(max_examples=60, deadline=None)
@given(regexes())
def test_the_c_algebra_builds_the_python_algebras_automaton_for_any_regex(pattern: str) -> None:
    assert_same_automaton(parse_regex(pattern).node)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}, "age": {"type": "integer"},
                                      "tags": {"type": "array", "items": {"enum": ["a", "bé", 3]}, "maxItems": 2}},
     "required": ["name"]},
    {"type": "object", "properties": {"a": {"type": "number", "minimum": -1.5, "maximum": 20}},
     "additionalProperties": {"type": "boolean"}, "minProperties": 1},
    {"anyOf": [{"type": "string", "pattern": "^[A-Z]{2}[0-9]+$"}, {"type": "null"},
               {"type": "string", "format": "date"}]},
    {"type": "array", "items": {"type": "object", "properties": {"k": {"const": "v"}}}, "uniqueItems": False},
], ids=["members", "extra-properties", "patterns-and-formats", "nested"])
def test_the_c_algebra_builds_the_python_algebras_automaton_for_schemas(schema) -> None:
    from dllm_constrain.constraints.deadline import Deadline
    from dllm_constrain.constraints.json_schema import SchemaOptions, schema_to_regex_ast

    node = schema_to_regex_ast(schema, SchemaOptions.from_options(), Deadline(30.0))
    assert assert_same_automaton(node, limit=600) > 20


def test_the_first_byte_of_a_shortest_member_agrees_with_the_python_algebra() -> None:
    node = parse_regex(r"(abc|x[0-9]{2}|é+)?zz|q(r|st)*").node
    py, c = DerivDFA(node, terms=Terms()), DerivDFA(node, terms=native())
    for dfa in (py, c):
        t = dfa.term_of[START]
        b = dfa.terms.shortest_first_byte(t)
        assert b == ord("q")
        assert dfa.terms.minlen(dfa.terms.deriv(t, b)) == dfa.terms.minlen(t) - 1


_LONG = r"(ab|cd|e[f-h]|[α-ω]x){0,5000}z[0-9]{1,3}"
_WORD = ("ab" * 1500 + "αx" * 1000 + "cd" * 1400 + "z7").encode()


def _store_checks() -> int:
    """How many times the C store checks the deadline while one automaton walks _WORD."""
    dfa = DerivDFA(parse_regex(_LONG).node, terms=native())
    counter = DeadlineAfter(-1)
    dfa.terms.deadline = counter
    dfa.walk(START, _WORD)
    return -1 - counter.n


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_deadline_firing_inside_the_c_store_leaves_it_usable(where: str) -> None:
    """The store checks the deadline every 4096 new terms, deep inside a derivative: what it built before is
    whole, and the same automaton built on from there agrees with a fresh one."""
    total = _store_checks()
    assert total >= 3
    node = parse_regex(_LONG).node
    dfa = DerivDFA(node, terms=native())
    dfa.terms.deadline = DeadlineAfter({"first": 1, "middle": total // 2, "last": total}[where])
    with pytest.raises(CompilationTimeoutError):
        dfa.walk(START, _WORD)
    dfa.terms.deadline = None
    fresh = DerivDFA(node, terms=Terms())
    for k in (0, 1, 50, 3001, 5003, len(_WORD) - 1, len(_WORD)):
        a, b = dfa.walk(START, _WORD[:k]), fresh.walk(START, _WORD[:k])
        assert (a == DEAD) == (b == DEAD) and int(dfa.dist[a]) == int(fresh.dist[b])
    assert dfa.matches(_WORD) and not dfa.matches(_WORD + b"0000")


def test_the_python_algebra_is_used_when_native_code_is_switched_off(monkeypatch) -> None:
    monkeypatch.setenv(_cwalk.NO_C_ENV, "1")
    assert type(new_terms()) is Terms
    monkeypatch.delenv(_cwalk.NO_C_ENV)
    assert type(new_terms()) is NativeTerms
