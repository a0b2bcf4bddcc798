"""Object members in any order (`regex_ast.Members`): every order of the declared properties is accepted,
each at most once, with required / minProperties / maxProperties intact; the lazy derivative automaton
agrees with the eager subset construction, stays small, and gives exact canvas masks."""
from __future__ import annotations

import itertools
import json
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from dllm_constrain.constraints import ConstraintCompiler
from dllm_constrain.constraints import regex_ast as A
from dllm_constrain.constraints.deriv import DEAD, START, DerivDFA
from dllm_constrain.constraints.dfa import LazyDFA
from dllm_constrain.constraints.json_schema import SchemaOptions, schema_to_regex_ast
from dllm_constrain.constraints.nfa import build_nfa
from dllm_constrain.constraints.object_members import members_to_graph, object_members
from dllm_constrain.errors import (CompilationTimeoutError, ConstraintTooLongError, UnsatisfiableSchemaError,
                                   UnsupportedSchemaError)

from test_constraint_json_schema import compact, random_texts, validator
from constraint_support import brute_force_allowed, tiny_info


def lang(schema, **opts) -> DerivDFA:
    return DerivDFA(schema_to_regex_ast(schema, SchemaOptions(**opts)))


def text(pairs) -> bytes:
    """Compact JSON object text from (key, value) pairs, repeats and order kept."""
    return ("{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{compact(v)}" for k, v in pairs) + "}").encode()


def no_repeated_keys(data: bytes, names=None) -> bool:
    """No key occurs twice in an object (only keys in `names` are checked when given)."""

    def hook(pairs):
        keys = [k for k, _ in pairs if names is None or k in names]
        if len(set(keys)) != len(keys):
            raise ValueError("repeated key")
        return dict(pairs)

    try:
        json.loads(data.decode("utf-8"), object_pairs_hook=hook)
    except ValueError:
        return False
    return True


FOUR = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"},
                                         "d": {"enum": [None, 1]}}, "additionalProperties": False}
FOUR_VALUES = {"a": 7, "b": "x", "c": True, "d": None}


# ------------------------------------------------------------------------------------------ language
def test_every_permutation_of_the_declared_properties_is_accepted():
    dfa = lang(FOUR)
    for k in range(5):
        for names in itertools.permutations(FOUR_VALUES, k):
            assert dfa.matches(text((n, FOUR_VALUES[n]) for n in names)), names


def test_a_declared_property_cannot_repeat():
    dfa = lang(FOUR)
    assert not dfa.matches(text([("a", 1), ("a", 1)]))
    assert not dfa.matches(text([("b", "x"), ("a", 1), ("b", "y")]))
    assert not dfa.matches(text([("a", 1), ("b", "x"), ("c", True), ("d", 1), ("c", False)]))


def test_each_property_keeps_its_own_schema_in_any_position():
    dfa = lang(FOUR)
    assert dfa.matches(text([("c", False), ("a", 1)]))
    assert not dfa.matches(text([("c", 1), ("a", 1)])) and not dfa.matches(text([("a", True), ("c", True)]))


def test_required_properties_are_enforced_in_any_order():
    s = dict(FOUR, required=["c", "a"])
    dfa = lang(s)
    assert dfa.matches(text([("a", 1), ("c", True)])) and dfa.matches(text([("c", True), ("b", ""), ("a", 1)]))
    assert not dfa.matches(text([("c", True)])) and not dfa.matches(text([("a", 1), ("b", "")]))
    assert not dfa.matches(b"{}")


def test_min_and_max_properties_count_declared_and_additional_members():
    s = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
         "additionalProperties": {"type": "boolean"}, "minProperties": 2, "maxProperties": 3}
    dfa = lang(s)
    assert not dfa.matches(text([("b", 1)])) and not dfa.matches(text([("x", True)]))
    assert dfa.matches(text([("b", 1), ("x", True)])) and dfa.matches(text([("b", 1), ("a", 2), ("x", True)]))
    assert not dfa.matches(text([("b", 1), ("a", 2), ("x", True), ("y", True)]))
    assert not dfa.matches(text([("b", 1), ("x", 1)]))  # an additional value keeps its schema


def test_additional_names_may_repeat_so_only_one_additional_member_counts_towards_min_properties():
    s = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "boolean"},
         "minProperties": 2}
    dfa = lang(s)
    assert dfa.matches(text([("a", 1), ("x", True)]))
    assert not dfa.matches(text([("x", True), ("x", False)]))  # parses as one property
    with pytest.raises(UnsupportedSchemaError, match="minProperties"):
        lang(dict(s, minProperties=3))


