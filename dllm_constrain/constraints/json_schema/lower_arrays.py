"""Lowering of arrays: prefixItems / items as an automaton over item positions, `contains` with its counts
as a product with a counter, and `uniqueItems` (exact over small finite item domains, narrowed otherwise)."""
from __future__ import annotations

import re
from typing import Any

from ...errors import InvalidSchemaError, UnsupportedSchemaError
from .. import regex_ast as A
from ..object_members import object_members
from .context import LoweringContext
from .ir import ArraySpec, Conjunction
from .json_text import json_literal
from .keywords import ANNOTATIONS
from .values import is_number, json_eq

_UNIQUE_DOMAIN_MAX = 16  # finite item domains up to this size: distinct values in any order


def lower_array(ctx: LoweringContext, s: Conjunction, path: str, excluded: list) -> A.Node:
    if excluded:
        raise UnsupportedSchemaError("not", path, "excluding array values")
    spec = array_spec(ctx, s, path)
    if spec is None:
        return A.NOTHING
    prefix, rest, mn, mx = list(spec.prefix), spec.rest, spec.min_items, spec.max_items
    if spec.unique and spec.contains is not None:
        raise UnsupportedSchemaError("contains", path, "together with uniqueItems")
    if spec.unique:
        if ctx.opts.unique_items == "error":
            raise UnsupportedSchemaError("uniqueItems", path)
        res = _unique_array(ctx, prefix, rest, mn, mx, path)
        if res is not None:
            return res
    if mx is not None:
        mx = min(mx, max(ctx.opts.max_items_unroll, mn, len(prefix) if mx >= len(prefix) else mx))
    if spec.contains is None:
        return _positional_array(ctx, prefix, rest, mn, mx, path)
    return _counting_array(ctx, prefix, rest, mn, mx, spec.contains, path)


def array_spec(ctx: LoweringContext, s: Conjunction, path: str) -> ArraySpec | None:
    """What a Conjunction says of arrays; None when no length (or contains count) fits."""
    prefix = s.get("prefixItems", [])
    if not isinstance(prefix, list):
        raise InvalidSchemaError(f"prefixItems at {path} must be an array")
    rest = s.get("items", True)
    if "items" not in s and s.get("unevaluatedItems", True) not in (True, {}):
        # without applicators or `contains`, the items no keyword evaluates are those after the prefix
        if len(s.conjuncts) > 1 or "contains" in s:
            raise UnsupportedSchemaError("unevaluatedItems", path, "combined with applicators or contains")
        rest = s["unevaluatedItems"]
    mn = int(s.get("minItems", 0) or 0)
    mx = s.get("maxItems")
    if mx is not None:
        mx = int(mx)
        if mx < mn:
            ctx.unsat.append(f"minItems {mn} > maxItems {mx} at {path}")
            return None
    unique = bool(s.get("uniqueItems", False))
    contains = _contains_counter(ctx, s, path)
    if contains is not None and contains[2] is not None and contains[2] < contains[1]:
        ctx.unsat.append(f"minContains > maxContains at {path}")
        return None
    return ArraySpec(tuple(prefix), rest, mn, mx, unique, contains)


def _bracketed(ctx: LoweringContext, body: A.Node) -> A.Node:
    return A.seq(A.lit("["), ctx.ws, body, ctx.ws, A.lit("]"))


def _comma(ctx: LoweringContext) -> A.Node:
    return A.seq(ctx.ws, A.lit(","), ctx.ws)


def _positional_array(ctx: LoweringContext, prefix: list, rest: Any, mn: int, mx: int | None, path: str) -> A.Node:
    """States: the index of the next item (the last one loops when the length is unbounded)."""
    K = mx if mx is not None else max(len(prefix), mn, 1)
    comma = _comma(ctx)
    item_nodes = [ctx.compile(p, f"{path}/prefixItems/{i}") for i, p in enumerate(prefix)]
    rest_node = ctx.compile(rest, f"{path}/items")
    edges = []
    for k in range(K):
        it = item_nodes[k] if k < len(item_nodes) else rest_node
        if A.is_nothing(it):
            continue
        edges.append((k, it if k == 0 else A.seq(comma, it), k + 1))
    if mx is None and not A.is_nothing(rest_node) and K >= len(item_nodes):
        edges.append((K, A.seq(comma, rest_node), K))
    finals = tuple(k for k in range(mn, K + 1))
    return _bracketed(ctx, A.Graph(K + 1, 0, finals, tuple(edges)))


def _counting_array(ctx: LoweringContext, prefix: list, rest: Any, mn: int, mx: int | None,
                    contains: tuple[Any, int, int | None], path: str) -> A.Node:
    """States: (index k, count c of items matching `contains`, capped at C)."""
    cond, lo_c, hi_c = contains
    K = mx if mx is not None else max(len(prefix), mn, 1)
    C = lo_c if hi_c is None else hi_c
    comma = _comma(ctx)
    langs = [_item_langs(ctx, p, cond, hi_c, f"{path}/prefixItems/{i}", path) for i, p in enumerate(prefix)]
    rest_langs = _item_langs(ctx, rest, cond, hi_c, f"{path}/items", path)

    def nid(k: int, c: int) -> int:
        return k * (C + 1) + c

    edges = []
    for k in range(K + 1):
        if k == K and (mx is not None or K < len(langs)):
            break
        hit, miss = langs[k] if k < len(langs) else rest_langs
        k2 = min(k + 1, K)
        for c in range(C + 1):
            for lab, c2 in ((hit, c + 1 if hi_c is not None else min(c + 1, C)), (miss, c)):
                if c2 <= C and not A.is_nothing(lab):
                    edges.append((nid(k, c), lab if k == 0 else A.seq(comma, lab), nid(k2, c2)))
    finals = tuple(nid(k, c) for k in range(mn, K + 1) for c in range(lo_c, C + 1))
    return _bracketed(ctx, A.Graph((K + 1) * (C + 1), 0, finals, tuple(edges)))


