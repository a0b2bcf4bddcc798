"""Pinned canvases: a template's pinned positions hold through every step (every policy, with and without the KV
cache), holes are filled under the constraint, and a template no valid output can have is refused at admission,
naming its first unfit position, before any forward."""
from __future__ import annotations

import itertools
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.state import POLICY_NAMES, Request, SamplingParams
from dllm_constrain.errors import InvalidRequestError, PinnedTokenError
from dllm_constrain.templates import TemplateError, parse_template
from llm_fixtures import bundled, tiny  # noqa: F401 - module-scoped fixtures, used by name

jsonschema = pytest.importorskip("jsonschema")

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}}, "required": ["name", "age", "city"]}
ASK = "Create a record with name Ada Lovelace; age 36; city London."
CODE = r"[a-c]{2}-[0-9]{3}"  # one fixed-length shape: a 6-byte canvas holds exactly one answer
SLOW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# ------------------------------------------------------------------------------------------- pins hold
@SLOW
@given(answer=st.from_regex(CODE, fullmatch=True), chosen=st.sets(st.integers(0, 5), min_size=1, max_size=5),
       policy=st.sampled_from(POLICY_NAMES), kv_cache=st.sampled_from(["dual", "none"]), seed=st.integers(0, 9))
def test_a_pinned_position_never_changes_at_any_step(tiny, answer, chosen, policy, kv_cache, seed) -> None:
    ids = tiny.encode_text(answer)
    pinned = sorted(chosen)
    steps: list[list[int]] = []

    def watch(event) -> None:
        steps.append(event.snapshots[0].canvas)

    [res] = tiny.generate(["code"], regex=CODE, seed_canvas=ids, pinned=pinned, max_new_tokens=len(ids),
                          policy=policy, kv_cache=kv_cache, seed=seed, block_length=4, progress=watch)
    assert re.fullmatch(CODE, res.text)
    assert steps, "the request took at least one step"
    for canvas in steps + [res.canvas_ids]:
        assert [canvas[p] for p in pinned] == [ids[p] for p in pinned]


def test_unpinned_seed_positions_start_open(tiny) -> None:
    ids = tiny.encode_text("ab-123")
    [res] = tiny.generate(["code"], regex=CODE, seed_canvas=ids, pinned=[0], max_new_tokens=6, seed=0,
                          progress=lambda e: None)
    assert res.text[0] == "a" and re.fullmatch(CODE, res.text)
    assert res.nfe >= 1  # the open positions were denoised, not copied from the seed


# ------------------------------------------------------------------------------------------- admission
LANGUAGE = r"(ab|c)[0-9]{1,2}"
ALPHABET = "abc019"


def _outputs(n: int) -> list[str]:
    """Every string of LANGUAGE over ALPHABET that fits n positions (brute force: the test's second opinion)."""
    words = ["".join(w) for k in range(1, n + 1) for w in itertools.product(ALPHABET, repeat=k)]
    return [w for w in words if re.fullmatch(LANGUAGE, w)]


def _consistent(pins: dict[int, str | None], n: int) -> bool:
    """Whether some output, EOS-padded to n, has every pin (None = EOS)."""
    for w in _outputs(n):
        padded = list(w) + [None] * (n - len(w))
        if all(padded[p] == c for p, c in pins.items()):
            return True
    return False


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pins=st.dictionaries(st.integers(0, 4), st.sampled_from(list(ALPHABET) + [None]), min_size=1, max_size=4))
def test_a_template_inconsistent_with_its_constraint_is_refused_before_any_forward(tiny, pins) -> None:
    n = 5
    engine = LLMEngine(tiny.model, tiny.tokenizer)
    eos = tiny.model.special.eos_id
    ids = {p: eos if c is None else tiny.encode_text(c)[0] for p, c in pins.items()}
    seed = [ids.get(p, tiny.model.special.mask_id) for p in range(n)]
    request = Request(tiny.encode("x"), SamplingParams(max_new_tokens=n, seed_canvas=tuple(seed),
                                                       pinned=tuple(ids)), tiny.compile(regex=LANGUAGE))
    order = sorted(pins)
    if _consistent(pins, n):
        rid = engine.add_request(request)
        assert engine.abort(rid)
        return
    with pytest.raises(PinnedTokenError) as err:
        engine.add_request(request)
    assert not engine.has_unfinished()  # nothing was queued: no forward ran for it
    k = order.index(err.value.position)
    assert _consistent({p: pins[p] for p in order[:k]}, n)  # the pins left of it fit
    assert not _consistent({p: pins[p] for p in order[:k + 1]}, n)  # with it they do not


