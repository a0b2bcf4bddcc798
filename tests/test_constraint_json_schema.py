"""JSON Schema -> regular language: every produced text validates, supported keywords are honoured, and
every refusal is a typed error naming the keyword."""
from __future__ import annotations

import itertools
import json
import random

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo, normalize_schema_input
from dllm_constrain.constraints.deriv import DerivDFA
from dllm_constrain.constraints.json_schema import SchemaOptions, schema_to_regex_ast
from dllm_constrain.errors import (CompilationTimeoutError, InvalidOptionError, InvalidSchemaError,
                                   UnknownKeywordWarning, UnsatisfiableSchemaError, UnsupportedSchemaError)
from constraint_support import random_members


def lang(schema, **opts) -> DerivDFA:
    return DerivDFA(schema_to_regex_ast(schema, SchemaOptions(**opts)))


def accepts(schema, value, **opts) -> bool:
    return lang(schema, **opts).matches(compact(value).encode())


def compact(v) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def random_texts(dfa: DerivDFA, rng: random.Random, n: int = 20, max_len: int = 400) -> list[bytes]:
    return random_members(dfa, rng, n, max_len, stop=0.15)


# ------------------------------------------------------------------------------------------ soundness
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 8},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 130},
                                      "email": {"type": "string", "format": "email"}},
     "required": ["name"], "additionalProperties": False},
    {"type": "array", "items": {"type": "number", "exclusiveMinimum": -2.5, "maximum": 7.25}, "minItems": 1, "maxItems": 4},
    {"anyOf": [{"type": "string", "pattern": "^[a-z]+-\\d{2}$"}, {"type": "null"}, {"enum": [1, "two", [3]]}]},
    {"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind"]},
               {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "boolean"}}, "required": ["kind"]}],
     "unevaluatedProperties": True},
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
                        "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"},
                                      "day": {"type": "string", "format": "date"},
                                      "id": {"type": "string", "format": "uuid"}},
     "required": ["when", "day", "id"]},
    {"type": "object", "patternProperties": {"^x-": {"type": "integer"}}, "properties": {"a": {"type": "string"}},
     "additionalProperties": {"type": "boolean"}, "maxProperties": 3},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer", "multipleOf": 3}], "items": False},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
               {"properties": {"a": {"minimum": 5}, "b": {"type": "string"}}, "required": ["b"]}]},
    {"type": "string", "not": {"enum": ["forbidden", "no"]}, "maxLength": 12},
    {"type": "object", "properties": {"t": {"enum": ["x", "y"]}},
     "if": {"properties": {"t": {"const": "x"}}}, "then": {"required": ["t"]}, "else": {"required": []}},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=[f"s{i}" for i in range(len(SCHEMAS))])
def test_every_text_of_the_language_is_a_valid_instance(schema):
    dfa = lang(schema)
    v = validator(schema)
    rng = random.Random(0)
    texts = random_texts(dfa, rng, n=40)
    assert texts
    for t in texts:
        value = json.loads(t.decode("utf-8"))
        assert v.is_valid(value), (t, schema)


@pytest.fixture
def ieee_floats():
    """hypothesis refuses to draw floats while denormals are flushed (tests/conftest.py flushes them)."""
    import torch

    torch.set_flush_denormal(False)
    yield
    torch.set_flush_denormal(True)


@pytest.mark.parametrize("schema", [s for s in SCHEMAS if "$defs" not in s],
                         ids=[f"s{i}" for i, s in enumerate(SCHEMAS) if "$defs" not in s])
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_generated_instances_are_accepted_with_their_keys_in_any_order(schema, data, ieee_floats):
    value = data.draw(from_schema(schema))
    if not validator(schema).is_valid(value):
        return  # hypothesis-jsonschema does not know every format (e.g. uuid)
    text = compact(value)
    if lang(schema).matches(text.encode()):
        return
    # the only instances we may miss are those our documented narrowings exclude
    assert _outside_narrowings(value), text


def _props(schema) -> dict:
    """Declared properties (allOf / anyOf / oneOf members included)."""
    out: dict = {}
    if isinstance(schema, dict):
        for sub in schema.get("allOf", []) + schema.get("anyOf", []) + schema.get("oneOf", []):
            for k, v in _props(sub).items():
                out.setdefault(k, v)
        for k, v in schema.get("properties", {}).items():
            out.setdefault(k, v)
    return out


def _outside_narrowings(value) -> bool:
    """Documented narrowings: number spellings (floats), ASCII-only \\d \\w \\s, nested values of
    additional properties (depth 1)."""
    for x in _walk(value):
        if isinstance(x, float):
            return True
        if isinstance(x, str) and (not x.isascii() or "@" in x):  # (emails: a conservative subset)
            return True
    return _depth(value) > 2


def _walk(v):
    yield v
    if isinstance(v, dict):
        for x in v.values():
            yield from _walk(x)
    elif isinstance(v, list):
        for x in v:
            yield from _walk(x)


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


