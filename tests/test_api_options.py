"""Keyword routing (dllm_constrain.options): every keyword of `generate` lands on the object whose field it names,
each default is defined once (a dataclass field default), and an unknown keyword is a typed error."""
from __future__ import annotations

from dataclasses import fields

import pytest

import dllm_constrain as dc
from dllm_constrain.cli import build_parser, field_options
from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.state import OutputConstraint, SamplingParams
from dllm_constrain.errors import InvalidRequestError
from dllm_constrain.options import (
    CONSTRAINT_TIMEOUT_S,
    OPTION_NAMES,
    GenerationDefaults,
    generate_options,
    route_options,
)

CHECKPOINT = GenerationDefaults(max_new_tokens=48, block_length=16, policy="threshold").sampling_params()


@pytest.mark.parametrize("name, value", [("max_new_tokens", 24), ("steps", 6), ("block_length", 8),
                                         ("policy", "margin"), ("threshold", 0.5), ("temperature", 0.7),
                                         ("seed", 11), ("entropy_bound", 0.3), ("timeout", 5.0),
                                         ("constraint_timeout", None)])
def test_a_per_request_keyword_lands_on_the_sampling_params_field_of_its_name(name, value) -> None:
    routed = route_options({name: value}, CHECKPOINT)
    assert getattr(routed.sampling, name) == value
    assert routed.engine == {} and routed.sampling.constraint is None


@pytest.mark.parametrize("name, value", [("kv_cache", "none"), ("refresh", "steps"), ("refresh_steps", 2),
                                         ("keep_ratio", 0.5), ("logits_budget_bytes", 1 << 20),
                                         ("max_logit_rows", 4), ("backend", "torch")])
def test_an_engine_keyword_lands_on_the_engine_config_field_of_its_name(name, value) -> None:
    routed = route_options({name: value}, CHECKPOINT)
    assert routed.engine == {name: value}
    assert getattr(EngineConfig().with_overrides(**routed.engine), name) == value
    assert routed.sampling == CHECKPOINT


def test_constraint_keywords_land_on_the_output_constraint_normalised_once() -> None:
    routed = route_options({"schema": '{"type": "integer"}', "strict": False, "compile_timeout": 2.0}, CHECKPOINT)
    assert routed.sampling.constraint == OutputConstraint(schema={"type": "integer"}, strict=False,
                                                          compile_timeout=2.0)
    assert route_options({"regex": "[0-9]+"}, CHECKPOINT).sampling.constraint == OutputConstraint(regex="[0-9]+")
    grammar = route_options({"grammar": "json"}, CHECKPOINT).sampling.constraint
    assert grammar is not None and "start" in grammar.grammar  # the shipped name is resolved to its Lark text
    assert route_options({"schema": None, "strict": True}, CHECKPOINT).sampling.constraint is None


def test_keywords_replace_fields_of_a_given_sampling_params_and_nothing_else() -> None:
    given = SamplingParams(max_new_tokens=12, temperature=0.5, constraint=OutputConstraint(regex="a+"))
    routed = route_options({"seed": 3, "strict": False}, CHECKPOINT, given)
    assert routed.sampling == SamplingParams(max_new_tokens=12, temperature=0.5, seed=3,
                                             constraint=OutputConstraint(regex="a+", strict=False))
    # None for a field the checkpoint sets means "keep the base value", for the others it is the value
    assert route_options({"max_new_tokens": None}, CHECKPOINT, given).sampling.max_new_tokens == 12
    assert route_options({"max_new_tokens": None}, CHECKPOINT).sampling.max_new_tokens == 48
    assert route_options({"constraint_timeout": None}, CHECKPOINT).sampling.constraint_timeout is None


def test_each_default_is_the_dataclass_field_default() -> None:
    assert CONSTRAINT_TIMEOUT_S == SamplingParams.constraint_timeout == SamplingParams().constraint_timeout
    assert GenerationDefaults().sampling_params() == SamplingParams()
    opts = generate_options({})
    for f in fields(SamplingParams):
        if f.name not in ("constraint", "max_new_tokens", "steps", "block_length", "policy", "threshold", "schedule",
                          "schedule_eps", "stop_token_ids"):
            assert opts[f.name] == f.default, f.name
    for f in fields(OutputConstraint):
        assert opts[f.name] == f.default, f.name
    # the checkpoint's fields are None there: "the checkpoint's generation_config.json, else the field default"
    assert route_options(generate_options({}), SamplingParams()).sampling == SamplingParams()
    assert route_options(generate_options({}), CHECKPOINT).sampling == CHECKPOINT


def test_every_field_of_the_three_objects_is_an_option_and_nothing_else_is() -> None:
    names = {f.name for cls in (SamplingParams, OutputConstraint, EngineConfig) for f in fields(cls)}
    assert set(OPTION_NAMES) == (names - {"constraint"}) | {"progress", "preset"}


@pytest.mark.parametrize("kwargs, match", [({"max_tokens": 32}, "'max_tokens'"),
                                           ({"temprature": 0.5, "sede": 1}, "'sede', 'temprature'"),
                                           ({"constraint": OutputConstraint(regex="a")}, "'constraint'")])
def test_an_unknown_keyword_is_the_typed_error_naming_it(kwargs, match) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        route_options(kwargs, CHECKPOINT)
    with pytest.raises(InvalidRequestError, match=match):
        dc.generate("hello", **kwargs)  # refused before any model is loaded


def test_the_constraint_of_a_given_sampling_params_is_normalised_like_a_keyword() -> None:
    given = SamplingParams(constraint=OutputConstraint(schema='{"type": "integer"}'))
    assert route_options({}, CHECKPOINT, given).sampling.constraint == OutputConstraint(schema={"type": "integer"})
    named = SamplingParams(constraint=OutputConstraint(grammar="json"))
    assert "start" in route_options({}, CHECKPOINT, named).sampling.constraint.grammar


def test_a_sampling_params_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="sampling_params must be a SamplingParams"):
        route_options({}, CHECKPOINT, {"max_new_tokens": 8})  # type: ignore[arg-type]


def test_the_cli_flags_are_the_fields_and_route_the_same_way() -> None:
    args = build_parser().parse_args(["hi", "--max-new-tokens", "8", "--temperature", "0.5", "--kv-cache", "none"])
    options = field_options(args)
    assert options == {"max_new_tokens": 8, "temperature": 0.5, "kv_cache": "none"}
    routed = route_options(options, CHECKPOINT)
    assert (routed.sampling.max_new_tokens, routed.sampling.temperature, routed.engine) == (8, 0.5,
                                                                                           {"kv_cache": "none"})
    unset = field_options(build_parser().parse_args(["hi"]))
    assert unset == {} and route_options(unset, CHECKPOINT).sampling == CHECKPOINT


def test_a_sampling_params_object_and_the_same_keywords_generate_the_same(tiny_llada, tiny_tokenizer) -> None:
    llm = dc.LLM.from_model(tiny_llada, tiny_tokenizer)
    params = SamplingParams(max_new_tokens=8, block_length=4, temperature=0.9, seed=1,
                            constraint=OutputConstraint(regex="[0-9]+"))
    [by_object] = llm.generate(["a number"], params)
    [by_keywords] = llm.generate(["a number"], max_new_tokens=8, block_length=4, temperature=0.9, seed=1,
                                 regex="[0-9]+")
    assert by_object.token_ids == by_keywords.token_ids and by_object.text.isdigit()
    assert dc.generate("a number", params, model=llm) == by_object.text
    with pytest.raises(InvalidRequestError, match="'max_tokens'"):
        llm.generate(["a number"], params, max_tokens=4)