def test_a_pinned_special_or_text_after_a_pinned_eos_is_refused(tiny) -> None:
    sp = tiny.model.special
    a = tiny.encode_text("a")[0]
    with pytest.raises(PinnedTokenError, match="position 1") as err:
        tiny.generate(["x"], seed_canvas=[a, sp.mask_id, a], pinned=[0, 1], max_new_tokens=3)
    assert err.value.position == 1
    with pytest.raises(PinnedTokenError, match="position 2"):
        tiny.generate(["x"], seed_canvas=[a, sp.eos_id, a], pinned=[0, 1, 2], max_new_tokens=3)


def test_seed_canvas_of_another_length_or_pins_without_a_seed_are_refused(tiny) -> None:
    with pytest.raises(InvalidRequestError, match="exactly max_new_tokens"):
        tiny.generate(["x"], seed_canvas=[5, 6], pinned=[0], max_new_tokens=3)
    with pytest.raises(InvalidRequestError, match="needs a seed_canvas"):
        tiny.generate(["x"], pinned=[0], max_new_tokens=3)
    with pytest.raises(InvalidRequestError, match=r"\[0, 2\)"):
        tiny.generate(["x"], seed_canvas=[5, 6], pinned=[2], max_new_tokens=2)


# ------------------------------------------------------------------------------------------- text templates
def test_hole_markers_parse_into_lengths() -> None:
    parts = parse_template('{"a": <hole>, "b": <hole:3>, "c": "<hole:..5>', hole_length=4)
    holes = [p for p in parts if not isinstance(p, str)]
    assert [(h.length, h.free) for h in holes] == [(4, False), (3, False), (5, True)]


@pytest.mark.parametrize("text, match", [("no holes", "no hole"), ("<hole:..3> then text", "free-length hole"),
                                         ("a <hole:0>", "length 0"), ("a <hole:x>", "not a hole marker")])
def test_a_bad_template_is_a_typed_error(text, match) -> None:
    with pytest.raises(TemplateError, match=match):
        parse_template(text)


def test_a_json_template_is_filled_under_its_schema_keeping_the_pinned_text(bundled) -> None:
    template = '{"name": "Ada", "age": <hole:2>, "city": "<hole:..6>'
    [res] = bundled.generate([ASK], schema=PERSON, template=template, whitespace="flexible", seed=0)
    record = json.loads(res.text)
    jsonschema.validate(record, PERSON)
    assert res.text.startswith('{"name": "Ada", "age": ') and record["name"] == "Ada"


def test_a_template_inconsistent_with_its_schema_names_the_first_unfit_position(bundled) -> None:
    template = '{"name": "Ada", "agee": <hole:2>, "city": "<hole:..6>'
    with pytest.raises(PinnedTokenError) as err:
        bundled.generate([ASK], schema=PERSON, template=template, whitespace="flexible", seed=0)
    seed = parse_and_encode(bundled, template)
    before = bundled.engine.decode(seed[:err.value.position])
    through = bundled.engine.decode(seed[:err.value.position + 1])
    assert '{"name": "Ada", "age'.startswith(before) or before.startswith('{"name": "Ada", "age')
    assert "agee" in through or not '{"name": "Ada", "age": '.startswith(through)


