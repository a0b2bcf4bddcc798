"""The engine's seams (constraints/protocol.py): every compiled constraint and every canvas state of the package
implements the protocol the engine calls, and a caller's own row-mask constraint is adapted to it."""
from __future__ import annotations

import pytest
import torch

from conftest import build_tiny_tokenizer
from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.constraints.compiler import CompileCache, new_request_state
from dllm_constrain.constraints.protocol import (
    CanvasConstraint,
    Compiled,
    CompiledKind,
    RowMaskAdapter,
    as_canvas_constraint,
    declares,
    fill_token_bitmask,
)
from dllm_constrain.kernels.bitmask import allocate_token_bitmask, unpack_bitmask
from engine_fakes import EOS, MASK, VOCAB, DigitsConstraint


@pytest.fixture(scope="module")
def compiler() -> ConstraintCompiler:
    info = TokenizerInfo.from_tokenizer(build_tiny_tokenizer(), eos_id=1, vocab_size=260)
    return ConstraintCompiler(info, cache=CompileCache(4))


KINDS = {"regex": {"regex": "[0-9]{2,4}"}, "json_schema": {"schema": {"type": "integer"}},
         "grammar": {"grammar": 'start: NUM\nNUM: /[0-9]+/\n'}}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_compiled_kind_and_its_state_implement_the_protocols(compiler, kind) -> None:
    compiled = compiler.compile(**KINDS[kind])
    assert isinstance(compiled, Compiled) and declares(compiled, CompiledKind) and compiled.kind == kind
    state = new_request_state(compiled, 6, None)
    assert isinstance(state, CanvasConstraint)
    assert as_canvas_constraint(state) is state
    assert state.canvas_len == 6
    assert state.shared_state() is new_request_state(compiled, 8, None).shared_state()


def test_a_regular_state_offers_the_prefix_hint_and_a_grammar_state_answers_none(compiler) -> None:
    regular = compiler.compile(regex="ab[0-9]").new_canvas_state(4)
    info = compiler.tokenizer_info
    a, b = info.token_bytes.index(b"a"), info.token_bytes.index(b"b")
    m = info.mask_id
    assert regular.offers_prefix_hint
    assert regular.prefix_hint([m] * 4, 0) == a and regular.prefix_hint([a, m, m, m], 1) == b
    grammar = compiler.compile(grammar='start: "ab" NUM\nNUM: /[0-9]/\n').new_canvas_state(4)
    assert not grammar.offers_prefix_hint
    assert grammar.prefix_hint([m] * 4, 0) is None


def test_a_row_mask_constraint_is_adapted_with_its_rows_packed() -> None:
    user = DigitsConstraint()
    assert not isinstance(user, CanvasConstraint)
    adapted = as_canvas_constraint(user)
    assert isinstance(adapted, RowMaskAdapter) and isinstance(adapted, CanvasConstraint)
    assert adapted.canvas_len is None and not adapted.offers_prefix_hint
    assert adapted.shared_state() is user
    canvas = [MASK, MASK, EOS]
    out = allocate_token_bitmask(2, VOCAB)
    fill_token_bitmask(user, canvas, [0, 1], out)
    assert torch.equal(unpack_bitmask(out, VOCAB), user.allowed_tokens(canvas, [0, 1]))
    assert adapted.prefix_hint(canvas, 0) is None
    assert adapted.is_completable(canvas) and adapted.select_commits(canvas, [(0, 4, 1.0)]) == [(0, 4)]


def test_the_packages_classes_declare_their_protocols(compiler) -> None:
    """The engine's per-call adaptation (`as_canvas_constraint`) and the compile cache tell the package's classes by
    their declared bases, a nominal check, not a structural one."""
    for kind in KINDS:
        compiled = compiler.compile(**KINDS[kind])
        assert declares(compiled, CompiledKind) and declares(compiled.new_canvas_state(6), CanvasConstraint)
    assert not declares(DigitsConstraint(), CanvasConstraint)