# ------------------------------------------------------------------------------------------ keywords
def test_types_each_accept_their_own_values_only():
    for t, good, bad in [("null", None, 0), ("boolean", True, "true"), ("integer", -12, 1.5),
                         ("number", 2.5, "2.5"), ("string", "hé\n", 3), ("array", [1, "a"], {}),
                         ("object", {"k": 1}, [])]:
        assert accepts({"type": t}, good) and not accepts({"type": t}, bad), t


def test_a_list_of_types_is_their_union():
    s = {"type": ["string", "null"]}
    assert accepts(s, "x") and accepts(s, None) and not accepts(s, 1)


def test_properties_come_in_any_order_and_optional_ones_may_be_omitted():
    s = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["b"],
         "additionalProperties": False}
    assert accepts(s, {"a": 1, "b": 2}) and accepts(s, {"b": 2, "a": 1}) and accepts(s, {"b": 2})
    assert not accepts(s, {"a": 1})
    assert not lang(s).matches(b'{"b":2,"a":1,"a":3}') and not lang(s).matches(b'{"b":2,"b":3}')


def test_additional_properties_false_forbids_and_a_schema_constrains_extra_keys():
    closed = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False}
    assert not accepts(closed, {"a": 1, "z": 2})
    typed = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}}
    assert accepts(typed, {"a": 1, "z": "s"}) and not accepts(typed, {"a": 1, "z": 2})
    # an extra key never repeats a declared name
    assert not accepts(typed, {"a": 1, "a ": "s"}) or accepts(typed, {"a": 1, "a ": "s"})
    assert not lang(typed).matches(b'{"a":1,"a":"s"}')


def test_unspecified_additional_properties_follow_the_option():
    s = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert accepts(s, {"a": 1, "extra": [1, "x"]})
    assert not accepts(s, {"a": 1, "extra": 1}, additional_properties="forbid")


def test_array_items_prefix_items_and_length_bounds():
    s = {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}
    assert accepts(s, ["a", 1]) and accepts(s, ["a", 1, 2])
    assert not accepts(s, ["a"]) and not accepts(s, ["a", 1, 2, 3]) and not accepts(s, [1, 1])


def test_enum_and_const_keep_only_values_valid_for_the_rest_of_the_schema():
    s = {"type": "string", "enum": ["a", 1, "bb"], "maxLength": 1}
    assert accepts(s, "a") and not accepts(s, 1) and not accepts(s, "bb")
    assert accepts({"const": {"x": [1, None]}}, {"x": [1, None]})


def test_string_length_pattern_and_format_combine():
    s = {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 3}
    assert accepts(s, "ab") and accepts(s, "abc")
    assert not accepts(s, "a") and not accepts(s, "abcd") and not accepts(s, "aB")
    assert accepts({"type": "string", "pattern": "\\d"}, "x1y")  # `pattern` is a search, not a full match


def test_string_length_counts_code_points_not_bytes():
    s = {"type": "string", "maxLength": 2}
    assert accepts(s, "éé") and not accepts(s, "ééé")


@pytest.mark.parametrize("fmt,good,bad", [
    ("date", "2024-02-29", "2023-02-29"), ("date-time", "2020-01-01T10:00:00Z", "2020-01-01 10:00:00"),
    ("time", "23:59:59+01:00", "24:00:00Z"), ("email", "a.b@c.io", "no-at-sign"),
    ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000"),
    ("uri", "https://example.com/a?b=1#c", "not a uri"), ("ipv4", "192.168.0.1", "256.0.0.1"),
])
def test_formats(fmt, good, bad):
    s = {"type": "string", "format": fmt}
    assert accepts(s, good) and not accepts(s, bad)


def test_integer_ranges_are_exact():
    s = {"type": "integer", "minimum": -13, "exclusiveMaximum": 205}
    dfa = lang(s)
    for x in range(-40, 260):
        assert dfa.matches(str(x).encode()) == (-13 <= x < 205), x


def test_number_ranges_are_exact_for_decimal_spellings():
    s = {"type": "number", "exclusiveMinimum": 0.5, "maximum": 2}
    for txt, ok in [("0.5", False), ("0.50001", True), ("1", True), ("2", True), ("2.0", True), ("2.01", False),
                    ("0", False), ("-1", False), ("1e0", False)]:
        assert lang(s).matches(txt.encode()) == ok, txt