def parse_and_encode(llm, template: str) -> list[int]:
    from dllm_constrain.templates import template_canvas

    return list(template_canvas(parse_template(template), llm.encode_text, llm.model.special.mask_id).seed_canvas)


def test_streaming_shows_the_pinned_prefix_as_committed(bundled) -> None:
    template = '{"name": "Ada", "age": <hole:2>, "city": "<hole:..6>'
    prefix = parse_and_encode(bundled, template)[:parse_and_encode(bundled, template).index(
        bundled.model.special.mask_id)]
    updates = []
    handle = bundled.submit([ASK], schema=PERSON, template=template, whitespace="flexible", seed=0,
                            on_stream=lambda i, u: updates.append(list(u.token_ids)))
    [res] = handle.result(60)
    assert updates and updates[0][:len(prefix)] == prefix
    assert res.token_ids[:len(prefix)] == prefix


def test_a_grammar_template_is_filled_and_an_unbalanced_one_refused(bundled) -> None:
    [res] = bundled.generate(["Compute 3 plus 4 times 2."], grammar="arithmetic", template="(<hole:3>)*<hole:..4>",
                             seed=0)
    assert res.text.startswith("(") and ")*" in res.text
    with pytest.raises(PinnedTokenError) as err:
        bundled.generate(["Compute 3 plus 4 times 2."], grammar="arithmetic", template="(<hole:3>)*)<hole:..4>")
    assert err.value.position == 6  # the second ')' (after "(", three hole tokens, ")", "*")


RECORD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
          "required": ["a", "b"]}
RECORD_TEXT = '{"a":12,"b":"x"}'  # compact, declared order: what the strict schema compiles to
HOLE = (5, 7)  # the digits of "a": open; every other position pinned
FILL = "0123456789-x\""


def _record_valid(text: str) -> bool:
    """Compact JSON, keys in declared order, no others, types right (the strict compile's language)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return (isinstance(value, dict) and list(value) == ["a", "b"] and type(value["a"]) is int
            and isinstance(value["b"], str) and json.dumps(value, separators=(",", ":")) == text)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(0, len(RECORD_TEXT) - 1).filter(lambda p: not HOLE[0] <= p < HOLE[1]),
       char=st.sampled_from(list('{}":,ab1x ')))
def test_a_record_template_is_refused_exactly_when_no_fill_of_its_hole_is_schema_valid(tiny, at, char) -> None:
    text = RECORD_TEXT[:at] + char + RECORD_TEXT[at + 1:]
    fits = any(_record_valid(text[:HOLE[0]] + x + y + text[HOLE[1]:]) for x in FILL for y in FILL)
    ids = tiny.encode_text(text)  # byte-level: one token per character
    pinned = [p for p in range(len(ids)) if not HOLE[0] <= p < HOLE[1]]
    engine = LLMEngine(tiny.model, tiny.tokenizer)
    request = Request(tiny.encode("x"), SamplingParams(max_new_tokens=len(ids), seed_canvas=tuple(ids),
                                                       pinned=tuple(pinned)), tiny.compile(schema=RECORD))
    if fits:
        assert engine.abort(engine.add_request(request))
    else:
        with pytest.raises(PinnedTokenError) as err:
            engine.add_request(request)
        # everything left of the changed character is the valid record: the first unfit pin is not before it
        assert not engine.has_unfinished() and err.value.position >= at


def test_holes_asking_for_more_tokens_than_any_canvas_are_refused_before_a_canvas_is_built() -> None:
    from dllm_constrain.templates import MAX_HOLE_TOKENS

    with pytest.raises(TemplateError, match="at most"):
        parse_template('{"a": <hole:1000000000>}')
    with pytest.raises(TemplateError, match="at most"):
        parse_template("<hole> and <hole>", hole_length=MAX_HOLE_TOKENS)
