"""multipleOf a non-integer decimal (0.01, 0.05, 0.25, 0.3) covers the schema's whole range, not only
|value| <= 1000 * step, and every generated number passes python-jsonschema's float test."""
from __future__ import annotations

import json
import random

import pytest

from dllm_constrain.constraints.deriv import DerivDFA
from dllm_constrain.constraints.json_schema import SchemaOptions, schema_to_regex_ast

from test_constraint_json_schema import random_texts, validator


@pytest.mark.parametrize("schema,inside", [
    ({"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 100000}, ["12.5", "9999.75", "99999.25"]),
    ({"type": "number", "multipleOf": 0.01}, ["-12.25", "123456789.5", "1000000"]),
    ({"type": "number", "multipleOf": 0.05, "minimum": 0}, ["150.25", "2500"]),
    ({"type": "number", "multipleOf": 0.25}, ["1234.75", "-88.5"]),
    ({"type": "number", "multipleOf": 0.3, "minimum": -50, "maximum": 5000}, ["4999.5", "-48", "301.5"]),
])
def test_decimal_multiples_cover_the_whole_range_and_every_text_validates(schema, inside):
    dfa = DerivDFA(schema_to_regex_ast(schema, SchemaOptions()))
    v = validator(schema)
    for t in inside:
        assert v.is_valid(json.loads(t)) and dfa.matches(t.encode()), t
    texts = random_texts(dfa, random.Random(0), n=200, max_len=40)
    assert any(abs(float(t)) > 1000 * schema["multipleOf"] for t in texts)
    for t in texts:
        assert v.is_valid(json.loads(t)), t


def test_multiples_the_float_test_rejects_are_never_generated():
    s = {"type": "number", "multipleOf": 0.01}
    dfa = DerivDFA(schema_to_regex_ast(s, SchemaOptions()))
    v = validator(s)
    assert not v.is_valid(0.07) and not dfa.matches(b"0.07")  # 0.07 / 0.01 = 7.000000000000001
    assert not dfa.matches(b"-0") and dfa.matches(b"0")
    for n in range(-3000, 3000, 7):
        t = f"{n / 100:.2f}"
        if dfa.matches(t.encode()):
            assert v.is_valid(json.loads(t)), t
