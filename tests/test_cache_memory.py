"""Memory bounded by bytes: the compile cache and the per-pattern caches hold entries while their estimated bytes
fit a budget, least recently used out first; refusals are cached by a hash of the constraint text, without their
tracebacks; the budget is set by `LLM(compile_cache_memory=...)` and the server's --compile-cache-memory."""
from __future__ import annotations

import traceback

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import build_tiny_tokenizer
from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.constraints.byte_lru import ByteLRU, byte_memo, deep_size, parse_bytes
from dllm_constrain.constraints.compiler import COMPILE_CACHE, DEFAULT_CACHE_BYTES, CompileCache, entry_bytes
from dllm_constrain.constraints.json_schema import patterns
from dllm_constrain.errors import InvalidRequestError, InvalidRegexError, UnsatisfiableSchemaError


@pytest.fixture(scope="module")
def info() -> TokenizerInfo:
    return TokenizerInfo.from_tokenizer(build_tiny_tokenizer(), eos_id=1, vocab_size=260)


class Sized:
    """A value whose size the test sets (and may change while it is cached)."""

    def __init__(self, n: int) -> None:
        self.n = n


def sized_lru(max_bytes: int, grows: bool = False) -> ByteLRU:
    return ByteLRU(max_bytes, lambda v: v.n, name="test cache", grows=grows, key_sizer=lambda k: 0)


# ---------------------------------------------------------------------------------------------- ByteLRU
@settings(max_examples=200, deadline=None)
@given(budget=st.integers(0, 1000),
       ops=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 400), st.booleans()), max_size=60))
def test_any_sequence_of_inserts_and_lookups_stays_within_the_budget_and_evicts_least_recent(budget, ops) -> None:
    lru = sized_lru(budget)
    model: list[tuple[int, int]] = []  # (key, size), least recently used first
    for key, size, is_lookup in ops:
        if is_lookup:
            got = lru.get(key)
            held = [k for k, _ in model]
            assert (got is not None) == (key in held)
            if key in held:
                model.append(model.pop(held.index(key)))
            continue
        stored = lru.put(key, Sized(size))
        model = [(k, s) for k, s in model if k != key]
        assert stored == (size <= budget)
        if stored:
            model.append((key, size))
            while sum(s for _, s in model) > budget:
                model.pop(0)
        assert lru.nbytes <= budget
        assert lru.keys() == [k for k, _ in model] and lru.nbytes == sum(s for _, s in model)


def test_entries_that_grew_while_cached_are_charged_their_new_size_on_the_next_insert() -> None:
    lru = sized_lru(100, grows=True)
    a, b = Sized(30), Sized(30)
    lru.put("a", a)
    lru.put("b", b)
    a.n = 80  # an automaton explored by requests
    lru.put("c", Sized(10))
    assert lru.keys() == ["b", "c"] and lru.nbytes == 40


def test_a_smaller_budget_drops_the_least_recently_used_at_once() -> None:
    lru = sized_lru(100)
    for k in "abcd":
        lru.put(k, Sized(25))
    lru.get("a")
    lru.set_max_bytes(50)
    assert lru.keys() == ["d", "a"]


def test_byte_memo_is_bounded_by_bytes_and_keeps_answers() -> None:
    calls = []

    @byte_memo(2000, sizer=lambda v: 500, name="test memo")
    def square(x: int) -> int:
        calls.append(x)
        return x * x

    assert [square(i) for i in range(10)] == [i * i for i in range(10)]
    assert square(9) == 81 and calls.count(9) == 1  # the most recent answers stay
    assert square(0) == 0 and calls.count(0) == 2  # the oldest went
    assert square.cache.nbytes <= 2000


