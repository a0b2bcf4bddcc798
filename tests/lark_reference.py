"""Lark as the reference reader of the grammar tests: the grammars are documented against
`lark.Lark(text, parser="lalr", lexer="basic")`, so a text is in the language exactly when that parser parses it."""
from __future__ import annotations

import lark


def lark_accepts(lk: lark.Lark, text: str) -> bool:
    """Lark parses the text (a LarkError of any kind means it does not)."""
    try:
        lk.parse(text)
        return True
    except lark.exceptions.LarkError:
        return False