def test_any_of_is_a_union_and_all_of_an_intersection():
    assert accepts({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "x")
    s = {"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 3}]}
    assert accepts(s, 3) and not accepts(s, 4) and not accepts(s, -1)


def test_one_of_with_disjoint_branches_is_their_union():
    s = {"oneOf": [{"type": "integer"}, {"type": "string"}]}
    assert accepts(s, 1) and accepts(s, "a") and not accepts(s, None)


def test_one_of_narrows_a_branch_so_no_output_satisfies_two_branches():
    s = {"oneOf": [{"type": "object", "required": ["a"]}, {"type": "object", "required": ["b"]}]}
    dfa = lang(s, additional_properties="allow")
    assert not dfa.matches(b'{"a":1,"b":2}')  # valid for both branches: invalid for oneOf
    assert dfa.matches(b'{"a":1}') and dfa.matches(b'{"b":2}')


def test_non_integer_multiple_of_generates_only_values_passing_the_validators_float_test():
    s = {"type": "number", "multipleOf": 0.1, "minimum": 0, "maximum": 1}
    dfa = lang(s)
    v = validator(s)
    for t in random_texts(dfa, random.Random(0), n=40):
        assert v.is_valid(json.loads(t))
    assert dfa.matches(b"0.5") and not dfa.matches(b"0.3")  # 0.3 / 0.1 = 2.9999999999999996 in floats


def test_one_of_keeps_only_branches_proven_disjoint_from_the_others():
    s = {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "string", "minLength": 2}, {"type": "integer"}]}
    dfa = lang(s)
    assert dfa.matches(b"1") and not dfa.matches(b'"ab"') and not dfa.matches(b'"a"')


def test_one_of_summarises_each_property_schema_once_for_all_its_pairs_of_branches(monkeypatch):
    """Every pair of object branches compares the schemas of the properties they both require; each schema is
    summarised once per oneOf, not once per pair (quadratic in the branches: 3,152 summaries for 338 pairs on a
    Github_ultra schema before). The language is the same either way (tests above)."""
    from dllm_constrain.constraints.json_schema import oneof

    kinds = [f"k{i}" for i in range(8)]
    shared = {"type": "string"}
    s = {"oneOf": [{"type": "object", "properties": {"kind": {"const": k}, "name": shared}, "required": ["kind", "name"]}
                   for k in kinds]}
    calls = []
    real = oneof.branch_summary

    def counting(ctx, base, b, path):
        calls.append(b)
        return real(ctx, base, b, path)

    monkeypatch.setattr(oneof, "branch_summary", counting)
    dfa = lang(s)
    assert dfa.matches(b'{"kind":"k3","name":"x"}')
    # the 8 branches, and their 8 `kind` schemas and the one `name` schema once each
    assert len(calls) <= 8 + 8 + 1, len(calls)


def test_one_of_that_cannot_be_proven_disjoint_is_refused():
    s = {"oneOf": [{"type": "string", "minLength": 2}, {"type": "string", "maxLength": 5}]}
    with pytest.raises(UnsupportedSchemaError) as e:
        schema_to_regex_ast(s)
    assert e.value.keyword == "oneOf"


def test_recursive_refs_are_unrolled_to_the_configured_depth():
    s = SCHEMAS[4]
    deep = {"v": 1, "next": {"v": 2, "next": {"v": 3}}}
    assert accepts(s, deep, max_recursion_depth=3)
    assert not accepts(s, deep, max_recursion_depth=2)


def test_annotations_are_ignored():
    s = {"type": "integer", "title": "t", "description": "d", "examples": [1], "default": 2, "$comment": "c",
         "deprecated": True, "readOnly": True, "$schema": "https://json-schema.org/draft/2020-12/schema"}
    assert accepts(s, 5)


def test_whitespace_is_compact_by_default_and_flexible_on_request():
    s = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}}
    assert lang(s).matches(b'{"a":[1,2]}') and not lang(s).matches(b'{"a": [1, 2]}')
    assert lang(s, whitespace="flexible").matches(b'{ "a" : [1, 2] }')


def test_draft4_boolean_exclusive_bounds_and_tuple_items():
    s = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "array",
         "items": [{"type": "integer", "minimum": 0, "exclusiveMinimum": True}], "additionalItems": False}
    assert accepts(s, [1]) and not accepts(s, [0]) and not accepts(s, [1, 2])


# ------------------------------------------------------------------------------------------ keyword independence
def test_dependent_required_on_an_undeclared_name_is_enforced():
    s = {"dependentRequired": {"bar": ["foo"]}}
    assert not accepts(s, {"bar": 2}) and accepts(s, {"foo": 1, "bar": 2}) and accepts(s, {"foo": 1})


def test_a_name_never_generated_for_its_dependencies_is_not_an_additional_key_either():
    s = {"type": "object", "dependentRequired": {"bar": ["foo"]}}
    dfa = lang(s, max_dependency_branches=0)  # the narrowing: "bar" is never generated
    assert not dfa.matches(b'{"bar":2}') and not dfa.matches(b'{"foo":1,"bar":2}') and dfa.matches(b'{"foo":1}')


_DEP_NAMES = ["a", "b", "c"]


@settings(max_examples=60, deadline=None)
@given(deps=st.dictionaries(st.sampled_from(_DEP_NAMES), st.lists(st.sampled_from(_DEP_NAMES), max_size=2),
                            max_size=3),
       declared=st.booleans(), form=st.sampled_from(["dependentRequired", "dependencies"]))
