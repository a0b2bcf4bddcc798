"""`compiler.GrammarCompiler` is a door onto `ConstraintCompiler`'s grammar path: one compile cache per process
(`COMPILE_CACHE`), so a grammar compiled through either door is compiled once and refusals are shared."""
from __future__ import annotations

import pytest

from conftest import build_tiny_tokenizer
from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.constraints.compiler import GrammarCompiler, clear_cache, compile_grammar
from dllm_constrain.constraints.compiler import COMPILE_CACHE, ConstraintKey
from dllm_constrain.errors import InvalidGrammarError

GRAMMAR = 'start: "a" B\nB: /b+/\n'


@pytest.fixture(scope="module")
def info() -> TokenizerInfo:
    return TokenizerInfo.from_tokenizer(build_tiny_tokenizer(), eos_id=1, vocab_size=260)


def test_both_doors_share_the_one_cache(info) -> None:
    clear_cache()
    assert len(COMPILE_CACHE) == 0
    via_door = GrammarCompiler(info).compile(GRAMMAR, name="ab")
    assert (info.fingerprint, ConstraintKey("grammar", GRAMMAR, ("start",))) in COMPILE_CACHE
    assert ConstraintCompiler(info).compile(grammar=GRAMMAR) is via_door
    assert compile_grammar(GRAMMAR, info) is via_door
    assert GrammarCompiler(info).compile(GRAMMAR) is via_door
    assert via_door.name == "ab" and via_door.accepts_text("abb") and not via_door.accepts_text("a")


def test_the_start_rule_is_part_of_the_key(info) -> None:
    g = 'start: "a"\nother: "b"\n'
    comp = GrammarCompiler(info)
    assert comp.compile(g) is not comp.compile(g, start="other")
    assert comp.compile(g, start="other").accepts_text("b")


def test_a_refusal_is_cached_and_typed(info) -> None:
    comp = GrammarCompiler(info)
    bad = 'start: A\nA: /(?!a)b/'
    misses = COMPILE_CACHE.misses
    for _ in range(2):
        with pytest.raises(InvalidGrammarError, match="lookaround"):
            comp.compile(bad)
    assert COMPILE_CACHE.misses == misses + 1
    with pytest.raises(InvalidGrammarError, match="must be a string"):
        comp.compile(None)  # type: ignore[arg-type]
