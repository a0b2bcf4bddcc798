"""The token bitmask as the one mask format: its helpers (kernels.bitmask), the constraints' in-place fill against
their bool rows, the protocol's packing of an allowed_tokens-only constraint, and the engine's mask."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.constraints.compiler import GrammarCompiler
from dllm_constrain.constraints.protocol import fill_token_bitmask
from dllm_constrain.kernels import masked_row_stats as mrs
from dllm_constrain.kernels import bitmask as bitmask_module
from dllm_constrain.kernels.bitmask import (
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    bitmask_bytes,
    clear_token,
    pack_bool_mask,
    packed_width,
    row_allows,
    row_tokens,
    set_token,
    single_token_rows,
    single_tokens,
    single_tokens_reference,
    unpack_bitmask,
    unpack_bitmask_into,
    write_row,
)

from engine_fakes import DigitsConstraint


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 200), st.integers(0, 2**31 - 1))
def test_pack_and_unpack_are_inverse_and_match_the_word_arithmetic(rows, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    allowed = torch.rand(rows, vocab, generator=g) < 0.4
    packed = pack_bool_mask(allowed)
    assert packed.dtype == torch.int32 and packed.shape == (rows, packed_width(vocab))
    assert torch.equal(unpack_bitmask(packed, vocab), allowed)
    for r in range(rows):  # xgrammar's words: bit j of word w = token 32 w + j, two's complement
        for w in range(packed.shape[1]):
            value = sum(1 << j for j in range(32) if 32 * w + j < vocab and bool(allowed[r, 32 * w + j]))
            assert int(packed[r, w]) == (value - (1 << 32) if value >= 1 << 31 else value)
    buf = torch.empty(rows * packed.shape[1] * 32, dtype=torch.uint8)
    assert torch.equal(unpack_bitmask_into(packed, buf, invert=True)[:, :vocab], ~allowed)
    assert torch.equal(unpack_bitmask_into(packed, buf)[:, :vocab], allowed)


@st.composite
def masked_blocks(draw):
    """A logits block and a bitmask covering it: words all ones, all zeros or mixed, extra rows and words."""
    rows, vocab = draw(st.integers(0, 5)), draw(st.integers(1, 200))
    extra_rows, extra_words = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    words = st.one_of(st.just(-1), st.just(0), st.integers(-2**31, 2**31 - 1))
    bm = torch.tensor(draw(st.lists(st.lists(words, min_size=packed_width(vocab) + extra_words,
                                             max_size=packed_width(vocab) + extra_words),
                                    min_size=rows + extra_rows, max_size=rows + extra_rows)),
                      dtype=torch.int32).reshape(rows + extra_rows, packed_width(vocab) + extra_words)
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    return logits, bm


def reference_masked(logits: torch.Tensor, bm: torch.Tensor, value: float) -> torch.Tensor:
    allowed = unpack_bitmask(bm[: logits.shape[0]].contiguous(), logits.shape[1])
    return logits.masked_fill(~allowed, value)


@settings(max_examples=150, deadline=None)
@given(masked_blocks(), st.sampled_from([float("-inf"), -1e4]))
def test_apply_token_bitmask_inplace_equals_unpack_and_masked_fill(block, value):
    logits, bm = block
    want = reference_masked(logits, bm, value)
    out = apply_token_bitmask_inplace(logits, bm, value)
    assert out is logits and torch.equal(logits, want)


@settings(max_examples=40, deadline=None)
@given(masked_blocks())
def test_apply_token_bitmask_inplace_torch_path_for_other_layouts(block):
    # a strided view (a column slice) and float64 go through the torch reference, writing through the view
    logits, bm = block
    wide = torch.cat([logits, torch.zeros(logits.shape[0], 3)], dim=1)
    view = wide[:, : logits.shape[1]]
    apply_token_bitmask_inplace(view, bm)
    assert torch.equal(wide[:, : logits.shape[1]], reference_masked(logits, bm, float("-inf")))
    as64 = logits.double()
    apply_token_bitmask_inplace(as64, bm)
    assert torch.equal(as64, reference_masked(logits.double(), bm, float("-inf")))


def test_apply_token_bitmask_inplace_refuses_a_bitmask_that_does_not_cover_the_logits():
    with pytest.raises(ValueError, match="covers 32 tokens"):
        apply_token_bitmask_inplace(torch.zeros(1, 33), allocate_token_bitmask(1, 32))
    with pytest.raises(ValueError, match="1 rows"):
        apply_token_bitmask_inplace(torch.zeros(2, 8), allocate_token_bitmask(1, 8))


def test_the_cpu_kernel_is_built_and_used_for_float32_blocks(monkeypatch):
    if bitmask_module._bitmask_cpu is None:
        pytest.skip("kernels/_bitmask_cpu.c is not built (no C compiler at install time): the torch path only")
    calls = []
    real = bitmask_module._bitmask_cpu

    class Spy:
        @staticmethod
        def apply_token_bitmask(*args):
            calls.append(args[0].shape)
            return real.apply_token_bitmask(*args)

    monkeypatch.setattr(bitmask_module, "_bitmask_cpu", Spy)
    bm = allocate_token_bitmask(2, 40)
    clear_token(bm, 1, 5)
    logits = torch.zeros(2, 40)
    apply_token_bitmask_inplace(logits, bm)
    assert calls == [(2, 40)] and logits[1, 5] == float("-inf") and logits.isfinite().sum() == 79


def test_the_old_import_path_still_names_the_helpers():
    assert mrs.pack_bool_mask is pack_bool_mask and mrs.unpack_bitmask is unpack_bitmask
    assert mrs.packed_width is packed_width


def test_allocate_allows_everything_and_rows_are_written_whole():
    out = allocate_token_bitmask(2, 40)
    assert out.dtype == torch.int32 and out.shape == (2, 2) and bool((out == -1).all())
    o = bitmask_bytes(out)
    write_row(o[0], np.array([True, False, True] + [False] * 37))  # a bool row is packed
    write_row(o[1], np.packbits(np.eye(40, dtype=bool)[39], bitorder="little"))  # a packed row is copied
    assert unpack_bitmask(out, 40)[0].nonzero().flatten().tolist() == [0, 2]
    assert unpack_bitmask(out, 64)[1].nonzero().flatten().tolist() == [39]
    write_row(o[1], None)
    assert not bool(out[1].any())


def test_row_helpers_read_both_forms_of_a_row():
    bools = np.zeros(70, dtype=bool)
    packed = np.zeros(12, dtype=np.uint8)
    for row in (bools, packed):
        for t in (0, 31, 69):
            set_token(row, t)
        set_token(row, 500)  # past the row: ignored
        assert row_tokens(row, 70).tolist() == [0, 31, 69]
        assert row_allows(row, 31) and not row_allows(row, 30) and not row_allows(row, 500)
    dst = np.ones(70, dtype=bool)
    write_row(dst, packed)
    assert np.array_equal(dst, bools)


def test_single_token_rows_and_clear_token():
    allowed = torch.zeros(5, 70, dtype=torch.bool)
    allowed[0, 31] = True  # bit 31: the sign bit of its word
    allowed[1, [3, 4]] = True  # two tokens in one word
    allowed[2, [3, 40]] = True  # two words
    allowed[4, 69] = True
    packed = pack_bool_mask(allowed)
    assert single_token_rows(packed).tolist() == [True, False, False, False, True]
    clear_token(packed, 1, 4)
    clear_token(packed, 4, 69)
    clear_token(packed, 4, 5000)  # past the row: ignored
    assert single_token_rows(packed).tolist() == [True, True, False, False, False]


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.lists(st.integers(0, 199), max_size=3), min_size=1, max_size=6),
       vocab=st.integers(1, 200))
def test_single_tokens_names_the_one_token_of_each_single_token_row(rows, vocab):
    """For rows allowing no token, one token (any bit of any word, the sign bit included) or several: the native
    kernel and the numpy reference give the token of a single-token row and -1 for every other row."""
    allowed = torch.zeros(len(rows), vocab, dtype=torch.bool)
    for r, toks in enumerate(rows):
        for t in toks:
            allowed[r, t % vocab] = True
    packed = pack_bool_mask(allowed)
    expected = [int(row.nonzero()[0, 0]) if int(row.sum()) == 1 else -1 for row in allowed]
    assert single_tokens(packed).tolist() == expected
    assert single_tokens_reference(packed).tolist() == expected
    assert single_token_rows(packed).tolist() == [t >= 0 for t in expected]
    none = torch.zeros((0, packed.shape[1]), dtype=torch.int32)
    assert single_tokens(none).tolist() == [] and single_tokens_reference(none).tolist() == []


def test_single_tokens_uses_the_native_kernel_when_built():
    assert bitmask_module._bitmask_cpu is not None, "the C kernel was not built (pip install -e . builds it)"
    assert hasattr(bitmask_module._bitmask_cpu, "single_tokens")


def _regex_state(n: int):
    info = TokenizerInfo([b"a", b"b", b"ab", b"ba", b"{", b"}", None, None], eos_id=6, mask_id=7)
    cc = ConstraintCompiler(info).compile_regex(r"\{(ab|ba)*a?\}")
    return cc.new_canvas_state(n, expand_budget=None, timeout_s=None), info


@pytest.mark.parametrize("width_delta", [0, 40, -1])
def test_the_regex_canvas_fills_the_rows_its_allowed_tokens_returns(width_delta):
    state, info = _regex_state(8)
    vocab = state.vocab_size
    rng = random.Random(0)
    canvas = [info.mask_id] * 8
    for _ in range(6):
        positions = [p for p in range(8) if canvas[p] == info.mask_id] + [p for p in range(8)
                                                                          if canvas[p] != info.mask_id][:1]
        bools = state.allowed_tokens(canvas, positions)
        width = max(1, vocab + width_delta)
        out = allocate_token_bitmask(len(positions) + 1, width)
        state.fill_token_bitmask(canvas, positions, out)
        got = unpack_bitmask(out[: len(positions)], packed_width(width) * 32)
        k = min(width, vocab)
        assert torch.equal(got[:, :k], bools[:, :k]) and not bool(got[:, k:].any())
        assert bool((out[len(positions)] == -1).all())  # rows past the positions are left alone
        open_rows = [j for j, p in enumerate(positions) if canvas[p] == info.mask_id and bools[j].any()]
        j = rng.choice(open_rows)
        tok = rng.choice(bools[j].nonzero().flatten().tolist())
        kept = state.select_commits(canvas, [(positions[j], tok, 1.0)])
        for p, t in kept:
            canvas[p] = t


def test_the_grammar_canvas_fills_the_rows_its_allowed_tokens_returns():
    strings = ["1", "2", "+", "12", "1+", "+2"]
    info = TokenizerInfo([None, None] + [s.encode() for s in strings], eos_id=0, mask_id=1)
    cg = GrammarCompiler(info).compile('start: NUM ("+" NUM)*\nNUM: /[0-9]+/\n')
    state = cg.new_canvas_state(7)
    rng = random.Random(1)
    for _ in range(12):
        canvas = [t if rng.random() < 0.5 else info.mask_id for t in state.witness]
        positions = list(range(7))
        out = allocate_token_bitmask(7, info.vocab_size)
        state.fill_token_bitmask(canvas, positions, out)
        bools = state.allowed_tokens(canvas, positions)
        assert torch.equal(unpack_bitmask(out, info.vocab_size), bools)


def test_a_constraint_with_allowed_tokens_only_has_its_rows_packed():
    digits = DigitsConstraint(digits=[5, 6, 7], vocab_size=40, eos_id=1, mask_id=3)
    canvas = [3, 5, 3, 3]
    out = allocate_token_bitmask(3, 40)
    fill_token_bitmask(digits, canvas, [0, 2, 3], out)
    assert torch.equal(unpack_bitmask(out, 40), digits.allowed_tokens(canvas, [0, 2, 3]))
    narrow = allocate_token_bitmask(3, 6)  # a narrower mask keeps the tokens it can hold
    fill_token_bitmask(digits, canvas, [0, 2, 3], narrow)
    assert torch.equal(unpack_bitmask(narrow, 32), digits.allowed_tokens(canvas, [0, 2, 3])[:, :32])