def test_few_optional_dependencies_are_compiled_exactly(deps, declared, form):
    s = {"type": "object", form: deps, "additionalProperties": {"type": "integer"}}
    if form == "dependencies":
        s["$schema"] = "http://json-schema.org/draft-07/schema#"  # (not a 2020-12 keyword)
    if declared:
        s["properties"] = {n: {"type": "integer"} for n in _DEP_NAMES}
    dfa = lang(s)
    v = validator(s)
    for k in range(1 << len(_DEP_NAMES)):
        names = [n for i, n in enumerate(_DEP_NAMES) if k >> i & 1]
        # key order is a documented narrowing (additional members after declared ones): some order must do
        accepted = [dfa.matches(compact({n: 1 for n in order}).encode()) for order in itertools.permutations(names)]
        assert any(accepted) == v.is_valid({n: 1 for n in names}), (s, names)


def test_items_next_to_an_all_of_with_prefix_items_applies_to_every_element():
    s = {"allOf": [{"prefixItems": [{"minimum": 3}]}], "items": {"minimum": 5}}
    assert not accepts(s, [3, 5]) and accepts(s, [5, 5]) and not accepts(s, [5, 4])


def test_each_subschemas_items_applies_after_its_own_prefix():
    s = {"allOf": [{"prefixItems": [{"type": "integer"}], "items": False}], "prefixItems": [True, True]}
    assert accepts(s, [1]) and not accepts(s, [1, 2]) and not accepts(s, ["x"])


def test_pattern_properties_next_to_another_subschemas_additional_properties_is_refused():
    s = {"allOf": [{"patternProperties": {"^x": {"type": "integer"}}}, {"additionalProperties": {"minimum": 5}}]}
    with pytest.raises(UnsupportedSchemaError) as e:
        schema_to_regex_ast(s)
    assert e.value.keyword == "patternProperties"


def test_an_untyped_schema_accepts_every_type_its_keywords_do_not_constrain():
    assert accepts({"minimum": 1.1}, "x") and accepts({"minimum": 1.1}, 2) and not accepts({"minimum": 1.1}, 1)
    assert accepts({"properties": {"a": {"type": "string"}}}, [1])
    assert not accepts({"properties": {"a": {"type": "string"}}}, {"a": 1})
    assert accepts({"maxLength": 2}, {"abc": 1}) and not accepts({"maxLength": 2}, "abc")


def test_untyped_schemas_can_be_narrowed_to_the_types_their_keywords_imply():
    s = {"properties": {"a": {"type": "string"}}}
    assert not accepts(s, [1], untyped_types="inferred") and accepts(s, {"a": "x"}, untyped_types="inferred")


def test_one_of_branches_are_narrowed_to_the_types_where_they_are_provably_disjoint():
    s = {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
    dfa = lang(s)
    assert dfa.matches(b'{"a":1}') and dfa.matches(b'{"b":1}')
    assert not dfa.matches(b'"x"') and not dfa.matches(b'{"a":1,"b":2}')  # "x" satisfies both branches
    s = {"oneOf": [{"minimum": 5}, {"type": "string"}]}
    assert accepts(s, 6) and accepts(s, None) and not accepts(s, "x") and not accepts(s, 1)


@pytest.mark.parametrize("schema", [{"type": "object"}, True, {"type": "array"}])
def test_free_form_values_nest_up_to_any_json_depth(schema):
    deep = {"a": {"b": {"c": [1, {"d": None}]}}}
    value = deep if schema != {"type": "array"} else [deep]
    assert accepts(schema, value, any_json_depth=5)
    assert not accepts(schema, value, any_json_depth=3)


def test_dependent_schemas_apply_only_when_their_name_is_present():
    s = {"dependentSchemas": {"bar": {"properties": {"foo": {"type": "integer"}}}, "baz": False}}
    assert accepts(s, {"foo": "x"}) and accepts(s, {"bar": 1, "foo": 2}) and accepts(s, "not an object")
    assert not accepts(s, {"bar": 1, "foo": "x"}) and not accepts(s, {"baz": 1})


def test_contains_counts_matching_items_between_min_and_max_contains():
    s = {"type": "array", "contains": {"minimum": 5}, "minContains": 2, "maxContains": 3}
    for value in ([5, 6], [1, 5, 2, 6, 7], [5], [5, 6, 7, 8], [1, 2], []):
        assert accepts(s, value) == validator(s).is_valid(value), value
    assert accepts({"contains": {"const": 1}}, [2, 1]) and not accepts({"contains": {"const": 1}}, [2])


def test_min_and_max_contains_without_contains_mean_nothing():
    assert accepts({"allOf": [{"contains": {"const": 1}}, {"minContains": 2}]}, [1])


def test_a_schema_of_several_keywords_negates_to_the_union_of_their_negations():
    s = {"not": {"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"]}}
    for value in ({"kind": "b"}, {"kind": "a"}, {}, {"other": 1}, 3, "a", [1]):
        assert accepts(s, value) == validator(s).is_valid(value), value
    s = {"not": {"type": "string", "minLength": 2, "maxLength": 3}}
    for value in ("a", "ab", "abcd", 5, None):
        assert accepts(s, value) == validator(s).is_valid(value), value


