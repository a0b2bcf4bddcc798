"""Code-point sets as UTF-8 byte-range sequences (the classic utf8-ranges split).

Every automaton in the package reads bytes, so a set of code points becomes the alternation of the byte
range sequences whose concatenations are exactly its UTF-8 encodings; tokens that split a multi-byte
character then move an automaton to an intermediate state like any other byte.
"""
from __future__ import annotations

from . import regex_ast as A
from .byte_lru import byte_memo

UTF8_CACHE_BYTES = 4 * 2**20  # memory budget of the code-point set -> UTF-8 byte sequences memo


@byte_memo(UTF8_CACHE_BYTES, name="UTF-8 sequence cache")
def utf8_sequences(ranges: A.Ranges) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Split a code-point set into sequences of byte ranges whose concatenation is exactly its UTF-8."""
    out: list[tuple[tuple[int, int], ...]] = []
    for lo, hi in ranges:
        _split(lo, hi, out)
    return tuple(out)


_BOUNDS = [(0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, 0x10FFFF)]


def _split(lo: int, hi: int, out: list) -> None:
    # split by encoded length first
    for blo, bhi in _BOUNDS:
        a, b = max(lo, blo), min(hi, bhi)
        if a > b:
            continue
        if bhi == 0x7F:
            out.append(((a, b),))
            continue
        n = {0x7FF: 2, 0xFFFF: 3, 0x10FFFF: 4}[bhi]
        _split_n(a, b, n, out)


def _split_n(lo: int, hi: int, n: int, out: list) -> None:
    # split [lo, hi] (same encoded length n) into ranges whose continuation bytes span full 0x80-0xBF
    for i in range(1, n):
        m = (1 << (6 * i)) - 1
        if (lo & ~m) != (hi & ~m):
            if (lo & m) != 0:
                _split_n(lo, lo | m, n, out)
                _split_n((lo | m) + 1, hi, n, out)
                return
            if (hi & m) != m:
                _split_n(lo, (hi & ~m) - 1, n, out)
                _split_n(hi & ~m, hi, n, out)
                return
    a = chr(lo).encode("utf-8") if not 0xD800 <= lo <= 0xDFFF else None
    b = chr(hi).encode("utf-8") if not 0xD800 <= hi <= 0xDFFF else None
    assert a is not None and b is not None and len(a) == len(b) == n
    out.append(tuple((a[k], b[k]) for k in range(n)))


__all__ = ["utf8_sequences"]
