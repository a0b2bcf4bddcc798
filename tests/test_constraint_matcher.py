"""The left-to-right matcher (constraints/matcher.py): bounded, its rows are the canvas state's rows at the
frontier of a canvas open to its right; unbounded, it follows the token automaton and refuses what leaves it."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import build_tiny_tokenizer
from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.constraints.compiler import CompileCache


@pytest.fixture(scope="module")
def compiler() -> ConstraintCompiler:
    info = TokenizerInfo.from_tokenizer(build_tiny_tokenizer(), eos_id=1, vocab_size=260)
    return ConstraintCompiler(info, cache=CompileCache(8))


PATTERNS = [r"(ab|[0-9]{2,5})+-[a-c]*", r"[a-c]{1,3}(x|yz)?", r"\{\"a\":[0-9]{1,4}\}"]


@settings(max_examples=15, deadline=None)
@given(pattern=st.sampled_from(PATTERNS), extra=st.integers(0, 5), picks=st.lists(st.integers(0, 10**6), max_size=40))
def test_a_bounded_matchers_rows_are_the_canvas_rows_at_the_frontier(compiler, pattern, extra, picks) -> None:
    cc = compiler.compile(regex=pattern)
    n = cc.min_tokens() + extra
    m = cc.matcher(n)
    state = cc.new_canvas_state(n, timeout_s=None)
    out: list[int] = []
    for pick in picks:
        if len(out) >= n:
            assert m.packed_row() is None
            break
        row = torch.from_numpy(m.fill_mask().copy())
        assert torch.equal(row, state.allowed_tokens(out + [cc.mask_id] * (n - len(out)), [len(out)])[0])
        offered = row.nonzero().flatten().tolist()
        assert offered  # a completable canvas always offers a token
        token = offered[pick % len(offered)]
        assert m.is_allowed(token) and m.advance(token)
        out.append(token)
    if out and m.is_accepting():
        assert cc.accepts_tokens(out)


def test_an_unbounded_matcher_refuses_a_token_outside_the_language_and_stays(compiler) -> None:
    cc = compiler.compile(regex="ab")
    info = compiler.tokenizer_info
    a, b = info.token_bytes.index(b"a"), info.token_bytes.index(b"b")
    m = cc.matcher()
    assert m.fill_mask()[a] and not m.is_allowed(b)
    assert not m.advance(b) and m.advance(a) and not m.is_accepting()
    assert not m.advance(cc.eos_id)  # "a" is not accepted: EOS is refused
    assert m.advance(b) and m.is_accepting() and m.advance(cc.eos_id) and m.consumed == 3
    m.reset()
    assert m.consumed == 0 and m.fill_mask()[a]
