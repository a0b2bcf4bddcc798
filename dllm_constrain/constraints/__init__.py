"""Constraint layer: JSON Schema / regex -> byte DFA -> token automaton -> exact per-position canvas masks.

Public API (used by the engine / generate()):
    TokenizerInfo.from_tokenizer(path_or_tokenizer, eos_id=..., mask_id=..., special_ids=...)
    ConstraintCompiler(tokenizer_info).compile_json_schema(schema, whitespace="compact") -> CompiledConstraint
    ConstraintCompiler(tokenizer_info).compile_regex(pattern) -> CompiledConstraint
    CompiledConstraint.new_canvas_state(canvas_len) -> CanvasConstraint   (raises ConstraintTooLongError)
    CompiledConstraint.min_tokens(), CompiledConstraint.vocab_size
    normalize_schema_input(x) -> dict
See docs/constraints.md.
"""
from .protocol import CanvasConstraint
from .tokenizer_info import TokenizerInfo
from .compiler import CompiledConstraint, ConstraintCompiler, GrammarCompiler, clear_cache
from .matcher import LeftToRightMatcher
from .canvas import CanvasState

__all__ = [
    "CanvasConstraint",
    "CanvasState",
    "CompiledConstraint",
    "ConstraintCompiler",
    "GrammarCompiler",
    "LeftToRightMatcher",
    "TokenizerInfo",
    "clear_cache",
    "normalize_schema_input",
]


def __getattr__(name):
    if name in ("normalize_schema_input", "SchemaOptions"):
        from . import json_schema

        return getattr(json_schema, name)
    raise AttributeError(name)
