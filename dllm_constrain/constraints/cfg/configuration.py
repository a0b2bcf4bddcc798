"""The exact configuration of a grammar's parse of a text prefix, shared by the compiled grammar (which
steps configurations) and the canvas state (which caches them per position).

A configuration is a tuple (stack node, lexer state, last type): the interned LALR stack (parser.py), the
pending lexeme's lexer state (lexer.py) and the last non-ignored terminal type (for the approximation,
approx.py). Tuples, not a dataclass: configurations are hashed and compared by the million in memo tables.
"""
from __future__ import annotations

Config = tuple  # (stack node, lexer state, last type)

__all__ = ["Config"]
