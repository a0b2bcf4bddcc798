"""A compiled constraint and the canvas states made from it hold no reference cycle: once dropped (evicted from the
compile cache, its requests ended) they are freed at once by reference counting, not left for the cyclic collector,
whose pass would free them inside some later request's step."""
from __future__ import annotations

import gc
import weakref

from conftest import build_tiny_tokenizer
from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.constraints.compiler import CompileCache

SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
                   "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
    "required": ["id"],
}


def test_a_dropped_compiled_constraint_and_its_states_are_freed_without_the_cyclic_collector() -> None:
    info = TokenizerInfo.from_tokenizer(build_tiny_tokenizer(), eos_id=1, vocab_size=260)
    cache = CompileCache(4)
    compiled = ConstraintCompiler(info, cache=cache).compile(schema=SCHEMA)
    state = compiled.new_canvas_state(24)
    canvas = [compiled.mask_id] * 24
    state.allowed_tokens(canvas, list(range(8)))  # the automata grow: token transitions, DFA rows
    alive = [weakref.ref(compiled), weakref.ref(compiled.dfa.terms), weakref.ref(state)]
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        del compiled, state
        cache.clear()
        assert [r() is None for r in alive] == [True, True, True]
    finally:
        if was_enabled:
            gc.enable()
