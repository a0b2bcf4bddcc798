"""One compiler entry and one bounded cache: `ConstraintCompiler.compile(schema= | regex= | grammar=)` returns a
`Compiled`, keyed by the normalised constraint in the process's one LRU (`COMPILE_CACHE`); a request's canvas state
is made from the compiled constraint for the request's max_new_tokens (the canvas length given once)."""
from __future__ import annotations

import pytest

from conftest import build_tiny_tokenizer
from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.constraints.compiler import (
    COMPILE_CACHE,
    DEFAULT_CACHE_BYTES,
    CompileCache,
    Compiled,
    ConstraintKey,
)
from dllm_constrain.engine.state import Request, SamplingParams
from dllm_constrain.errors import (
    ConstraintTooLongError,
    InvalidRequestError,
    UnsatisfiableSchemaError,
)

INTEGER = {"type": "integer"}


@pytest.fixture(scope="module")
def info() -> TokenizerInfo:
    return TokenizerInfo.from_tokenizer(build_tiny_tokenizer(), eos_id=1, vocab_size=260)


def test_the_cache_never_holds_more_than_its_bound(info) -> None:
    cache = CompileCache(maxsize=3)
    compiler = ConstraintCompiler(info, cache=cache)
    for n in range(8):
        compiler.compile(regex=f"a{{{n + 1}}}")
        assert len(cache) <= 3
    assert (len(cache), cache.misses, cache.hits) == (3, 8, 0)
    first = ConstraintKey("regex", "a{1}")
    assert (info.fingerprint, first) not in cache  # the least recently used went first
    assert (info.fingerprint, ConstraintKey("regex", "a{8}")) in cache


def test_the_same_normalised_constraint_is_a_hit(info) -> None:
    cache = CompileCache(maxsize=4)
    compiler = ConstraintCompiler(info, cache=cache)
    as_dict = compiler.compile(schema=INTEGER)
    assert compiler.compile(schema='{"type": "integer"}') is as_dict  # a JSON string normalises to the same dict
    assert ConstraintCompiler(info, cache=cache).compile(schema=dict(INTEGER)) is as_dict  # another compiler
    assert (cache.misses, cache.hits) == (1, 2)
    assert compiler.compile(schema=INTEGER, whitespace="flexible") is not as_dict  # other options, other entry
    assert compiler.compile(regex="[0-9]+") is compiler.compile(regex="[0-9]+")
    assert len(cache) == 3


def test_a_compiled_constraint_worn_out_by_its_requests_is_compiled_afresh_and_the_old_one_keeps_working(
        info) -> None:
    cache = CompileCache(maxsize=4)
    compiler = ConstraintCompiler(info, cache=cache)
    old = compiler.compile(regex="[0-9]+")
    assert compiler.compile(regex="[0-9]+") is old and not old.worn_out()
    old.dfa.max_states = 2 * old.dfa.n_states  # the automaton now holds half its state bound
    assert old.worn_out()
    fresh = compiler.compile(regex="[0-9]+")
    assert fresh is not old and not fresh.worn_out()
    assert compiler.compile(regex="[0-9]+") is fresh
    state = Request([0], SamplingParams(max_new_tokens=4), old).constraint_state()  # a request holding the old one
    assert state.is_completable([state.mask_id] * 4)


def test_past_twice_its_exploration_allowance_a_compiled_constraint_is_worn_out(info) -> None:
    compiled = ConstraintCompiler(info, cache=False).compile(regex="[0-9]+")
    compiled.algebra.explore_max_bytes = compiled.ta.footprint_bytes() // 2
    assert compiled.worn_out()


def test_a_refusal_is_cached_and_re_raised(info) -> None:
    cache = CompileCache(maxsize=2)
    compiler = ConstraintCompiler(info, cache=cache)
    for _ in range(2):
        with pytest.raises(UnsatisfiableSchemaError):
            compiler.compile(schema={"type": "integer", "minimum": 5, "maximum": 1})
    assert (cache.misses, cache.hits) == (1, 1)


def test_the_default_cache_is_the_process_one_and_bounded(info) -> None:
    assert ConstraintCompiler(info).cache is COMPILE_CACHE and COMPILE_CACHE.max_bytes == DEFAULT_CACHE_BYTES
    assert ConstraintCompiler(info, cache=False).cache is None
    with pytest.raises(InvalidRequestError):
        CompileCache(maxsize=0)


def test_one_entry_for_every_kind_and_one_compiled_type(info) -> None:
    compiler = ConstraintCompiler(info, cache=CompileCache(4))
    regular = compiler.compile(regex="[0-9]+")
    grammar = compiler.compile(grammar='start: "a" "b"')
    schema = compiler.compile(schema=INTEGER)
    for compiled in (regular, grammar, schema):
        assert isinstance(compiled, Compiled)
    assert grammar.accepts_text("ab") and not grammar.accepts_text("a")
    with pytest.raises(InvalidRequestError, match="exactly one"):
        compiler.compile(regex="a", schema=INTEGER)
    with pytest.raises(InvalidRequestError, match="exactly one"):
        compiler.compile()


def test_the_engine_makes_the_state_for_the_requests_canvas(info) -> None:
    compiled = ConstraintCompiler(info, cache=CompileCache(2)).compile(regex="[0-9]+")
    state = Request([5], SamplingParams(max_new_tokens=6), compiled).constraint_state()
    assert state is not None and state.n == 6
    with pytest.raises(ConstraintTooLongError):
        Request([5], SamplingParams(max_new_tokens=2), ConstraintCompiler(info).compile(regex="[0-9]{5}")
                ).constraint_state()


def test_a_state_made_for_another_canvas_is_a_typed_error(info) -> None:
    compiled = ConstraintCompiler(info, cache=CompileCache(2)).compile(regex="[0-9]+")
    with pytest.raises(InvalidRequestError, match="made for a canvas of 4 positions.*max_new_tokens is 6"):
        Request([5], SamplingParams(max_new_tokens=6), compiled.new_canvas_state(4)).constraint_state()
    with pytest.raises(InvalidRequestError, match="canvas length must be a positive integer"):
        compiled.new_canvas_state(0)


def test_a_normalized_schema_is_compiled_without_reading_the_schema_again(monkeypatch) -> None:
    """normalize_schema reads a schema once; compile(schema=) takes the NormalizedSchema as it is and shares the
    cache entry of the same schema given raw."""
    from dllm_constrain.constraints import json_schema
    from dllm_constrain.constraints.json_schema import NormalizedSchema, inputs, normalize_schema

    compiler = ConstraintCompiler(TokenizerInfo.from_tokenizer(build_tiny_tokenizer(), eos_id=1, vocab_size=260),
                                  cache=CompileCache(4))
    normalized = normalize_schema('{"type": "integer", "maximum": 5}')
    assert isinstance(normalized, NormalizedSchema) and normalized.schema == {"type": "integer", "maximum": 5}
    assert normalize_schema(normalized) is normalized

    def read_again(x):
        raise AssertionError("the schema was read again")

    monkeypatch.setattr(inputs, "normalize_schema_input", read_again)
    monkeypatch.setattr(json_schema, "normalize_schema_input", read_again)
    compiled = compiler.compile(schema=normalized)
    monkeypatch.undo()
    assert compiler.compile(schema={"type": "integer", "maximum": 5}) is compiled