def test_byte_memo_can_charge_entries_from_their_arguments() -> None:
    @byte_memo(20_000, name="test memo", size_of_args=lambda text: 1000 * len(text))
    def upper(text: str) -> str:
        return text.upper()

    assert upper("ab") == "AB" and upper("ab") == "AB"
    upper("abcdefgh")
    assert upper.cache.keys() == [("ab",), ("abcdefgh",)]
    assert upper("x" * 21) == "X" * 21  # charged over 21,000 bytes: over the budget, answered but not kept
    assert upper.cache.keys() == [("ab",), ("abcdefgh",)] and upper.cache.nbytes <= 20_000


def test_deep_size_counts_what_a_value_holds_and_stops_at_shared_code() -> None:
    small, big = ("ab",), tuple(str(i) * 1000 for i in range(10))
    assert deep_size(big) > deep_size(small) + 9000
    assert deep_size((len, traceback)) < 200  # functions and modules are the process's, not the value's


@pytest.mark.parametrize("text, n", [("512MB", 512 * 10**6), ("1GiB", 2**30), ("64 KiB", 65536), ("1000", 1000),
                                     (4096, 4096), ("1.5MiB", 3 * 2**19)])
def test_sizes_parse_in_decimal_and_binary_units(text, n) -> None:
    assert parse_bytes(text) == n


@pytest.mark.parametrize("bad", ["lots", "12XB", -1, "", True, 1.5])
def test_bad_sizes_are_typed_errors(bad) -> None:
    with pytest.raises(InvalidRequestError):
        parse_bytes(bad, "the budget")


# ---------------------------------------------------------------------------------------------- compile cache
def test_the_compile_cache_evicts_by_bytes_least_recently_used_first(info) -> None:
    one = entry_bytes(ConstraintCompiler(info, cache=False).compile(regex="a{1}"))
    cache = CompileCache(max_bytes=int(2.5 * one) + 512)
    compiler = ConstraintCompiler(info, cache=cache)
    for n in range(1, 6):
        compiler.compile(regex=f"a{{{n}}}")
        assert cache.nbytes <= cache.max_bytes
    assert len(cache) == 2 and cache.evictions == 3
    hits = cache.hits
    compiler.compile(regex="a{5}")
    assert cache.hits == hits + 1  # the most recent stayed


@settings(max_examples=25, deadline=None)
@given(budget_kb=st.integers(1, 3000), picks=st.lists(st.integers(0, 11), min_size=1, max_size=12))
def test_any_sequence_of_compiles_keeps_the_compile_cache_within_its_budget(info, budget_kb, picks) -> None:
    constraints = [{"regex": f"a{{{n + 1}}}"} for n in range(6)] + [
        {"regex": "(unclosed"}, {"schema": {"type": "integer", "minimum": 3, "maximum": 1}},
        {"schema": {"type": "string", "maxLength": 4}}, {"regex": "[a-z]+@[a-z]+"},
        {"schema": {"enum": ["x", "yy", 3]}}, {"grammar": 'start: "a" "b"'}]
    cache = CompileCache(max_bytes=budget_kb * 1024)
    compiler = ConstraintCompiler(info, cache=cache)
    for i in picks:
        try:
            compiler.compile(**constraints[i])
        except (InvalidRegexError, UnsatisfiableSchemaError):
            pass
        assert cache.nbytes <= cache.max_bytes


def test_a_constraint_larger_than_the_budget_is_compiled_but_not_kept(info) -> None:
    cache = CompileCache(max_bytes=1024)
    compiled = ConstraintCompiler(info, cache=cache).compile(regex="[a-z]+")
    assert compiled.min_bytes() == 1
    assert len(cache) == 0 and cache.nbytes == 0


def test_cached_entries_are_keyed_by_a_hash_never_by_the_constraint_text(info) -> None:
    cache = CompileCache()
    compiler = ConstraintCompiler(info, cache=cache)
    marker = "needle_property_name_" * 20
    bad = {"type": "object", "properties": {marker: {"type": "integer", "minimum": 5, "maximum": 1}},
           "required": [marker]}
    compiler.compile(regex=f"({marker})+")
    with pytest.raises(UnsatisfiableSchemaError):
        compiler.compile(schema=bad)
    assert len(cache) == 2
    for scope, (kind, digest, options) in cache.keys():
        assert isinstance(digest, bytes) and len(digest) == 32
        assert marker not in repr((scope, kind, options))