def test_additional_properties_interleave_with_the_declared_ones_and_never_reuse_a_declared_name():
    s = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a"]}
    dfa = lang(s)
    assert dfa.matches(text([("b", 1), ("a", 2), ("z", [1]), ("y", None)]))
    assert dfa.matches(text([("b", 1), ("z", [1]), ("a", 2)]))
    assert dfa.matches(text([("z", {}), ("a", 2), ("y", None), ("b", 1)]))
    assert not dfa.matches(text([("a", 1), ("z", 0), ("a", "x")]))
    assert not dfa.matches(text([("z", 0), ("b", 1)]))  # "a" is required, wherever the others go


def test_declared_property_order_keeps_additional_properties_after_the_declared_ones():
    s = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    dfa = lang(s, property_order="declared")
    assert dfa.matches(text([("a", 1), ("b", 2), ("z", 0)]))
    assert not dfa.matches(text([("z", 0), ("a", 1)]))


def test_max_properties_counts_additional_members_wherever_they_stand():
    s = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
         "additionalProperties": {"type": "integer"}, "maxProperties": 2}
    dfa = lang(s)
    assert dfa.matches(text([("x", 1), ("a", 1)])) and dfa.matches(text([("x", 1), ("y", 2)]))
    assert not dfa.matches(text([("x", 1), ("a", 1), ("b", 1)]))
    assert not dfa.matches(text([("x", 1), ("y", 1), ("b", 1)]))


def test_unsatisfiable_member_counts_are_reported():
    s = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "maxProperties": 0}
    with pytest.raises(UnsatisfiableSchemaError):
        lang(s)
    assert A.is_nothing(object_members([(A.lit('"a":1'), False)], [], A.lit(","), 2, None))
    assert object_members([], [], A.lit(","), 0, None) == A.EMPTY


def test_shortest_completion_counts_missing_required_members_and_the_cheapest_others():
    s = {"type": "object", "properties": {"long": {"const": "xxxxxxxx"}, "a": {"const": 1}, "b": {"const": 2}},
         "required": ["long"], "minProperties": 2, "additionalProperties": False}
    dfa = lang(s)
    assert dfa.dist[START] == len('{"long":"xxxxxxxx","a":1}')
    s_after_b = dfa.walk(START, b'{"b":2')
    assert dfa.dist[s_after_b] == len(',"long":"xxxxxxxx"}')


def test_unique_items_over_a_finite_domain_take_distinct_values_in_any_order():
    s = {"type": "array", "items": {"enum": ["x", 2, None, True]}, "uniqueItems": True, "minItems": 2, "maxItems": 3}
    dfa = lang(s)
    for k in (2, 3):
        for items in itertools.permutations(["x", 2, None, True], k):
            assert dfa.matches(compact(list(items)).encode()), items
    assert not dfa.matches(b'["x","x"]') and not dfa.matches(b'[2,null,2]') and not dfa.matches(b'[2]')
    assert not dfa.matches(b'["x",2,null,true]')


def test_unique_string_items_start_with_distinct_characters():
    s = {"type": "array", "items": {"type": "string", "maxLength": 4}, "uniqueItems": True, "minItems": 2}
    dfa = lang(s)
    for value in (["example", "x"], ["ab", "b", ""], ["", "a"], ['"q', "q", "-", "^"], ["é", "a"]):
        assert dfa.matches(compact(value).encode()) == (all(len(v) <= 4 for v in value)), value
    for value in (["ab", "ab"], ["ab", "ac"], ["é", "ü"], ["", ""], ["a"]):
        assert not dfa.matches(compact(value).encode()), value  # repeats; a shared first character (narrowing)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), item=st.sampled_from([{"type": "string"}, {"type": "string", "pattern": "^[a-c]+$"},
                                                            {"type": "string", "format": "date"}, {"type": "string", "minLength": 2}]))
def test_every_text_of_a_unique_string_array_has_distinct_items(seed, item):
    s = {"type": "array", "items": item, "uniqueItems": True, "maxItems": 5}
    v = validator(s)
    for t in random_texts(lang(s), random.Random(seed), n=15, max_len=120):
        assert v.is_valid(json.loads(t)), (s, t)


# ------------------------------------------------------------------------------------------ automata
def test_the_lazy_automaton_visits_only_the_subsets_a_walk_reaches():
    names = [f"p{i:02d}" for i in range(40)]
    s = {"type": "object", "properties": {n: {"type": "integer"} for n in names}, "additionalProperties": False}
    dfa = lang(s)
    data = text((n, i) for i, n in enumerate(reversed(names)))
    assert dfa.matches(data)
    assert dfa.n_states < 40 * len(data)  # 2^40 subsets exist


def test_the_eager_construction_refuses_a_large_member_set_instead_of_growing_exponentially():
    names = [f"p{i:02d}" for i in range(20)]
    node = schema_to_regex_ast({"type": "object", "properties": {n: {"type": "integer"} for n in names}},
                               SchemaOptions())
    with pytest.raises(CompilationTimeoutError):
        build_nfa(node)
    members = next(x for x in node.items if isinstance(x, A.Members))
    with pytest.raises(CompilationTimeoutError):
        members_to_graph(members, max_nodes=1000)


