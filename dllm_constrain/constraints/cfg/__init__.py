"""Context-free grammar constraints (Lark syntax) for diffusion canvases. See docs/grammars.md.

    from dllm_constrain.constraints.compiler import GrammarCompiler
    cg = GrammarCompiler(tokenizer_info).compile(lark_text)      # -> CompiledGrammar (cached)
    state = cg.new_canvas_state(canvas_len)                       # -> CanvasConstraint

This package is the grammar machinery (frontend, lexer, parser, canvas states); compiling and caching are the
compiler's (`compiler.ConstraintCompiler.compile(grammar=...)`, `compiler.GrammarCompiler`), one layer above.
"""
from __future__ import annotations

from .canvas import GrammarCanvasState
from .frontend import GrammarSpec, load_spec
from .grammar import CompiledGrammar

__all__ = ["CompiledGrammar", "GrammarCanvasState", "GrammarSpec", "load_spec"]
