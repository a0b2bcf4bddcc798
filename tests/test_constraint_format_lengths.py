"""`format` with minLength/maxLength compiles fast (no eager product of the format DFA with a length
counter) and every text validates."""
from __future__ import annotations

import gc
import json
import random
import time

import pytest

from dllm_constrain.constraints.deriv import DerivDFA
from dllm_constrain.constraints.json_schema import SchemaOptions, schema_to_regex_ast

from test_constraint_json_schema import random_texts, validator

CASES = [
    ("email", None, 64), ("email", 6, 254), ("date-time", 20, 30), ("uri", 5, 200), ("uri", None, 2048),
    ("uuid", 36, 36), ("uuid", None, 40), ("ipv4", 7, 15), ("ipv4", None, 10), ("hostname", None, 253),
    ("hostname", 3, 63), ("ipv6", None, 39), ("date", 10, 10), ("json-pointer", 1, 100), ("duration", 2, 20),
]


def _schema(fmt, mn, mx):
    s = {"type": "string", "format": fmt}
    if mn is not None:
        s["minLength"] = mn
    if mx is not None:
        s["maxLength"] = mx
    return s


@pytest.mark.parametrize("fmt,mn,mx", CASES)
def test_a_format_with_length_bounds_compiles_fast_and_every_text_validates(fmt, mn, mx):
    s = _schema(fmt, mn, mx)
    schema_to_regex_ast(s, SchemaOptions())  # the format's own DFA is built once per process
    gc_was = gc.isenabled()
    gc.disable()
    try:
        t = time.perf_counter()
        node = schema_to_regex_ast(s, SchemaOptions())
        dt = time.perf_counter() - t
    finally:
        if gc_was:
            gc.enable()
    # milliseconds when nothing is built eagerly; the eager product took 2.4 s. The bound leaves room for a
    # loaded CI machine and still fails that product.
    assert dt < 1.0, (s, dt)
    dfa = DerivDFA(node)
    v = validator(s)
    texts = random_texts(dfa, random.Random(0), n=30, max_len=300)
    assert texts
    for x in texts:
        assert v.is_valid(json.loads(x)), (s, x)


def test_length_bounds_on_a_format_are_exact_where_the_product_fits():
    dfa = DerivDFA(schema_to_regex_ast(_schema("email", None, 12), SchemaOptions()))
    assert dfa.matches(b'"abcde@ef.com"') and not dfa.matches(b'"abcdef@ef.com"')
    dfa = DerivDFA(schema_to_regex_ast(_schema("uri", 10, 12), SchemaOptions()))
    assert dfa.matches(b'"http://a.b"') and not dfa.matches(b'"http://a"') and not dfa.matches(b'"http://a.b/cd"')
    dfa = DerivDFA(schema_to_regex_ast(_schema("hostname", None, 253), SchemaOptions()))
    assert dfa.matches(json.dumps("a" * 61 + ".example.com").encode())


def test_a_minimum_length_alone_keeps_every_longer_text_of_the_format():
    """With no maximum, the counter saturates at the minimum: texts longer than it are all still there."""
    dfa = DerivDFA(schema_to_regex_ast(_schema("ipv4", 9, None), SchemaOptions()))
    assert dfa.matches(b'"10.0.0.1"') is False  # 8 code points
    assert dfa.matches(b'"10.0.0.12"') and dfa.matches(b'"192.168.100.200"')
    dfa = DerivDFA(schema_to_regex_ast({"type": "string", "pattern": "^a{1,3}$", "minLength": 2}, SchemaOptions()))
    assert dfa.matches(b'"aa"') and dfa.matches(b'"aaa"') and not dfa.matches(b'"a"')