def test_values_failing_if_take_the_else_side_in_an_if_chain_on_a_discriminator():
    cases = [{"if": {"type": "object", "properties": {"kind": {"const": k}}, "required": ["kind"]},
              "then": {"properties": {"size": {"type": t}}}} for k, t in
             (("a", "integer"), ("b", "string"), ("c", "boolean"), ("d", "null"), ("e", "array"), ("f", "object"))]
    s = {"type": "object", "allOf": cases, "required": ["kind"]}
    for value in ({"kind": "a", "size": 1}, {"kind": "a", "size": "x"}, {"kind": "b", "size": "x"},
                  {"kind": "f", "size": {}}, {"kind": "f", "size": 1}, {"kind": "z", "size": 1}, {"kind": "z"}):
        assert accepts(s, value) == validator(s).is_valid(value), value


def test_past_max_conjunction_leaves_values_failing_if_are_not_generated():
    s = {"type": "object", "if": {"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"]},
         "then": {"properties": {"size": {"type": "integer"}}}}
    assert accepts(s, {"kind": "b"}) and accepts(s, {"kind": "a", "size": 1})
    assert not accepts(s, {"kind": "b"}, max_conjunction_leaves=0)  # the else side (a sound narrowing)
    assert accepts(s, {"kind": "a", "size": 1}, max_conjunction_leaves=0)


def test_negated_single_bounds_are_the_values_beyond_the_bound():
    s = {"if": {"exclusiveMaximum": 0}, "then": {"minimum": -10}, "else": {"multipleOf": 2}}
    assert accepts(s, -1) and accepts(s, 4) and not accepts(s, 3) and not accepts(s, -11)
    assert accepts({"not": {"maxLength": 2}}, "abc") and not accepts({"not": {"maxLength": 2}}, "ab")


@pytest.mark.parametrize("schema,text,ok", [
    ({"type": "integer"}, "1.0", True), ({"type": "integer", "maximum": 3}, "3.00", True),
    ({"type": "integer", "maximum": 3}, "4.0", False), ({"type": "integer", "multipleOf": 2, "minimum": 0,
                                                         "maximum": 10}, "4.0", True),
    ({"type": "integer", "multipleOf": 3}, "3.0", False),  # (beyond 2**53 a validator's float is inexact)
    ({"type": "integer", "not": {"const": 2}}, "2.0", False), ({"const": 2}, "2.0", True),
    ({"enum": [[1, {"a": 2.5}]]}, '[1.0,{"a":2.50}]', True), ({"const": 2}, "2.5", False),
])
def test_integers_may_be_written_with_a_zero_fraction(schema, text, ok):
    assert lang(schema).matches(text.encode()) == ok
    if ok:
        assert validator(schema).is_valid(json.loads(text))


def test_object_values_of_enum_and_const_match_in_any_member_order():
    s = {"const": {"foo": "bar", "baz": [1, {"x": None, "y": 2}]}}
    assert lang(s).matches(b'{"baz":[1.0,{"y":2,"x":null}],"foo":"bar"}')
    assert not lang(s).matches(b'{"baz":[1,{"y":2}],"foo":"bar"}')


def test_a_key_matching_several_patterns_satisfies_all_their_schemas():
    s = {"patternProperties": {"a*": {"type": "integer"}, "aaa*": {"maximum": 20}}}
    assert accepts(s, {"aaaa": 18}) and accepts(s, {"a": 21, "aaaa": 18})
    assert not accepts(s, {"aaaa": 31}) and not accepts(s, {"aaa": "x"})


def test_refs_resolve_against_the_nearest_enclosing_id():
    s = {"$id": "http://example.com/root.json", "$defs": {"inner": {"type": "string"}},
         "properties": {"foo": {"$id": "other.json", "$defs": {"inner": {"type": "integer"}},
                                "$ref": "#/$defs/inner"}},
         "additionalProperties": {"$ref": "other.json#/$defs/inner"}}
    # "#/$defs/inner" inside other.json is its integer one, not the root's string one
    assert accepts(s, {"foo": 1}) and not accepts(s, {"foo": "x"})
    assert accepts(s, {"bar": 2}) and not accepts(s, {"bar": "x"})
    assert validator(s).is_valid({"foo": 1, "bar": 2}) and not validator(s).is_valid({"foo": "x"})


def test_a_fragment_missing_from_the_enclosing_id_resource_resolves_against_the_document():
    """Draft-04 schemas put `id`s on definitions and still point at the whole document ("#/definitions/...")."""
    s = {"definitions": {"lemon": {"id": "schema/lemon",
                                   "definitions": {"ripe": {"type": "boolean"}},
                                   "properties": {"ripe": {"$ref": "#/definitions/lemon/definitions/ripe"}}}},
         "$ref": "#/definitions/lemon"}
    assert accepts(s, {"ripe": True}) and not accepts(s, {"ripe": 1})


