"""The prompt format: a schema costs a short field sketch, whatever its size."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_constrain.prompting import SKETCH_BUDGET, format_prompt, schema_sketch

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "email": {"type": "string"}}, "required": ["name", "age"]}


def test_sketch_lists_keys_in_order_and_marks_optional_ones():
    assert schema_sketch(PERSON) == "name, age, email?"


def test_sketch_shows_nested_objects_and_arrays():
    schema = {"type": "object", "required": ["address", "tags"], "properties": {
        "address": {"type": "object", "properties": {"city": {}}, "required": ["city"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "items": {"type": "array", "items": {"type": "object", "properties": {"sku": {}}}}}}
    assert schema_sketch(schema) == "address{city}, tags[], items?[{sku?}]"


def test_sketch_follows_local_refs():
    schema = {"$defs": {"p": {"type": "object", "properties": {"x": {}}, "required": ["x"]}}, "$ref": "#/$defs/p"}
    assert schema_sketch(schema) == "x"


def test_sketch_of_a_non_object_schema_is_its_type():
    assert schema_sketch({"type": "string"}) == "string"
    assert schema_sketch(True) == "any"
    assert schema_sketch({"type": "array", "items": {"type": "integer"}}) == "array[]"


def test_a_huge_schema_costs_at_most_the_budget():
    schema = {"type": "object", "properties": {f"field_number_{i}": {"type": "string"} for i in range(500)}}
    sketch = schema_sketch(schema)
    assert len(sketch) <= SKETCH_BUDGET and sketch.endswith("...")


def test_prompt_layout():
    assert format_prompt("Hi", None) == "Request: Hi\nAnswer: "
    assert format_prompt("Hi", "a, b") == "Request: Hi\nFields: a, b\nAnswer: "


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=4), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_sketch_never_raises_and_stays_within_budget(value):
    sketch = schema_sketch(value if isinstance(value, (dict, bool)) else {"anyOf": [value]})
    assert isinstance(sketch, str) and len(sketch) <= SKETCH_BUDGET
    json.dumps(sketch)


def test_self_referencing_and_very_wide_schemas_are_sketched_quickly():
    wide = {"type": "object", "properties": {f"k{i}": {"$ref": "#"} for i in range(200)}}
    cyclic = {"anyOf": [{"$ref": "#"}, {"properties": {"a": {"$ref": "#"}}}]}
    assert len(schema_sketch(wide)) <= SKETCH_BUDGET
    assert schema_sketch(cyclic).startswith("a")