def _item_langs(ctx: LoweringContext, sch: Any, cond: Any, hi_c: int | None, where: str,
                path: str) -> tuple[A.Node, A.Node]:
    """(items matching `contains`, items that do not count). Without maxContains an item may match and
    not be counted (the count is a lower bound), so the second is every item."""
    hit = ctx.compile({"allOf": [sch, cond]}, where)
    if hi_c is None:
        return hit, ctx.compile(sch, where)
    try:
        return hit, ctx.compile({"allOf": [sch, {"not": cond}]}, where)
    except UnsupportedSchemaError as e:
        raise UnsupportedSchemaError("maxContains", path, f"needs the negation of `contains`: {e}") from None


def _contains_counter(ctx: LoweringContext, s: Conjunction, path: str) -> tuple[Any, int, int | None] | None:
    """(contains schema, minContains, maxContains or None) when `contains` constrains the array."""
    if "contains" not in s:
        return None
    lo = s.get("minContains", 1)
    hi = s.get("maxContains")
    for k, v in (("minContains", lo), ("maxContains", hi)):
        if v is not None and (isinstance(v, bool) or not is_number(v) or v < 0 or int(v) != v):
            raise InvalidSchemaError(f"{k} at {path} must be a non-negative integer")
    lo, hi = int(lo), None if hi is None else int(hi)
    if lo == 0 and hi is None:
        return None  # always satisfied
    if max(lo, hi or 0) > ctx.opts.max_items_unroll:
        raise UnsupportedSchemaError("minContains" if hi is None else "maxContains", path,
                                     f"counts above max_items_unroll ({ctx.opts.max_items_unroll})")
    return s["contains"], lo, hi


def _unique_array(ctx: LoweringContext, prefix: list, rest: Any, mn: int, mx: int | None,
                  path: str) -> A.Node | None:
    comma = _comma(ctx)
    if not prefix:
        dom = _finite_domain(ctx, rest, path)
        if dom is not None and len(dom) <= _UNIQUE_DOMAIN_MAX:
            # distinct values in any order: the domain's values as object-member-like entries
            return _bracketed(ctx, object_members([(v, False) for v in dom], [], comma, mn, mx, path))
        strings = _distinct_first_char_strings(ctx, rest, path)
        if strings is not None and mn <= len(strings):
            # strings that start with different characters are different: each first-character class
            # at most once, in any order (a sound narrowing of uniqueItems)
            return _bracketed(ctx, object_members([(v, False) for v in strings], [], comma, mn, mx, path))
    # otherwise: at most one item (every such array is unique)
    if mn > 1:
        raise UnsupportedSchemaError("uniqueItems", path, "with minItems > 1 over a non-finite item domain")
    first = ctx.compile(prefix[0] if prefix else rest, f"{path}/items")
    lim = 1 if mx is None else min(1, mx)
    empty = A.seq(A.lit("["), ctx.ws, A.lit("]"))
    if lim == 0 or A.is_nothing(first):
        return empty if mn == 0 else A.NOTHING
    one = _bracketed(ctx, first)
    if mn == 0:
        return A.alt(empty, one)
    return one


def _distinct_first_char_strings(ctx: LoweringContext, sch: Any, path: str) -> list[A.Node] | None:
    """For a string-only item schema: its strings split by first character (each printable ASCII one,
    every other character, the empty string), the classes that have strings; None for other items."""
    with ctx.refs.dereferenced(sch, path) as x:
        if not (isinstance(x, dict) and x.get("type") == "string"
                and set(x) - ANNOTATIONS <= {"type", "minLength", "maxLength", "pattern", "format"}):
            return None
    classes = [re.escape(chr(c)) for c in range(0x20, 0x7F)] + ["[^\\x20-\\x7e]"]
    out = [ctx.compile({"allOf": [sch, {"pattern": f"^{c}"}]}, f"{path}/items") for c in classes]
    out.append(ctx.compile({"allOf": [sch, {"maxLength": 0}]}, f"{path}/items"))
    return [n for n in out if not A.is_nothing(n)]


def _finite_domain(ctx: LoweringContext, sch: Any, path: str) -> list[A.Node] | None:
    """The literals of an item schema with finitely many values (enum/const, boolean); None otherwise."""
    with ctx.refs.dereferenced(sch, path) as x:
        if isinstance(x, dict):
            if "enum" in x or "const" in x:
                vals = x.get("enum", [x.get("const")]) if "enum" in x else [x["const"]]
                keep = [v for v in vals if ctx.validation.is_valid(v, x)]
                out = []
                seen: list = []
                for v in keep:
                    if any(json_eq(v, w) for w in seen):
                        continue
                    seen.append(v)
                    out.append(json_literal(v))
                return out
            if x.get("type") == "boolean" and set(x) - ANNOTATIONS <= {"type"}:
                return [A.lit("false"), A.lit("true")]
        return None
