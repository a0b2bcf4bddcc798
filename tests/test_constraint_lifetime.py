"""What a compiled constraint costs the garbage collector: it and the canvas states made from it hold no reference
cycle, so once dropped (evicted from the compile cache, its requests ended) they are freed at once by reference
counting, not by a collector pass inside some later request's step; and the objects a compilation makes are collected
by the compiling thread before it returns."""
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


def test_a_compilation_collects_its_young_objects_on_the_compiling_thread() -> None:
    """Compilation runs with the cyclic collector off; the young generations it fills are collected before it returns
    (on the thread that compiled), not by whatever allocation, on whatever thread, next crosses the threshold."""
    info = TokenizerInfo.from_tokenizer(build_tiny_tokenizer(), eos_id=1, vocab_size=260)
    compiler = ConstraintCompiler(info, cache=CompileCache(4))
    assert gc.isenabled()
    for k in range(3):
        schema = dict(SCHEMA, properties={**SCHEMA["properties"], f"extra{k}": {"type": "integer"}})
        compiler.compile(schema=schema)
        assert gc.get_count()[1] == 0  # the young generations were just collected
