"""Constraint layer: JSON Schema / regex / Lark grammar -> token automata -> per-position canvas masks.

Public API (the engine and generate() use it through protocol.py's seams):
    TokenizerInfo.from_tokenizer(path_or_tokenizer, eos_id=..., mask_id=..., special_ids=...)
    ConstraintCompiler(tokenizer_info).compile(schema= | regex= | grammar=) -> protocol.CompiledKind
    compiled.new_canvas_state(canvas_len) -> CanvasConstraint; compiled.min_tokens()
    compiled.matcher(max_tokens=None) -> LeftToRightMatcher (regular constraints)
    normalize_schema(x) -> NormalizedSchema: a schema read once; compile(schema=) takes it as it is
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
    "NormalizedSchema",
    "normalize_schema",
    "normalize_schema_input",
]


def __getattr__(name):
    if name in ("normalize_schema_input", "normalize_schema", "NormalizedSchema", "SchemaOptions"):
        from . import json_schema

        return getattr(json_schema, name)
    raise AttributeError(name)
