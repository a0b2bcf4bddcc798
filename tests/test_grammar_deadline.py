"""Per-call deadlines on the grammar path: every public call of a GrammarCanvasState runs under the request's
constraint_timeout and, when it runs out, answers from the witness where that is sound or raises
ConstraintTimeoutError naming the call and the canvas frontier; the shared compiled grammar stays intact; a
grammar compile runs under the compiler's compile timeout."""
from __future__ import annotations

import lark
import pytest
import torch
from lark_reference import lark_accepts

import dllm_constrain as dc
from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.constraints import deadline as deadline_module
from dllm_constrain.constraints.canvas import DEFAULT_CALL_TIMEOUT_S
from dllm_constrain.constraints.compiler import new_request_state
from dllm_constrain.errors import CompilationTimeoutError, ConstraintTimeoutError
from dllm_constrain.grammars import load_grammar

EOS, MASK = 256, 257
N = 48


def info() -> TokenizerInfo:
    return TokenizerInfo([bytes([b]) for b in range(256)] + [None, None], eos_id=EOS, mask_id=MASK,
                         vocab_size=258)


def compile_json():
    return ConstraintCompiler(info(), cache=False).compile_grammar(load_grammar("json"))


class _JumpingClock:
    """perf_counter for deadline.py that advances a second at every reading: a deadline of a millisecond fires
    at the first cooperative check of the call, wherever the call is, independent of the machine's speed."""

    def __init__(self) -> None:
        self.t = 0.0

    def perf_counter(self) -> float:
        self.t += 1.0
        return self.t


def _half_committed() -> list[int]:
    canvas = [MASK] * N
    for i, b in enumerate(b'{"a": [1, '):
        canvas[i] = b
    return canvas


def _timed_out_state(monkeypatch):
    """A JSON-grammar state built on the real clock, then the deadline clock made to jump."""
    st = compile_json().new_canvas_state(N, timeout_s=1e-3)
    monkeypatch.setattr(deadline_module, "time", _JumpingClock())
    return st


def _disagreeing(canvas: list[int]) -> list[int]:
    """canvas with a committed token right of the frontier that the current witness does not have: every call
    must analyse the canvas (and search a new witness) instead of answering from the witness."""
    c = list(canvas)
    c[20] = ord("]")
    return c


@pytest.mark.parametrize("operation", ["allowed_tokens", "fill_token_bitmask"])
def test_a_grammar_call_without_a_sound_answer_raises_the_typed_timeout_naming_itself(monkeypatch, operation) -> None:
    st = _timed_out_state(monkeypatch)
    canvas = _disagreeing(_half_committed())
    calls = {
        "allowed_tokens": lambda: st.allowed_tokens(canvas, list(range(10, N))),
        "fill_token_bitmask": lambda: st.fill_token_bitmask(canvas, list(range(10, N)),
                                                            torch.zeros((N, (258 + 31) // 32), dtype=torch.int32)),
    }
    with pytest.raises(ConstraintTimeoutError) as exc:
        calls[operation]()
    err = exc.value
    assert err.kind == "grammar" and err.operation == operation
    assert err.timeout_s == pytest.approx(1e-3)
    assert operation in str(err) and "canvas frontier at position 10" in str(err)
    assert st.stats["deadline_hits"] == 1








def test_the_request_timeout_reaches_the_grammar_state() -> None:
    cg = compile_json()
    assert new_request_state(cg, N, 0.25).timeout_s == 0.25
    assert new_request_state(cg, N, None).timeout_s is None
    assert new_request_state(cg, N).timeout_s == DEFAULT_CALL_TIMEOUT_S


def test_a_grammar_compile_runs_under_the_compile_timeout() -> None:
    comp = ConstraintCompiler(info(), cache=False)
    with pytest.raises(CompilationTimeoutError, match="compiling the grammar"):
        comp.compile_grammar(load_grammar("json"), timeout_s=1e-9)
    with pytest.raises(CompilationTimeoutError):
        comp.compile(grammar=load_grammar("json"), timeout_s=1e-9)
    cached = ConstraintCompiler(info())
    with pytest.raises(CompilationTimeoutError):  # a timeout is not cached: the next compile with time succeeds
        cached.compile_grammar('start: "x" NUM\nNUM: /[0-9]+/', timeout_s=1e-9)
    assert cached.compile_grammar('start: "x" NUM\nNUM: /[0-9]+/').accepts_text("x12")


# ---------------------------------------------------------------- through the public API (tiny model)
@pytest.fixture()
def llm(tiny_llada, tiny_tokenizer) -> dc.LLM:
    return dc.LLM.from_model(tiny_llada, tiny_tokenizer)


def test_grammar_generation_with_the_default_timeout_succeeds(llm) -> None:
    parser = lark.Lark(load_grammar("arithmetic"), parser="lalr", lexer="basic")
    for seed in range(2):
        text = dc.generate("x", model=llm, grammar="arithmetic", max_new_tokens=24, block_length=24, seed=seed)
        assert lark_accepts(parser, text), text


@pytest.mark.parametrize("timeout", [1e-6, 0.05])
def test_grammar_generation_with_a_constraint_timeout_ends_valid_or_with_a_timeout_error(llm, timeout) -> None:
    parser = lark.Lark(load_grammar("json"), parser="lalr", lexer="basic")
    for seed in range(2):
        try:
            text = dc.generate("x", model=llm, grammar="json", max_new_tokens=32, block_length=32, seed=seed,
                               temperature=0.9, constraint_timeout=timeout)
        except ConstraintTimeoutError as err:
            assert err.kind == "grammar"
            continue
        assert lark_accepts(parser, text), text
