"""The strict narrowings `generate()` applies by default (STRICT_SCHEMA_OPTIONS) never turn a satisfiable
schema into UnsatisfiableSchemaError: where a narrowing would leave a node empty, that node falls back to
the specification's semantics; every accepted text still validates."""
from __future__ import annotations

import json
import random

import pytest

from dllm_constrain.api import STRICT_SCHEMA_OPTIONS
from dllm_constrain.constraints.deriv import DerivDFA
from dllm_constrain.constraints.json_schema import SchemaOptions, schema_to_regex_ast
from dllm_constrain.errors import UnsatisfiableSchemaError

from test_constraint_json_schema import random_texts, validator

STRICT = SchemaOptions(**STRICT_SCHEMA_OPTIONS)

# satisfiable schemas that a strict narrowing alone would empty (with the narrowing named), plus a value
# the fallback must accept
SATISFIABLE = [
    # additional_properties="forbid": nothing declared, at least one property needed
    ({"type": "object", "minProperties": 1}, {"x": 1}),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "minProperties": 2}, {"a": "s", "b": 0}),
    # required names missing from `properties`
    ({"type": "object", "required": ["a"]}, {"a": [1, {"b": None}]}),
    ({"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["a", "b"]}, {"b": 1, "a": "x"}),
    ({"type": "object", "properties": {"o": {"type": "object", "required": ["id"]}}, "required": ["o"]},
     {"o": {"id": 3}}),
    ({"type": "object", "dependentRequired": {"a": ["c"]}, "properties": {"a": {"type": "integer"}},
      "required": ["a"]}, {"a": 1, "c": True}),
    # an optional property whose schema is empty next to a required undeclared name
    ({"type": "object", "properties": {"level": {"enum": [1, 2], "type": "string"}}, "required": ["type"]},
     {"type": "t"}),
    # additional_names="nonempty": only the empty name is allowed
    ({"type": "object", "minProperties": 1, "propertyNames": {"maxLength": 0}}, {"": 1}),
    ({"type": "object", "required": [""]}, {"": None}),
    # untyped_types="inferred": the implied type is empty, the other types are not constrained
    ({"minimum": 5, "maximum": 3}, "x"),
    ({"minLength": 3, "maxLength": 2}, 7),
    ({"required": ["a"], "properties": {"a": False}}, []),
    ({"minItems": 2, "maxItems": 1}, {}),
    ({"type": "array", "items": {"minimum": 2, "exclusiveMaximum": 2}, "minItems": 1}, ["s"]),
    ({"anyOf": [{"multipleOf": 2, "minimum": 3, "maximum": 3}, {"type": "null"}]}, "s"),
    # nested: the fallback is per node, the rest stays narrowed
    ({"type": "object", "properties": {"meta": {"type": "object", "minProperties": 1},
                                       "n": {"type": "integer"}}, "required": ["meta", "n"]},
     {"meta": {"k": "v"}, "n": 1}),
    # property_order="declared", integer_zero_fraction="never", any_json_depth=3 never empty a schema
    ({"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
      "required": ["a", "b"]}, {"b": 1, "a": 2}),
    ({"type": "integer", "minimum": 1, "maximum": 1}, 1),
    ({"type": "array", "items": True, "minItems": 1}, [[[[1]]]]),
]


@pytest.mark.parametrize("schema,value", SATISFIABLE)
def test_strict_compilation_of_a_satisfiable_schema_is_never_empty_and_every_text_validates(schema, value):
    dfa = DerivDFA(schema_to_regex_ast(schema, STRICT))
    v = validator(schema)
    assert v.is_valid(value)
    texts = random_texts(dfa, random.Random(0), n=25, max_len=200)
    assert texts
    for t in texts:
        assert v.is_valid(json.loads(t)), (schema, t)


@pytest.mark.parametrize("schema,value", [
    ({"type": "object", "required": ["a"]}, {"a": 1}),
    ({"type": "object", "minProperties": 1}, {"x": 1}),
    ({"type": "object", "minProperties": 1, "propertyNames": {"maxLength": 0}}, {"": 1}),
    ({"minimum": 5, "maximum": 3}, "x"),
])
def test_the_fallback_accepts_the_values_the_narrowing_lost(schema, value):
    dfa = DerivDFA(schema_to_regex_ast(schema, STRICT))
    assert dfa.matches(json.dumps(value, separators=(",", ":")).encode())


def test_the_fallback_is_per_node_and_keeps_the_narrowing_elsewhere():
    s = {"type": "object", "properties": {"meta": {"type": "object", "minProperties": 1},
                                          "n": {"type": "integer"}}, "required": ["meta", "n"]}
    dfa = DerivDFA(schema_to_regex_ast(s, STRICT))
    assert dfa.matches(b'{"meta":{"k":1},"n":1}')
    assert not dfa.matches(b'{"meta":{"k":1},"n":1,"z":0}')  # the root still forbids undeclared properties
    assert not dfa.matches(b'{"meta":{"k":1},"n":1.0}')


def test_required_undeclared_names_take_free_form_values_and_nothing_else_is_added():
    s = {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["a", "b"]}
    dfa = DerivDFA(schema_to_regex_ast(s, STRICT))
    assert dfa.matches(b'{"b":1,"a":{"x":[true]}}')
    assert not dfa.matches(b'{"b":1,"a":2,"c":3}')


@pytest.mark.parametrize("schema", [
    {"type": "object", "required": ["a"], "additionalProperties": False},
    {"type": "object", "minProperties": 1, "additionalProperties": False},
    {"type": "integer", "minimum": 5, "maximum": 4},
    {"type": "object", "properties": {"a": False}, "required": ["a"]},
])
def test_schemas_unsatisfiable_under_the_specification_stay_unsatisfiable(schema):
    with pytest.raises(UnsatisfiableSchemaError) as e:
        schema_to_regex_ast(schema, STRICT)
    assert "strict=False" not in str(e.value)