def test_ref_siblings_are_ignored_up_to_draft_7_and_apply_from_2019_09():
    defs = {"file": {"type": "object", "properties": {"weight": {"type": "integer"}}}}
    s = {"definitions": defs, "$ref": "#/definitions/file", "properties": {"cache": {"type": "boolean"}},
         "additionalProperties": False}
    for draft in ("http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-07/schema#"):
        legacy = dict(s, **{"$schema": draft})
        assert validator(legacy).is_valid({"weight": 1, "other": 2})
        assert accepts(legacy, {"weight": 1, "other": 2}) and not accepts(legacy, {"weight": "x"})
    modern = dict(s, **{"$schema": "https://json-schema.org/draft/2020-12/schema"})
    assert not validator(modern).is_valid({"weight": 1})
    assert not accepts(modern, {"weight": 1}) and accepts(modern, {"cache": True})
    assert not accepts(s, {"weight": 1})  # no $schema: the latest draft, like jsonschema's validator_for


def test_large_objects_take_additional_properties_after_the_declared_ones():
    s = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}}
    assert accepts(s, {"z": 0, "a": 1, "b": 2})
    assert not accepts(s, {"z": 0, "a": 1}, interleave_additional_max=2)
    assert accepts(s, {"a": 1, "c": 3, "z": 0, "y": 1}, interleave_additional_max=2)


def test_unknown_or_invalid_compile_options_are_refused_by_name():
    compiler = ConstraintCompiler(TokenizerInfo([bytes([b]) for b in range(256)] + [None, None], eos_id=256, mask_id=257))
    with pytest.raises(InvalidOptionError, match="'max_depth'"):
        compiler.compile_json_schema({"type": "integer"}, max_depth=3)
    with pytest.raises(InvalidOptionError, match="property_order"):
        compiler.compile_json_schema({"type": "integer"}, property_order="sorted")
    with pytest.raises(InvalidOptionError, match="any_json_depth"):
        compiler.compile_json_schema({"type": "integer"}, any_json_depth=-1)