def test_a_cached_refusal_is_raised_afresh_without_the_compilation_frames(info) -> None:
    cache = CompileCache()
    compiler = ConstraintCompiler(info, cache=cache)
    with pytest.raises(InvalidRegexError) as first:
        compiler.compile(regex="(unclosed")
    with pytest.raises(InvalidRegexError) as second:
        compiler.compile(regex="(unclosed")
    with pytest.raises(InvalidRegexError) as third:
        compiler.compile(regex="(unclosed")
    assert cache.misses == 1 and cache.hits == 2
    assert str(second.value) == str(first.value) and second.value is not third.value
    frames = [f.name for f in traceback.extract_tb(third.value.__traceback__)]
    assert "_build_regex" not in frames and "parse_regex" not in frames
    assert len(frames) == len([f.name for f in traceback.extract_tb(second.value.__traceback__)])  # no chaining


def test_a_refusal_is_charged_its_message_not_the_schema(info) -> None:
    cache = CompileCache()
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(2000)},
            "allOf": [{"type": "string"}]}
    with pytest.raises(UnsatisfiableSchemaError):
        ConstraintCompiler(info, cache=cache).compile(schema=wide)
    assert 0 < cache.nbytes < 4096 < len(str(wide))


def test_the_process_cache_has_the_stated_default_budget() -> None:
    assert DEFAULT_CACHE_BYTES == 256 * 2**20 and COMPILE_CACHE.maxsize is None


# ---------------------------------------------------------------------------------------------- per-pattern caches
def test_per_pattern_caches_stay_within_their_budgets() -> None:
    budget = 2**20  # a few reading DFAs (each about 300 KB with the native term store)
    old = patterns._READING_DFAS.max_bytes, patterns._PATTERN_CACHE.max_bytes
    patterns._READING_DFAS.set_max_bytes(budget)
    patterns._PATTERN_CACHE.set_max_bytes(budget // 256)
    try:
        for i in range(60):
            p = f"^x{i}_[a-z]+\\d$"
            assert patterns.pattern_matches(p, f"x{i}_ab1", "#", "all")  # Python's reading and ECMA-262's
            assert not patterns.pattern_matches(p, f"y{i}", "#", "any")
            assert patterns._READING_DFAS.nbytes <= budget
            assert patterns._PATTERN_CACHE.nbytes <= budget // 256
        assert patterns._READING_DFAS.evictions > 0 and patterns._PATTERN_CACHE.evictions > 0
    finally:
        patterns._READING_DFAS.set_max_bytes(old[0])
        patterns._PATTERN_CACHE.set_max_bytes(old[1])


# ---------------------------------------------------------------------------------------------- configuration
def test_the_server_flag_takes_a_size_and_refuses_a_bad_one(capsys) -> None:
    from dllm_constrain.serve.__main__ import parse_args

    assert parse_args(["--compile-cache-memory", "64MB"]).compile_cache_memory == 64 * 10**6
    assert parse_args([]).compile_cache_memory is None
    with pytest.raises(SystemExit):
        parse_args(["--compile-cache-memory", "plenty"])
    assert "--compile-cache-memory" in capsys.readouterr().err


def test_llm_option_sets_the_process_budget_and_checks_it_before_loading() -> None:
    from dllm_constrain import LLM

    with pytest.raises(InvalidRequestError, match="budget"):
        LLM(compile_cache_memory="plenty")
    try:
        LLM(compile_cache_memory="64MiB")
        assert COMPILE_CACHE.max_bytes == 64 * 2**20
    finally:
        COMPILE_CACHE.set_max_bytes(DEFAULT_CACHE_BYTES)
