"""Context-free grammar constraints (Lark syntax) for diffusion canvases. See docs/grammars.md.

    from dllm_constrain.constraints.cfg import GrammarCompiler
    cg = GrammarCompiler(tokenizer_info).compile(lark_text)      # -> CompiledGrammar (cached)
    state = cg.new_canvas_state(canvas_len)                       # -> CanvasConstraint

`GrammarCompiler` is the grammar-only door onto `ConstraintCompiler`: its results live in the process's one
compile cache (`compiler.COMPILE_CACHE`), shared with `ConstraintCompiler.compile(grammar=...)`, so a grammar
compiled through either is compiled once; `clear_cache` empties that cache.
"""
from __future__ import annotations

from ...errors import InvalidGrammarError
from ..compiler import ConstraintCompiler, clear_cache
from ..tokenizer_info import TokenizerInfo
from .canvas import GrammarCanvasState
from .frontend import GrammarSpec, load_spec
from .grammar import CompiledGrammar

__all__ = ["CompiledGrammar", "GrammarCanvasState", "GrammarCompiler", "GrammarSpec", "compile_grammar",
           "clear_cache", "load_spec"]


class GrammarCompiler:
    """Compiles Lark grammars against one tokenizer through `ConstraintCompiler`'s grammar path; results (and
    refusals) are cached per (tokenizer, grammar, start) in the process's one compile cache."""

    def __init__(self, tokenizer_info: TokenizerInfo):
        self._compiler = ConstraintCompiler(tokenizer_info)
        self.tokenizer_info = self._compiler.tokenizer_info

    def compile(self, grammar: str, start: str = "start", name: str | None = None) -> CompiledGrammar:
        """`grammar` is Lark grammar text (use dllm_constrain.grammars.load_grammar for names and paths); `name`
        labels the compiled grammar (its repr) when this call is the one that compiles it."""
        if not isinstance(grammar, str):  # None too: a grammar error, not compile()'s "exactly one of" refusal
            raise InvalidGrammarError(f"grammar must be a string, got {type(grammar).__name__}")
        return self._compiler.compile_grammar(grammar, start, name=name)  # type: ignore[return-value]


def compile_grammar(grammar: str, tokenizer_info: TokenizerInfo, start: str = "start") -> CompiledGrammar:
    """`GrammarCompiler(tokenizer_info).compile(grammar, start)`."""
    return GrammarCompiler(tokenizer_info).compile(grammar, start)