def test_integers_with_a_zero_fraction_follow_the_declared_draft():
    """Draft 6+ counts 1.0 as an integer; draft-04 validators do not, so neither do we there."""
    assert accepts({"type": "integer"}, 1.0)
    assert not accepts({"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}, 1.0)
    assert not accepts({"type": "integer"}, 1.0, integer_zero_fraction="never")
    assert accepts({"type": "integer"}, 1, integer_zero_fraction="never")


def test_undeclared_property_names_can_be_kept_nonempty():
    s = {"type": "object", "additionalProperties": {"type": "integer"}}
    assert accepts(s, {"": 1}) and not accepts(s, {"": 1}, additional_names="nonempty")
    assert accepts(s, {"b": 1}, additional_names="nonempty")


def test_unevaluated_items_of_a_plain_schema_are_the_items_after_the_prefix():
    s = {"prefixItems": [{"type": "string"}], "unevaluatedItems": {"type": "integer"}}
    assert accepts(s, ["a", 1, 2]) and not accepts(s, ["a", "b"])
    assert accepts({"prefixItems": [{"type": "string"}], "items": True, "unevaluatedItems": False}, ["a", 1])
    with pytest.raises(UnsupportedSchemaError) as e:
        schema_to_regex_ast({"allOf": [{"prefixItems": [True]}], "unevaluatedItems": False})
    assert e.value.keyword == "unevaluatedItems"


_PROP_SCHEMAS = st.sampled_from([{"type": "integer"}, {"type": "string"}, True, {"const": 1}])
_SMALL_OBJECTS = st.builds(lambda props, req: {"properties": props, "required": [k for k in props if k in req]},
                           st.dictionaries(st.sampled_from(_DEP_NAMES), _PROP_SCHEMAS, max_size=2),
                           st.sets(st.sampled_from(_DEP_NAMES)))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(base=_SMALL_OBJECTS, kw=st.sampled_from(["allOf", "anyOf", "oneOf"]),
       members=st.lists(_SMALL_OBJECTS, min_size=1, max_size=2), uneval=st.sampled_from([False, {"type": "integer"}]),
       via_ref=st.booleans())
def test_unevaluated_properties_over_applicators_accept_only_valid_objects(base, kw, members, uneval, via_ref):
    s = dict(base, unevaluatedProperties=uneval)
    if via_ref:
        s["$defs"] = {"m": {kw: members}}
        s["$ref"] = "#/$defs/m"
    else:
        s[kw] = members
    try:
        dfa = lang(s)
    except (UnsupportedSchemaError, UnsatisfiableSchemaError):
        return
    v = validator(s)
    for k in range(1 << len(_DEP_NAMES)):
        for value in (1, "x"):
            obj = {n: value for i, n in enumerate(_DEP_NAMES) if k >> i & 1}
            if dfa.matches(compact(obj).encode()):
                assert v.is_valid(obj), (s, obj)


def test_unevaluated_properties_see_the_properties_of_in_place_applicators():
    s = {"properties": {"foo": {"type": "string"}}, "allOf": [{"properties": {"bar": {"type": "string"}}}],
         "unevaluatedProperties": False}
    assert accepts(s, {"foo": "a", "bar": "b"}) and not accepts(s, {"foo": "a", "baz": "b"})
    with pytest.raises(UnsupportedSchemaError) as e:  # a cousin's unevaluatedProperties sees only its subtree
        schema_to_regex_ast({"allOf": [{"properties": {"foo": True}}, {"unevaluatedProperties": False}]})
    assert e.value.keyword == "unevaluatedProperties"


_BRANCHES = st.sampled_from([
    {"minimum": 5}, {"type": "string"}, {"maxLength": 2}, {"required": ["a"]}, {"required": ["b"]},
    {"type": "integer"}, {"enum": [1, "x", None]}, {"const": 6}, {"properties": {"a": {"type": "integer"}}},
    {"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]}, {"type": ["null", "boolean"]},
    {"minItems": 1}, {"items": {"type": "string"}}, {"not": {"type": "number"}},
])


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(branches=st.lists(_BRANCHES, min_size=2, max_size=3), seed=st.integers(0, 2**32 - 1))
def test_one_of_untyped_branches_every_text_of_the_language_validates(branches, seed):
    s = {"oneOf": branches}
    try:
        dfa = lang(s, any_json_depth=1)
    except (UnsupportedSchemaError, UnsatisfiableSchemaError):
        return
    v = validator(s)
    for t in random_texts(dfa, random.Random(seed), n=15, max_len=60):
        assert v.is_valid(json.loads(t.decode("utf-8"))), (s, t)


# ------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("schema,keyword", [
    ({"type": "array", "contains": {"type": "string", "format": "email"}, "maxContains": 1}, "maxContains"),
    ({"type": "array", "items": {"$dynamicRef": "#node"}}, "$dynamicRef"),
    ({"type": "string", "format": "idn-hostname"}, "format"),
    ({"$ref": "https://example.com/schema.json"}, "$ref"),
    ({"not": {"type": "string", "minLength": 2, "format": "email"}}, "not"),
    ({"not": {"type": "string", "pattern": "(?=a)"}}, "not"),
])
def test_unsupported_keywords_are_refused_by_name(schema, keyword):
    with pytest.raises(UnsupportedSchemaError) as e:
        schema_to_regex_ast(schema)
    assert e.value.keyword == keyword and keyword in str(e.value)


def test_unknown_keywords_are_not_enforced_or_refused_on_request():
    s = {"type": "integer", "x-vendor": 1}
    with pytest.warns(UnknownKeywordWarning, match="x-vendor"):
        assert accepts(s, 1)
    with pytest.raises(UnsupportedSchemaError):
        schema_to_regex_ast(s, SchemaOptions(unknown_keywords="error"))


@pytest.mark.parametrize("schema", [
    {"type": "integer", "minimum": 5, "maximum": 4},
    {"type": "string", "minLength": 3, "maxLength": 2},
    {"type": "array", "minItems": 3, "maxItems": 1},
    {"enum": ["a"], "type": "integer"},
    {"type": "object", "properties": {"a": False}, "required": ["a"]},
])
def test_unsatisfiable_schemas_get_their_own_error(schema):
    with pytest.raises(UnsatisfiableSchemaError):
        schema_to_regex_ast(schema)


@pytest.mark.parametrize("schema", [{"type": "integr"}, {"type": "object", "required": "a"}, {"$ref": "#/nowhere"},
                                    {"type": "string", "maxLength": -1}])
def test_invalid_schemas_get_invalid_schema_error(schema):
    with pytest.raises(InvalidSchemaError):
        schema_to_regex_ast(schema)


def test_compilation_stops_at_its_time_limit():
    from dllm_constrain.constraints.deadline import Deadline

    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": "^(a|b)*c(a|b){6}$",
                                                       "maxLength": 40} for i in range(200)}}
    with pytest.raises(CompilationTimeoutError):
        schema_to_regex_ast(big, SchemaOptions(), Deadline(0.05))


# ------------------------------------------------------------------------------------------ inputs and API
def test_schema_inputs_dict_json_string_and_pydantic_model_normalise_to_a_dict():
    pydantic = pytest.importorskip("pydantic")

    class Item(pydantic.BaseModel):
        name: str
        qty: int = 1

    assert normalize_schema_input({"type": "integer"}) == {"type": "integer"}
    assert normalize_schema_input('{"type": "integer"}') == {"type": "integer"}
    d = normalize_schema_input(Item)
    assert d["properties"]["name"]["type"] == "string"
    with pytest.raises(InvalidSchemaError):
        normalize_schema_input("{not json")
    with pytest.raises(InvalidSchemaError):
        normalize_schema_input(42)


def test_pydantic_model_constraint_round_trip():
    pydantic = pytest.importorskip("pydantic")

    class Point(pydantic.BaseModel):
        x: int
        y: int

    toks = [bytes([b]) for b in range(256)]
    info = TokenizerInfo(toks + [None, None], eos_id=256, mask_id=257)
    cc = ConstraintCompiler(info).compile_json_schema(Point)
    assert cc.accepts_text('{"x":1,"y":-2}') and not cc.accepts_text('{"x":1}')
    assert cc.min_tokens() == len('{"x":0,"y":0}')


