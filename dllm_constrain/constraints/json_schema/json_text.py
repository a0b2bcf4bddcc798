"""JSON texts as regular languages: canonical string escapes, literals, every spelling of a number or an
object equal to a value, and the language of keys other than some names."""
from __future__ import annotations

import itertools
import json
import math
from typing import Any

from .. import numeric as N
from .. import regex_ast as A
from ..byte_lru import byte_memo
from .values import is_number

# memory budget of each memo below (per string class, per list of declared names: schemas bring their own); their
# entries are charged from the arguments (about twice the median of the values' measured sizes: 900 bytes per
# range of a class, 520 per character of the names)
ENCODE_CACHE_BYTES = 8 * 2**20

_SPECIAL_STRING_CHARS = tuple(range(0x20)) + (0x22, 0x5C)


def _escape_of(cp: int) -> bytes:
    return json.dumps(chr(cp), ensure_ascii=False)[1:-1].encode()


_ESC = {c: _escape_of(c) for c in _SPECIAL_STRING_CHARS}
_SPECIAL_RANGES = A.norm_ranges((c, c) for c in _SPECIAL_STRING_CHARS)


def json_encode_string_body(node: A.Node, memo: dict | None = None) -> A.Node:
    """Map a language of (decoded) strings to the language of their canonical JSON string bodies."""
    if memo is None:
        memo = {}
    key = id(node)
    hit = memo.get(key)
    if hit is not None:
        return hit[1]
    t = type(node)
    if t is A.Chars or t is A.Bytes:
        res = _encode_set(node.ranges, t is A.Chars)
    elif t is A.Lit:
        data = node.data
        if any(b < 0x20 or b in (0x22, 0x5C) for b in data):
            data = b"".join(_ESC[b] if (b < 0x20 or b in (0x22, 0x5C)) else bytes([b]) for b in data)
        res = A.Lit(data)
    elif t is A.Seq:
        res = A.seq(*[json_encode_string_body(x, memo) for x in node.items])
    elif t is A.Alt:
        res = A.alt(*[json_encode_string_body(x, memo) for x in node.items])
    elif t is A.Rep:
        res = A.rep(json_encode_string_body(node.item, memo), node.lo, node.hi)
    elif t is A.Graph:
        res = A.Graph(node.n, node.start, node.finals,
                      tuple((u, None if lab is None else json_encode_string_body(lab, memo), v)
                            for u, lab, v in node.edges))
    else:
        raise TypeError(node)
    memo[key] = (node, res)
    return res


_ESC_LITS = {c: A.Lit(_ESC[c]) for c in _SPECIAL_STRING_CHARS}
_ESC_ALL = A.alt(*_ESC_LITS.values())


@byte_memo(ENCODE_CACHE_BYTES, name="JSON string class cache",
           size_of_args=lambda rs, is_chars: 2048 + 1024 * len(rs))
def _encode_set(rs: A.Ranges, is_chars: bool) -> A.Node:
    raw = A.ranges_difference(rs, _SPECIAL_RANGES) if is_chars else _byte_diff(rs)
    parts = [A.Chars(raw) if is_chars else A.Bytes(raw)] if raw else []
    inside = [c for c in _SPECIAL_STRING_CHARS if A.ranges_contains(rs, c)]
    if len(inside) == len(_SPECIAL_STRING_CHARS):
        parts.append(_ESC_ALL)
    else:
        parts.extend(_ESC_LITS[c] for c in inside)
    return A.alt(*parts)


def _byte_diff(rs: A.Ranges) -> A.Ranges:
    out = []
    for lo, hi in rs:
        for a, b in ((lo, hi),):
            cur = a
            for c in sorted(_SPECIAL_STRING_CHARS):
                if c < cur or c > b:
                    continue
                if cur <= c - 1:
                    out.append((cur, c - 1))
                cur = c + 1
            if cur <= b:
                out.append((cur, b))
    return tuple(out)


ANY_STRING_BODY = json_encode_string_body(A.star(A.chars(A.ANY_CHAR)))


def json_literal(v: Any) -> A.Node:
    return A.lit(json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False))


