"""generate(prompt, grammar=...) end to end with a tiny random LLaDA (the bundled model's special ids and a
byte-level tokenizer): every shipped grammar, several policies and seeds -> the text parses with Lark, or a
typed error is raised (a grammar compiled for the call compiles beside its first forward, so its refusal comes after
that forward). Counters (remasks, backtracks) are reported on the result."""
from __future__ import annotations

import lark
import pytest
from lark_reference import lark_accepts

import dllm_constrain as dc
from dllm_constrain.errors import ConstraintTooLongError, DllmConstrainError, InvalidGrammarError, InvalidRequestError
from dllm_constrain.grammars import list_grammars, load_grammar


@pytest.fixture(scope="module")
def llm():
    from conftest import build_tiny_llada, build_tiny_tokenizer

    return dc.LLM.from_model(build_tiny_llada(), build_tiny_tokenizer())


def parses(grammar: str, text: str) -> bool:
    return lark_accepts(lark.Lark(load_grammar(grammar), parser="lalr", lexer="basic"), text)


@pytest.mark.parametrize("name", list_grammars())
def test_every_shipped_grammar_gives_parsable_text(llm, name) -> None:
    for seed, policy, temperature in ((0, "quota", 1.0), (1, "threshold", 0.0)):
        try:
            [res] = llm.generate("Write one.", grammar=name, max_new_tokens=40, block_length=20, seed=seed,
                                 policy=policy, temperature=temperature)
        except DllmConstrainError:
            continue  # a typed error is an allowed outcome
        assert parses(name, res.text), (name, seed, res.text)
        assert res.remasks >= 0 and res.backtracks >= 0
        assert res.finish_reason in ("eos", "length")


def test_generate_accepts_grammar_text_and_parameterised_names(llm) -> None:
    text = dc.generate("digits", model=llm, grammar='start: D+\nD: /[0-9]/', max_new_tokens=8, seed=0)
    assert text and text.isdigit()
    out = dc.generate("a table", model=llm, grammar="csv:2", max_new_tokens=24, seed=3, temperature=1.0)
    assert parses("csv:2", out)
    res = dc.generate(["x", "y"], model=llm, grammar="arithmetic", max_new_tokens=12, return_result=True)
    assert len(res) == 2 and all(parses("arithmetic", r.text) for r in res)


def test_grammar_errors_are_typed(llm) -> None:
    with pytest.raises(InvalidGrammarError, match="unknown grammar name"):
        llm.generate("x", grammar="not_a_grammar")
    with pytest.raises(InvalidGrammarError, match="lookaround"):
        llm.generate("x", grammar='start: A\nA: /(?=a)a/')
    with pytest.raises(ConstraintTooLongError):
        llm.generate("x", grammar='start: "abcdefgh"', max_new_tokens=4)
    with pytest.raises(InvalidRequestError, match="at most one"):
        llm.generate("x", grammar="json", regex="a+")


def test_the_compiled_grammar_is_cached_per_llm(llm) -> None:
    assert llm.compile(grammar="json") is llm.compile(grammar="json")