# ------------------------------------------------------------------------------------------ properties
_VALUES = st.sampled_from([{"type": "integer", "minimum": 0, "maximum": 20}, {"type": "boolean"}, {"enum": ["u", 3, None]},
                           {"type": "string", "maxLength": 2, "pattern": "^[a-c]*$"}, {"const": "k"}])


@st.composite
def object_schemas(draw):
    props = draw(st.dictionaries(st.sampled_from(["a", "b", "id", "é", "x"]), _VALUES, max_size=4))
    schema = {"type": "object", "properties": props,
              "required": sorted(draw(st.sets(st.sampled_from(sorted(props))))) if props else [],
              "additionalProperties": draw(st.sampled_from([False, {"type": "integer"}, {"type": "boolean"}]))}
    lo = draw(st.integers(0, 3))
    if draw(st.booleans()):
        schema["minProperties"] = lo
    if draw(st.booleans()):
        schema["maxProperties"] = lo + draw(st.integers(0, 2))
    return schema


def _ascii_ints_only(value: dict) -> bool:
    """Inside our other narrowings: ASCII keys without escapes (hypothesis draws any string)."""
    return all(k.isascii() and k.isprintable() and '"' not in k and "\\" not in k for k in value)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=object_schemas(), data=st.data())
def test_every_order_of_the_members_of_a_valid_instance_is_accepted(schema, data):
    try:
        dfa = lang(schema)
    except (UnsatisfiableSchemaError, UnsupportedSchemaError):
        return
    value = data.draw(from_schema(schema).filter(lambda v: len(v) <= 4 and _ascii_ints_only(v)))
    assert validator(schema).is_valid(value)
    n_declared = len(set(value) & set(schema["properties"]))
    if n_declared + 1 < len(value) and n_declared + 1 < schema.get("minProperties", 0):
        return  # needs two additional members to count towards minProperties (a documented narrowing)
    for order in itertools.permutations(value.items()):
        assert dfa.matches(text(order)), (schema, order)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=object_schemas(), seed=st.integers(0, 2**32 - 1))
def test_every_text_of_the_language_is_valid_and_repeats_no_declared_key(schema, seed):
    """(Additional keys may repeat: docs/constraints.md, sound narrowings.)"""
    try:
        dfa = lang(schema)
    except (UnsatisfiableSchemaError, UnsupportedSchemaError):
        return
    v = validator(schema)
    for t in random_texts(dfa, random.Random(seed), n=15, max_len=120):
        assert no_repeated_keys(t, schema["properties"]) and v.is_valid(json.loads(t)), (schema, t)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=object_schemas(), seed=st.integers(0, 2**32 - 1))
def test_the_lazy_and_the_eager_automata_agree_on_acceptance_and_distance(schema, seed):
    try:
        node = schema_to_regex_ast(schema, SchemaOptions())
    except (UnsatisfiableSchemaError, UnsupportedSchemaError):
        return
    lazy, eager = DerivDFA(node), LazyDFA(build_nfa(node))
    for t in random_texts(lazy, random.Random(seed), n=8, max_len=120):
        for cut in range(len(t) + 1):
            a, b = lazy.walk(START, t[:cut]), eager.walk(START, t[:cut])
            assert (a == DEAD) == (b == DEAD)
            assert lazy.accepting[a] == eager.accepting[b] and lazy.dist[a] == eager.dist[b], (schema, t[:cut])
        mutated = bytearray(t)
        if mutated:
            mutated[random.Random(seed).randrange(len(mutated))] = ord(random.Random(seed + 1).choice('{},:"ab1'))
        assert lazy.matches(bytes(mutated)) == eager.matches(bytes(mutated))


def _in_declared_order(data: bytes, names: list[str]) -> bool:
    keys = list(json.loads(data, object_pairs_hook=lambda pairs: [k for k, _ in pairs]))
    declared = [k for k in keys if k in names]
    n_declared_first = len(declared)
    return declared == sorted(declared, key=names.index) and keys[:n_declared_first] == declared


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=object_schemas(), data=st.data())
def test_declared_property_order_is_the_any_order_language_restricted_to_the_declared_order(schema, data):
    try:
        anyorder, ordered = lang(schema), lang(schema, property_order="declared")
    except (UnsatisfiableSchemaError, UnsupportedSchemaError):
        return
    names = list(schema["properties"])
    texts = random_texts(anyorder, random.Random(data.draw(st.integers(0, 2**32 - 1))), n=10, max_len=120)
    texts += random_texts(ordered, random.Random(data.draw(st.integers(0, 2**32 - 1))), n=10, max_len=120)
    for t in texts:
        assert ordered.matches(t) == (anyorder.matches(t) and _in_declared_order(t, names)), (schema, t)