def strings_except(names: list[str]) -> A.Node:
    """Char-level language of all strings except the given ones (a complemented trie)."""
    return _strings_except(tuple(names))


@byte_memo(ENCODE_CACHE_BYTES, name="key complement cache",
           size_of_args=lambda names: 1024 + 1024 * sum(len(n) + 1 for n in names))
def _strings_except(names: tuple[str, ...]) -> A.Node:
    root: dict = {}
    END = object()
    for n in names:
        node = root
        for ch in n:
            node = node.setdefault(ch, {})
        node[END] = True
    anychar = A.chars(A.ANY_CHAR)
    nodes: list[dict] = []
    edges: list = []
    FREE = 0
    nodes.append({})  # placeholder for FREE
    edges.append((FREE, anychar, FREE))
    finals = [FREE]

    def visit(node: dict) -> int:
        i = len(nodes)
        nodes.append(node)
        kids = [k for k in node if k is not END]
        if END not in node:
            finals.append(i)
        others = A.ranges_difference(A.ANY_CHAR, A.ranges_of_chars("".join(kids)))
        if others:
            edges.append((i, A.Chars(others), FREE))
        for ch in kids:
            j = visit(node[ch])
            edges.append((i, A.lit(ch), j))
        return i

    start = visit(root)
    return A.Graph(len(nodes), start, tuple(finals), tuple(edges))


def has_other_spellings(v) -> bool:
    """True when v has compact JSON texts other than json.dumps's: a number, or an object of several keys."""
    if is_number(v):
        return True
    if isinstance(v, list):
        return any(has_other_spellings(x) for x in v)
    if isinstance(v, dict):
        return len(v) > 1 or any(has_other_spellings(x) for x in v.values())
    return False


MAX_PERMUTED_KEYS = 4  # objects of enum/const values: members in every order up to this many keys


def value_spellings(v) -> A.Node:
    """Compact JSON texts of values equal to v: numbers in any decimal spelling without exponent (integers
    beyond 2**53 only as written: a validator would read "n.0" as an inexact float), object members in any
    order (up to MAX_PERMUTED_KEYS keys; larger objects in their given order)."""
    if is_number(v):
        if isinstance(v, int) and abs(v) > FLOAT_EXACT:
            return json_literal(v)
        if isinstance(v, float) and abs(v) >= FLOAT_EXACT and math.isfinite(v):
            # an integral double: its exact digits (its shortest repr's digits are another integer, which
            # Python compares exactly) or json.dumps's exponent form (the caller adds)
            return A.lit(str(int(v)))
        return number_spellings(v)
    if isinstance(v, list):
        items = [value_spellings(x) for x in v]
        body = [items[0]] + [A.seq(A.lit(","), x) for x in items[1:]] if items else []
        return A.seq(A.lit("["), *body, A.lit("]"))
    if isinstance(v, dict):
        members = [A.seq(A.lit(json.dumps(k, ensure_ascii=False) + ":"), value_spellings(x)) for k, x in v.items()]
        orders = itertools.permutations(members) if len(members) <= MAX_PERMUTED_KEYS else [members]
        bodies = [A.seq(order[0], *[A.seq(A.lit(","), m) for m in order[1:]]) for order in orders if order]
        return A.seq(A.lit("{"), A.alt(*bodies), A.lit("}")) if bodies else A.lit("{}")
    return json_literal(v)


FLOAT_EXACT = 2 ** 53  # every integer up to this magnitude is a double
ZERO_FRACTION = A.opt(A.seq(A.lit("."), A.plus(A.lit("0"))))


def number_spellings(v) -> A.Node:
    """Every decimal spelling (no exponent) of the number v: canonical digits plus trailing zeros."""
    d = N.to_decimal(v)
    neg = d < 0
    ip, frac = N._split(abs(d))
    zeros = A.star(A.lit("0"))
    body = A.seq(A.lit(str(ip)), A.opt(A.seq(A.lit("."), A.plus(A.lit("0"))))) if not frac else \
        A.seq(A.lit(str(ip)), A.lit("." + frac), zeros)
    if d == 0:
        return A.seq(A.opt(A.lit("-")), body)
    return A.seq(A.lit("-"), body) if neg else body
