"""multipleOf a non-integer decimal (0.01, 0.05, 0.25, 0.3) covers the schema's whole range, not only
|value| <= 1000 * step, and every generated number passes python-jsonschema's float test."""
from __future__ import annotations

import json
import random
from decimal import Decimal

import pytest

from dllm_constrain.constraints.deriv import DerivDFA
from dllm_constrain.constraints.json_schema import SchemaOptions, schema_to_regex_ast
from dllm_constrain.errors import InvalidOptionError

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


def _cents(n: int) -> str:
    return format((Decimal(n) / 100).normalize(), "f")


def test_the_float_reading_admits_exactly_what_jsonschema_accepts_across_a_price_range():
    s = {"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 1000}
    dfa = DerivDFA(schema_to_regex_ast(s, SchemaOptions()))
    v = validator(s)
    for n in list(range(0, 100001, 37)) + [99999, 100000, 100001, -1]:
        t = _cents(n)
        assert dfa.matches(t.encode()) == v.is_valid(json.loads(t)), t
    assert dfa.matches(b"999.99") and not dfa.matches(b"19.99")  # 19.99 / 0.01 is 1998.9999999999998


def test_the_float_reading_is_exact_in_a_window_nearest_zero_and_quarters_beyond():
    s = {"type": "number", "multipleOf": 0.01}
    dfa = DerivDFA(schema_to_regex_ast(s, SchemaOptions()))
    v = validator(s)
    for n in range(-65536, 65537, 53):
        t = _cents(n)
        assert dfa.matches(t.encode()) == v.is_valid(json.loads(t)), t
    assert dfa.matches(b"-15.07") and dfa.matches(b"13790.75") and not dfa.matches(b"13790.86")


@pytest.mark.parametrize("schema,inside,outside", [
    ({"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 1000},
     ["19.99", "999.99", "0.07", "1000", "0"], ["1000.01", "-0.01", "0.001"]),
    ({"type": "number", "multipleOf": 0.01}, ["13790.86", "-15.07", "1234.56", "19.99"], ["0.015", "-0"]),
    ({"type": "number", "multipleOf": 0.3, "exclusiveMaximum": 3}, ["2.7", "-0.3", "0.9"], ["3", "1", "0.1"]),
])
def test_the_decimal_reading_admits_every_decimal_multiple_in_the_range(schema, inside, outside):
    dfa = DerivDFA(schema_to_regex_ast(schema, SchemaOptions(multiple_of="decimal")))
    for t in inside:
        assert dfa.matches(t.encode()), t
    for t in outside:
        assert not dfa.matches(t.encode()), t
    for t in random_texts(dfa, random.Random(0), n=100, max_len=30):
        assert Decimal(t.decode()) % Decimal(str(schema["multipleOf"])) == 0, t


def test_an_unknown_multiple_of_reading_is_a_typed_error():
    with pytest.raises(InvalidOptionError, match="multiple_of"):
        SchemaOptions(multiple_of="exact")


def test_the_reading_travels_as_a_schema_option_of_a_request(tiny_llada, tiny_tokenizer):
    import dllm_constrain as dc

    llm = dc.LLM.from_model(tiny_llada, tiny_tokenizer)
    s = {"type": "number", "multipleOf": 0.01, "minimum": 0}
    assert not llm.compile(schema=s).accepts_text("19.99")
    assert llm.compile(schema=s, schema_options={"multiple_of": "decimal"}).accepts_text("19.99")
