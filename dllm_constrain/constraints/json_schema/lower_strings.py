"""Lowering of strings: length bounds, patterns (matched under every regex reading), formats, excluded
values; the decoded language is then mapped to canonical JSON string bodies. Also the language of
property names a `propertyNames` schema allows."""
from __future__ import annotations

import json
from typing import Any

from ...errors import InvalidRegexError, InvalidSchemaError, UnsupportedSchemaError
from .. import dfa_ops
from .. import regex_ast as A
from ..formats import STANDARD_FORMATS, FormatLengthTooLarge, format_node, with_length
from ..regex_parser import parse_regex, search_language
from .context import LoweringContext
from .ir import Conjunction, StringSpec
from .json_text import json_encode_string_body
from .keywords import ANNOTATIONS


def lower_string(ctx: LoweringContext, s: Conjunction, path: str, excluded: list) -> A.Node:
    body = string_body_chars(ctx, s, path, excluded)
    if A.is_nothing(body):
        return A.NOTHING
    return A.seq(A.lit('"'), json_encode_string_body(body, ctx.enc_memo), A.lit('"'))


def string_body_chars(ctx: LoweringContext, s: Any, path: str, excluded: list | None = None) -> A.Node:
    """Char-level language of the decoded string (before JSON encoding), for a Conjunction or a plain
    string schema."""
    spec = string_spec(ctx, s, path)
    if spec is None:
        return A.NOTHING
    mn, mx = spec.min_length, spec.max_length
    langs = [_pattern_language(p, path) for p in spec.patterns]
    fmt_nodes = _format_languages(spec.formats, path)
    if fmt_nodes and (mn > 0 or mx is not None):
        # a format with length bounds: the format DFA times a counter, built directly (cheap), or the
        # format capped to the maximum length when even that is too large (a sound narrowing)
        try:
            fnode = fmt_nodes[0] if len(fmt_nodes) == 1 else \
                dfa_ops.intersect(fmt_nodes, ctx.deadline, ctx.opts.intersection_limit)
            fmt_nodes = [with_length(fnode, mn, mx, ctx.deadline, ctx.opts.intersection_limit)]
            mn, mx = 0, None
        except (dfa_ops.TooLarge, FormatLengthTooLarge):
            raise UnsupportedSchemaError("format", path, "combination with length bounds is too large") from None
    elif langs and (mn > 0 or mx is not None):
        # a pattern with length bounds: the same layered product (the pattern's DFA times a code-point counter,
        # about a microsecond a state) instead of the generic product with a counting language, which costs tens
        # of microseconds a state (a pattern with maxLength 260: 70 ms); exact or not at all (the generic product
        # then decides, exactly or refusing)
        try:
            pnode = langs[0] if len(langs) == 1 else \
                dfa_ops.intersect(langs, ctx.deadline, ctx.opts.intersection_limit)
            langs = [with_length(pnode, mn, mx, ctx.deadline, ctx.opts.intersection_limit, cap=False)]
            mn, mx = 0, None
        except (dfa_ops.TooLarge, FormatLengthTooLarge):
            pass
    langs.extend(fmt_nodes)
    if mn > 0 or mx is not None:
        langs.append(A.rep(A.chars(A.ANY_CHAR), mn, mx))
    if not langs:
        node = A.star(A.chars(A.ANY_CHAR))
    elif len(langs) == 1:
        node = langs[0]
    else:
        try:
            node = dfa_ops.intersect(langs, ctx.deadline, ctx.opts.intersection_limit)
        except dfa_ops.TooLarge:
            raise UnsupportedSchemaError("pattern" if spec.patterns else "format", path,
                                         "combination with length bounds is too large") from None
    negs = [A.lit(x) for x in excluded or ()]
    if isinstance(s, Conjunction):
        negs.extend(_excluded_pattern_language(p, path) for p in s.excluded_patterns)
    if negs:
        node = ctx.difference(node, negs, "not", path)
    return node


def string_spec(ctx: LoweringContext, s: Any, path: str) -> StringSpec | None:
    """What a Conjunction or a plain string schema says of strings; None when no length fits."""
    mn = s.get("minLength", 0)
    mx = s.get("maxLength")
    for k, v in (("minLength", mn), ("maxLength", mx)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            if isinstance(v, float) and v.is_integer() and v >= 0:
                continue
            raise InvalidSchemaError(f"{k} at {path} must be a non-negative integer")
    mn = int(mn)
    if mx is not None:
        mx = int(mx)
        if mx < mn:
            ctx.unsat.append(f"minLength {mn} > maxLength {mx} at {path}")
            return None
        mx = min(mx, max(ctx.opts.max_string_unroll, mn))
    if isinstance(s, Conjunction):
        patterns, formats = s.patterns, ((s["format"],) if "format" in s else ()) + s.extra_formats
    else:
        patterns, formats = ((s["pattern"],) if "pattern" in s else ()), ((s["format"],) if "format" in s else ())
    return StringSpec(mn, mx, tuple(patterns), formats)


def _pattern_language(p: Any, path: str) -> A.Node:
    if not isinstance(p, str):
        raise InvalidSchemaError(f"pattern at {path} must be a string")
    try:
        # matched under every reading (Python's `re` and ECMA-262)
        return search_language(parse_regex(p, "all"))
    except InvalidRegexError as e:
        raise UnsupportedSchemaError("pattern", path, str(e)) from None


def _excluded_pattern_language(p: str, path: str) -> A.Node:
    """The strings a pattern may match under some reading: what `not {pattern}` removes."""
    try:
        return search_language(parse_regex(p, "any"))
    except InvalidRegexError as e:
        raise UnsupportedSchemaError("not", path, f"negation of pattern: {e}") from None


def _format_languages(fmts: tuple, path: str) -> list[A.Node]:
    """The languages of the standard formats among fmts (other format names are annotations)."""
    out: list[A.Node] = []
    for f in fmts:
        if not isinstance(f, str):
            raise InvalidSchemaError(f"format at {path} must be a string")
        fnode = format_node(f)
        if fnode is None:
            if f in STANDARD_FORMATS:
                raise UnsupportedSchemaError("format", path, f"format {f!r} is not supported")
            continue  # not a standard format: an annotation
        out.append(fnode)
    return out


def property_names_language(ctx: LoweringContext, pn: Any, path: str) -> A.Node:
    """The JSON string bodies of the names a `propertyNames` schema allows."""
    with ctx.refs.dereferenced(pn, path) as x:
        if x is False:
            return A.NOTHING
        if not isinstance(x, dict):
            raise UnsupportedSchemaError("propertyNames", path)
        kws = {k for k in x if k not in ANNOTATIONS}
        if "enum" in kws or "const" in kws:
            vals = x.get("enum", [x.get("const")]) if "enum" in x else [x["const"]]
            strs = [v for v in vals if isinstance(v, str) and ctx.validation.is_valid(v, x)]
            return A.alt_literals([json.dumps(v, ensure_ascii=False)[1:-1] for v in strs]) if strs else A.NOTHING
        if kws - {"type", "pattern", "minLength", "maxLength", "format"}:
            raise UnsupportedSchemaError("propertyNames", path, f"keywords {sorted(kws)}")
        if "type" in x and x["type"] != "string":
            return A.NOTHING
        return json_encode_string_body(string_body_chars(ctx, x, path + "/propertyNames"))
