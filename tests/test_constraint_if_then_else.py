"""if/then/else read as (if AND then) OR (NOT if AND else): values failing `if` stay, also where `if` is a
`pattern` (its negation: strings no regex reading matches)."""
from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_constrain.constraints.deriv import DerivDFA
from dllm_constrain.constraints.json_schema import SchemaOptions, schema_to_regex_ast

from test_constraint_json_schema import random_texts, validator

# small subschemas whose every reading agrees (ASCII patterns on newline-free strings, integer bounds)
_PARTS = [
    {"pattern": "^\\d+$"}, {"pattern": "a"}, {"pattern": "^(a|$)"}, {"pattern": "b$"},
    {"maxLength": 0}, {"minLength": 2}, {"maxLength": 2},
    {"type": "string"}, {"type": "integer"}, {"type": ["string", "null"]},
    {"minimum": 3}, {"maximum": 10}, {"const": "ab"}, {"enum": ["12", "a", 5]},
    {"not": {"pattern": "^a"}}, {"type": "string", "pattern": "^[a-c]{1,3}$"},
]
# candidate values (compact JSON spellings are what the automaton reads)
_VALUES = ["", "a", "ab", "abc", "ba", "b", "12", "1a", "007", "c", 0, 3, 5, 12, -4, None, True]


def _schemas():
    part = st.sampled_from(_PARTS)
    return st.builds(lambda base, i, t, e, has_t, has_e: {
        **base, "if": i, **({"then": t} if has_t else {}), **({"else": e} if has_e else {})},
        st.sampled_from([{}, {"type": "string"}, {"type": ["string", "integer"]}]), part, part, part,
        st.booleans(), st.booleans())


def _compact(v) -> bytes:
    return json.dumps(v, separators=(",", ":")).encode()


def test_a_string_failing_the_if_pattern_is_valid_through_the_absent_else():
    s = {"type": "string", "if": {"pattern": "^\\d+$"}, "then": {"maxLength": 0}}
    dfa = DerivDFA(schema_to_regex_ast(s, SchemaOptions()))
    assert dfa.matches(b'"abc"') and dfa.matches(b'""') and dfa.matches(b'"a1"')
    assert not dfa.matches(b'"12"')


def test_not_pattern_keeps_the_strings_that_do_not_match_and_no_other_type():
    s = {"enum": ["12", "ab", 7], "not": {"pattern": "^\\d"}}
    dfa = DerivDFA(schema_to_regex_ast(s, SchemaOptions()))
    assert dfa.matches(b'"ab"') and not dfa.matches(b'"12"')
    assert not dfa.matches(b"7")  # every number satisfies `pattern`, so fails its negation


@settings(max_examples=120, deadline=None)
@given(_schemas(), st.integers(0, 2**32 - 1))
def test_if_then_else_admits_exactly_what_jsonschema_accepts(schema, seed):
    v = validator(schema)
    valid = [x for x in _VALUES if v.is_valid(x)]
    if not valid:
        return  # (an unsatisfiable schema may stay unsatisfiable on values beyond the candidates)
    dfa = DerivDFA(schema_to_regex_ast(schema, SchemaOptions()))
    for x in _VALUES:
        assert dfa.matches(_compact(x)) == v.is_valid(x), (schema, x)
    for t in random_texts(dfa, random.Random(seed), n=30, max_len=40):
        assert v.is_valid(json.loads(t)), (schema, t)


def test_max_contains_over_a_pattern_counts_the_items_that_match():
    s = {"type": "array", "items": {"type": "string"}, "contains": {"pattern": "a"}, "maxContains": 1}
    dfa = DerivDFA(schema_to_regex_ast(s, SchemaOptions()))
    assert dfa.matches(b'["a","b"]') and not dfa.matches(b'["a","xa"]') and not dfa.matches(b'["b"]')
    v = validator(s)
    for t in random_texts(dfa, random.Random(0), n=50, max_len=40):
        assert v.is_valid(json.loads(t)), t