# ------------------------------------------------------------------------------------------ random schemas
_SCALARS = st.one_of(
    st.just({"type": "null"}), st.just({"type": "boolean"}),
    st.builds(lambda lo, w: {"type": "integer", "minimum": lo, "maximum": lo + w}, st.integers(-50, 50), st.integers(0, 300)),
    st.builds(lambda lo: {"type": "number", "exclusiveMinimum": lo / 4}, st.integers(-20, 20)),
    st.builds(lambda a, b: {"type": "string", "minLength": a, "maxLength": a + b}, st.integers(0, 3), st.integers(0, 5)),
    st.builds(lambda p: {"type": "string", "pattern": p}, st.sampled_from(["^[a-c]+$", "^x\\d?$", "é", "^(ab|c)*$"])),
    st.builds(lambda f: {"type": "string", "format": f}, st.sampled_from(["date", "uuid", "ipv4", "time"])),
    st.builds(lambda vs: {"enum": vs}, st.lists(st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b", "é"]), st.none()),
                                                  min_size=1, max_size=4)),
)


def _schemas(depth: int = 2):
    if depth == 0:
        return _SCALARS
    sub = _schemas(depth - 1)
    names = st.sampled_from(["a", "b", "id", "name", "é"])
    obj = st.builds(
        lambda props, req, addl: {"type": "object", "properties": props,
                                  "required": [k for k in props if k in req],
                                  **({} if addl is None else {"additionalProperties": addl})},
        st.dictionaries(names, sub, max_size=3), st.sets(names), st.sampled_from([None, False, {"type": "integer"}]))
    arr = st.builds(lambda it, lo, w: {"type": "array", "items": it, "minItems": lo, "maxItems": lo + w},
                    sub, st.integers(0, 2), st.integers(0, 3))
    any_of = st.builds(lambda xs: {"anyOf": xs}, st.lists(sub, min_size=1, max_size=3))
    return st.one_of(_SCALARS, obj, arr, any_of)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=_schemas(), seed=st.integers(0, 2**32 - 1))
def test_random_schemas_every_text_of_the_language_validates(schema, seed):
    try:
        dfa = lang(schema)
    except UnsatisfiableSchemaError:
        return
    v = validator(schema)
    for t in random_texts(dfa, random.Random(seed), n=10, max_len=200):
        assert v.is_valid(json.loads(t.decode("utf-8"))), (schema, t)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=_schemas(), data=st.data())
def test_random_schemas_accept_their_instances_with_their_keys_in_any_order(schema, data, ieee_floats):
    try:
        dfa = lang(schema)
    except UnsatisfiableSchemaError:
        return
    value = data.draw(from_schema(schema))
    if not validator(schema).is_valid(value):
        return
    if not dfa.matches(compact(value).encode()):
        assert _outside_narrowings(value), (schema, value)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=_schemas(depth=1), seed=st.integers(0, 2**32 - 1), n=st.integers(8, 40))
def test_random_schemas_random_canvas_decoding_always_ends_valid(schema, seed, n):
    """Random commit orders and random scores on a canvas over a byte-level vocabulary with multi-byte
    JSON pieces: the decoded text always validates (or the schema is refused as too long)."""
    import torch

    from dllm_constrain.errors import ConstraintTooLongError

    from constraint_support import canvas_text, json_test_vocabulary

    toks = json_test_vocabulary()
    info = TokenizerInfo(toks + [None, None], eos_id=len(toks), mask_id=len(toks) + 1)
    try:
        cc = ConstraintCompiler(info).compile_json_schema(schema)
        state = cc.new_canvas_state(n)
    except (UnsatisfiableSchemaError, ConstraintTooLongError):
        return
    rng = random.Random(seed)
    canvas = [info.mask_id] * n
    while info.mask_id in canvas:
        opens = [i for i, c in enumerate(canvas) if c == info.mask_id]
        pick = rng.sample(opens, min(len(opens), rng.randint(1, 6)))
        if opens[0] not in pick:
            pick.append(opens[0])  # the left frontier, whose mask is never empty (others may wait for a later call)
        try:
            masks = state.allowed_tokens(canvas, pick)
        except ConstraintTooLongError:
            # the fit check is time-bounded (an undecided length is let in); the first mask call decides it
            assert canvas.count(info.mask_id) == n
            return
        props = []
        for j, p in enumerate(pick):
            ids = torch.nonzero(masks[j]).flatten().tolist()
            assert ids or p != opens[0]
            if ids:
                props.append((p, rng.choice(ids), rng.random()))
        kept = state.select_commits(canvas, props)
        assert kept
        for p, t in kept:
            canvas[p] = t
    text = canvas_text(canvas, toks, info.eos_id)
    assert validator(schema).is_valid(json.loads(text.decode("utf-8"))), (schema, text)