# ------------------------------------------------------------------------------------------ canvas
# JSON pieces: members in either order, separators, and pieces that join two members
MEMBER_TOKENS = [b"{", b"}", b",", b'"a":1', b'"b":2', b'"c":3', b'{"b":2', b',"a":1}', b'"c":3,']


@st.composite
def canvases(draw, n_tokens: int, eos: int, mask: int):
    n = draw(st.integers(3, 6))
    cells = [draw(st.one_of(st.just(mask), st.just(mask), st.integers(0, n_tokens - 1), st.just(eos)))
             for _ in range(n)]
    opens = [i for i, c in enumerate(cells) if c == mask][:4]
    return [c if c != mask or i in opens else eos for i, c in enumerate(cells)]


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(required=st.sets(st.sampled_from(["a", "b", "c"])), lo=st.integers(0, 3), width=st.sampled_from([None, 0, 1, 2]),
       order=st.sampled_from(["any", "declared"]), data=st.data())
def test_canvas_masks_equal_the_brute_force_set_of_completable_tokens(required, lo, width, order, data):
    schema = {"type": "object", "properties": {"a": {"const": 1}, "b": {"const": 2}, "c": {"const": 3}},
              "required": sorted(required), "minProperties": lo, "additionalProperties": False}
    if width is not None:
        schema["maxProperties"] = lo + width
    info = tiny_info(MEMBER_TOKENS)
    try:
        cc = ConstraintCompiler(info).compile_json_schema(schema, property_order=order)
    except UnsatisfiableSchemaError:
        return
    canvas = data.draw(canvases(len(MEMBER_TOKENS), info.eos_id, info.mask_id))
    v = validator(schema)
    memo: dict[bytes, bool] = {}

    def accepts(t: bytes) -> bool:
        if t not in memo:
            try:
                ok = no_repeated_keys(t) and compact(json.loads(t)).encode() == t and v.is_valid(json.loads(t))
                ok = ok and (order == "any" or _in_declared_order(t, ["a", "b", "c"]))
            except ValueError:
                ok = False
            memo[t] = ok
        return memo[t]

    opens = [i for i, c in enumerate(canvas) if c == info.mask_id]
    try:
        state = cc.new_canvas_state(len(canvas), expand_budget=None)
    except ConstraintTooLongError:
        return
    expected = brute_force_allowed(canvas, MEMBER_TOKENS, info.eos_id, info.mask_id, accepts)
    masks = state.allowed_tokens(canvas, opens)
    for j, i in enumerate(opens):
        assert set(torch.nonzero(masks[j]).flatten().tolist()) == expected[i], (schema, canvas, i)


def _completion_by_enumeration(costs, req, extra_cost, sep, lo, hi, used, extra) -> int:
    """The shortest completion from its definition: every set of unused entries (and at most one additional
    member) that closes the list, cheapest first."""
    from dllm_constrain.constraints.object_members import FROZEN, INF

    if used == FROZEN:
        return 0
    free = [i for i in range(len(costs)) if not used >> i & 1]
    best = INF
    for r in range(len(free) + 1):
        for chosen in itertools.combinations(free, r):
            mask = used | sum(1 << i for i in chosen)
            if mask & req != req or any(costs[i] >= INF for i in chosen):
                continue
            for one_extra in ((0, 1) if extra == 0 and extra_cost < INF else (0,)):
                n = len(chosen) + one_extra
                if mask.bit_count() + min(extra + one_extra, 1) < lo:
                    continue
                if hi is not None and used.bit_count() + extra + n > hi:
                    continue
                seps = n if (used or extra) else max(n - 1, 0)
                best = min(best, sum(costs[i] for i in chosen) + one_extra * extra_cost + sep * seps)
    return best


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 5, 9, 1 << 30]), min_size=0, max_size=6), st.data())
def test_shortest_completion_is_the_cheapest_closing_set_of_members(costs, data):
    from dllm_constrain.constraints.object_members import shortest_completion

    n = len(costs)
    req = data.draw(st.integers(0, (1 << n) - 1))
    used = data.draw(st.integers(0, (1 << n) - 1))
    extra = data.draw(st.integers(0, 1))
    extra_cost = data.draw(st.sampled_from([3, 1 << 30]))
    lo = data.draw(st.integers(0, n + 1))
    hi = data.draw(st.one_of(st.none(), st.integers(lo, n + 2)))
    assert shortest_completion(costs, req, extra_cost, 1, lo, hi, used, extra) == \
        _completion_by_enumeration(costs, req, extra_cost, 1, lo, hi, used, extra)
