"""Context-free grammar constraints (Lark syntax) for diffusion canvases. See docs/grammars.md.

    from dllm_constrain.constraints.cfg import GrammarCompiler
    cg = GrammarCompiler(tokenizer_info).compile(lark_text)      # -> CompiledGrammar (cached)
    state = cg.new_canvas_state(canvas_len)                       # -> CanvasConstraint
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from ...errors import ConstraintError, InvalidGrammarError
from ..tokenizer_info import TokenizerInfo
from .canvas import GrammarCanvasState
from .frontend import GrammarSpec, load_spec
from .grammar import CompiledGrammar

__all__ = ["CompiledGrammar", "GrammarCanvasState", "GrammarCompiler", "GrammarSpec", "compile_grammar",
           "clear_cache", "load_spec"]

_CACHE: OrderedDict = OrderedDict()
_LOCK = threading.Lock()
_CACHE_MAX = 32


def clear_cache() -> None:
    with _LOCK:
        _CACHE.clear()


class GrammarCompiler:
    """Compiles Lark grammars against one tokenizer; results are cached per (tokenizer, grammar, start)."""

    def __init__(self, tokenizer_info: TokenizerInfo):
        if not isinstance(tokenizer_info, TokenizerInfo):
            tokenizer_info = TokenizerInfo.from_tokenizer(tokenizer_info)
        self.tokenizer_info = tokenizer_info

    def compile(self, grammar: str, start: str = "start", name: str | None = None) -> CompiledGrammar:
        """`grammar` is Lark grammar text (use dllm_constrain.grammars.load_grammar for names and paths)."""
        if not isinstance(grammar, str):
            raise InvalidGrammarError(f"grammar must be a string, got {type(grammar).__name__}")
        key = (self.tokenizer_info.fingerprint, grammar, start)
        with _LOCK:
            hit = _CACHE.get(key)
            if hit is not None:
                _CACHE.move_to_end(key)
        if hit is not None:
            if isinstance(hit, BaseException):
                raise hit
            return hit
        try:
            res = CompiledGrammar(load_spec(grammar, start), self.tokenizer_info, name or "grammar")
        except ConstraintError as e:
            res = e
        with _LOCK:
            _CACHE[key] = res
            while len(_CACHE) > _CACHE_MAX:
                _CACHE.popitem(last=False)
        if isinstance(res, BaseException):
            raise res
        return res


def compile_grammar(grammar: str, tokenizer_info: TokenizerInfo, start: str = "start") -> CompiledGrammar:
    return GrammarCompiler(tokenizer_info).compile(grammar, start)
