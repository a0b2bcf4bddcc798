"""The compiler keeps enum/const values only where a validator accepts them: its fast path (conjuncts that only
restrict the type or enumerate values) answers as jsonschema does, whatever annotations and extension keywords
stand beside them."""
from __future__ import annotations

import jsonschema
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_constrain.constraints.json_schema.validation import InstanceValidator

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, 1.0, -2.0]),
                    st.sampled_from(["a", "b", "", "1"]))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=2))
TYPES = st.sampled_from(["null", "boolean", "integer", "number", "string", "array", ["string", "null"]])
IGNORED = st.dictionaries(st.sampled_from(["description", "x-order", "references", "maxLenght", "$comment"]),
                          st.just("anything"), max_size=3)


@st.composite
def conjuncts(draw) -> dict:
    c = dict(draw(IGNORED))
    if draw(st.booleans()):
        c["type"] = draw(TYPES)
    if draw(st.booleans()):
        c["enum"] = draw(st.lists(VALUES, min_size=1, max_size=4))
    else:
        c["const"] = draw(VALUES)
    return c


@settings(max_examples=200, deadline=None)
@given(conjunct=conjuncts(), value=VALUES)
def test_the_fast_path_answers_as_jsonschema(conjunct: dict, value) -> None:
    root = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    expected = jsonschema.Draft202012Validator(conjunct).is_valid(value)
    assert InstanceValidator(root).is_valid_fast(value, conjunct) == expected


def test_extension_keywords_beside_an_enum_take_the_fast_path(monkeypatch) -> None:
    """A large enum with extension keywords beside it is not validated member by member by jsonschema (whose enum
    check is quadratic in the enum's size)."""
    v = InstanceValidator({})
    monkeypatch.setattr(v, "is_valid", lambda *a: (_ for _ in ()).throw(AssertionError("slow path taken")))
    c = {"type": "string", "enum": [f"u{i}" for i in range(100)], "references": [{"url": "x"}], "x-kind": 1}
    assert all(v.is_valid_fast(f"u{i}", c) for i in range(100))
    assert not v.is_valid_fast("other", c)
