"""Lowering of objects: declared properties (any order, each at most once), required names and their
dependencies, patternProperties and additional properties as classes of keys, propertyNames, property
counts; and free-form JSON values (schema `true`, undeclared properties)."""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from ...errors import InvalidRegexError, InvalidSchemaError, UnsupportedSchemaError
from .. import dfa_ops
from .. import numeric as N
from .. import regex_ast as A
from ..object_members import object_members
from ..regex_parser import parse_regex, search_language
from .context import LoweringContext
from .ir import Conjunction, ObjectSpec
from .json_text import ANY_STRING_BODY, json_encode_string_body, strings_except
from .lower_strings import property_names_language
from .patterns import pattern_matches

_MAX_CLASSIFIED_PATTERNS = 4  # patternProperties beyond this: no undeclared keys are generated


def lower_object(ctx: LoweringContext, s: Conjunction, path: str, excluded: list) -> A.Node:
    """An object schema. The strict narrowings (`additional_properties="forbid"` where the schema is
    silent, `additional_names="nonempty"`) never make a satisfiable object empty: required names that no
    `properties`/`patternProperties` declares keep free-form values, and an object the narrowings leave
    empty is compiled again with undeclared properties allowed (`spec=1`), then also named "" (`spec=2`),
    as the specification allows."""
    if excluded:
        raise UnsupportedSchemaError("not", path, "excluding object values")
    node = _object_members(ctx, s, path, 0)
    if A.is_nothing(node) and ctx.opts.additional_properties == "forbid" and "additionalProperties" not in s:
        node = _object_members(ctx, s, path, 1)
    if A.is_nothing(node) and ctx.opts.additional_names == "nonempty":
        node = _object_members(ctx, s, path, 2)
    return node


def _object_members(ctx: LoweringContext, s: Conjunction, path: str, spec: int) -> A.Node:
    o = object_spec(ctx, s, path, spec)
    if o is None:
        return A.NOTHING
    return _members_of(ctx, o, path, spec, split_done=False)


def object_spec(ctx: LoweringContext, s: Conjunction, path: str, spec: int) -> ObjectSpec | None:
    """What a Conjunction says of objects (undeclared properties as the narrowing level `spec` reads
    them); None when no member count fits."""
    props = s.get("properties", {}) or {}
    if not isinstance(props, dict):
        raise InvalidSchemaError(f"properties at {path} must be an object")
    required = s.get("required", []) or []
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise InvalidSchemaError(f"required at {path} must be an array of strings")
    pats = s.get("patternProperties", {}) or {}
    if not isinstance(pats, dict):
        raise InvalidSchemaError(f"patternProperties at {path} must be an object")
    addl, undeclared_value = _additional_schemas(ctx, s, path, spec)
    mnp = int(s.get("minProperties", 0) or 0)
    mxp = s.get("maxProperties")
    mxp = None if mxp is None else int(mxp)
    if mxp is not None and mnp > mxp:
        ctx.unsat.append(f"minProperties {mnp} > maxProperties {mxp} at {path}")
        return None
    return ObjectSpec(props, tuple(required), pats, addl, undeclared_value, s.get("propertyNames"), mnp, mxp,
                      _dependencies(s, path))


def _members_of(ctx: LoweringContext, o: ObjectSpec, path: str, spec: int, split_done: bool) -> A.Node:
    deps = o.dependencies
    req_set = required_closure(list(o.required), deps)
    # dependencies (a present => b present). A name whose dependencies are not all required is "free":
    # with few free names the object is the exact union, over which free names are present, of objects
    # with those names (and their dependencies) required and the other free names absent; with more,
    # the free names are never generated (a sound narrowing)
    free = sorted(a for a, bs in deps.items() if a not in req_set and any(b not in req_set for b in bs))
    if free and not split_done and len(free) <= ctx.opts.max_dependency_branches:
        outs = []
        for mask in range(1 << len(free)):
            present = tuple(a for i, a in enumerate(free) if mask >> i & 1)
            outs.append(_members_of(ctx, replace(o, required=o.required + present), path, spec, split_done=True))
        return A.alt(*outs)
    # declared properties (order: properties, then required-only names); forbidden names are listed so
    # that no additional key can spell them
    props = o.properties
    names = list(props.keys()) + [r for r in o.required if r not in props]
    for r in sorted(req_set) + free:
        if r not in names:
            names.append(r)
    entries = _declared_entries(ctx, names, o, req_set, set(free), path)
    if entries is None:
        return A.NOTHING
    extra = _extra_entries(ctx, names, o.pattern_properties, o.additional, o.property_names, path,
                           nonempty_names=spec < 2)
    # declared properties in any order, each at most once (a lazily expanded subset automaton)
    ws = ctx.ws
    members = object_members(entries, extra, A.seq(ws, A.lit(","), ws), o.min_properties, o.max_properties, path,
                             ordered=ctx.opts.property_order == "declared",
                             interleave_max=ctx.opts.interleave_additional_max)
    if A.is_nothing(members):
        return A.NOTHING
    return A.seq(A.lit("{"), ws, members, ws, A.lit("}"))


def _additional_schemas(ctx: LoweringContext, s: Conjunction, path: str, spec: int) -> tuple[Any, Any]:
    """(schema of undeclared properties, schema of required names nothing declares)."""
    if "additionalProperties" in s:
        addl = s["additionalProperties"]
    elif "unevaluatedProperties" in s and s["unevaluatedProperties"] not in (True, {}):
        addl = s["unevaluatedProperties"]
        if len(s.conjuncts) > 1 and not s.applicators_evaluate:
            raise UnsupportedSchemaError("unevaluatedProperties", path, "combined with applicators")
    else:
        addl = True if ctx.opts.additional_properties == "allow" or spec else False
    # under the narrowing, a required name nothing declares still takes any value (as in the spec)
    undeclared_value = True if addl is False and "additionalProperties" not in s \
        and "unevaluatedProperties" not in s else addl
    if addl == {} or addl is None:
        addl = True
    return addl, undeclared_value


def _dependencies(s: Conjunction, path: str) -> dict[str, list]:
    """dependentRequired and the array form of draft-04 `dependencies`: name -> names it requires."""
    deps = {}
    if "dependentRequired" in s:
        deps.update(s["dependentRequired"])
    if "dependencies" in s:
        for k, v in s["dependencies"].items():
            if isinstance(v, list):
                deps[k] = v
            else:  # (schema dependencies are lowered to applicators before)
                raise UnsupportedSchemaError("dependencies", path, "schema dependencies")
    for a, bs in deps.items():
        if not isinstance(bs, list) or not all(isinstance(b, str) for b in bs):
            raise InvalidSchemaError(f"dependentRequired at {path} must map names to arrays of names")
    return deps


def _declared_entries(ctx: LoweringContext, names: list[str], o: ObjectSpec, req_set: set[str],
                      forbidden: set[str], path: str) -> list | None:
    """(member language, required) of each declared name; None when a required one has no value."""
    ws = ctx.ws
    props, pats, pnames = o.properties, o.pattern_properties, o.property_names
    entries = []
    for name in names:
        ctx.check_deadline()
        sub = props.get(name, None)
        conj = []
        if sub is not None:
            conj.append(sub)
        # a name matched by a pattern under some reading (Python `re`, ECMA-262) carries its schema;
        # one that some reading leaves unmatched also carries additionalProperties
        matched = [p for p in pats if pattern_matches(p, name, path, "any")]
        for p in matched:
            conj.append(pats[p])
        is_req = name in req_set
        if sub is None and not any(pattern_matches(p, name, path, "all") for p in matched):
            conj.append(o.undeclared_value if is_req else o.additional)
        if name in forbidden and not is_req:
            continue
        if pnames is not None and not ctx.validation.is_valid(name, pnames):
            if is_req:
                return None
            continue
        vnode = ctx.compile(conj[0] if len(conj) == 1 else {"allOf": conj}, f"{path}/properties/{name}")
        if A.is_nothing(vnode):
            if is_req:
                return None
            continue
        key = A.lit(json.dumps(name, ensure_ascii=False))
        entries.append((A.seq(key, ws, A.lit(":"), ws, vnode), is_req))
    return entries


def _member(ctx: LoweringContext, key_body: A.Node, vnode: A.Node) -> A.Node:
    return A.seq(A.lit('"'), key_body, A.lit('"'), ctx.ws, A.lit(":"), ctx.ws, vnode)


def _extra_entries(ctx: LoweringContext, names: list[str], pats: dict, addl: Any, pnames: Any, path: str,
                   nonempty_names: bool = True) -> list[A.Node]:
    """Key/value alternatives for properties beyond the declared ones (one per key class)."""
    if ctx.opts.additional_names == "nonempty" and nonempty_names:
        names = names + [""]  # (a sound narrowing: excluded like a declared name)
    declared = A.alt_literals([json.dumps(n, ensure_ascii=False)[1:-1] for n in names]) if names else A.NOTHING
    if not pats and pname_lang_is_trivial(pnames):
        # the common case: any key except the declared names (a trie complement, no product needed)
        if addl is False:
            return []
        vnode = ctx.compile(addl, f"{path}/additionalProperties")
        if A.is_nothing(vnode):
            return []
        return [_member(ctx, json_encode_string_body(strings_except(names), ctx.enc_memo), vnode)]
    pname_lang = None
    if pnames is not None and pnames is not True:
        pname_lang = property_names_language(ctx, pnames, path)
    classes = _key_classes(pats, addl, declared, path)
    if classes is None:
        return []
    out = []
    for pos, negs, vs, needed in classes:
        if pname_lang is not None:
            pos = pos + [pname_lang]
        key_body = _key_language(ctx, pos, [n for n in negs if not A.is_nothing(n)], needed, bool(pats), path)
        if key_body is None or A.is_nothing(key_body):
            continue
        vnode = ctx.compile(vs, f"{path}/additionalProperties")
        if A.is_nothing(vnode):
            continue
        out.append(_member(ctx, key_body, vnode))
    return out


def _key_classes(pats: dict, addl: Any, declared: A.Node, path: str) -> list | None:
    """(key body languages, languages it must avoid, value schema, required to fit) per class of undeclared
    keys; None when there are too many patterns to classify keys against."""
    # a key is classified only where every reading agrees: "matches P" is taken in the narrowest
    # reading (matched by Python's `re` and ECMA-262 alike), "does not match P" as the complement of
    # the widest (Unicode \d \w, `$` before a final newline, ...)
    pat_langs = []  # (narrowest, widest)
    for p in pats:
        try:
            pat_langs.append(tuple(json_encode_string_body(search_language(parse_regex(p, r)))
                                   for r in ("all", "any")))
        except InvalidRegexError as e:
            raise UnsupportedSchemaError("patternProperties", path, str(e)) from None
    if len(pat_langs) > _MAX_CLASSIFIED_PATTERNS:
        # classifying keys against many patterns needs large product automata: generate no
        # undeclared keys at all (a sound narrowing: the declared properties carry their schemas)
        return None
    classes = []
    # a key matching exactly the patterns of a subset S: the value satisfies every schema of S
    pat_list = list(pats)
    for mask in range(1, 1 << len(pat_list)):
        inside = [i for i in range(len(pat_list)) if mask >> i & 1]
        others = [pat_langs[j][1] for j in range(len(pat_list)) if not mask >> j & 1]
        vs = pats[pat_list[inside[0]]] if len(inside) == 1 else {"allOf": [pats[pat_list[i]] for i in inside]}
        classes.append(([pat_langs[i][0] for i in inside], others + [declared], vs, len(inside) == 1))
    if addl is not False:
        classes.append(([ANY_STRING_BODY], [w for _, w in pat_langs] + [declared], addl, True))
    return classes


def _key_language(ctx: LoweringContext, pos: list, negs: list, needed: bool, has_patterns: bool,
                  path: str) -> A.Node | None:
    """Keys in every language of pos and in none of negs; None for an optional class too large to build."""
    try:
        if negs or len(pos) > 1:
            limit = ctx.opts.intersection_limit if needed else ctx.opts.intersection_limit // 10
            return dfa_ops.product(pos + negs, [False] * len(pos) + [True] * len(negs), ctx.deadline, limit)
        return pos[0]
    except dfa_ops.TooLarge:
        if not needed:
            return None  # keys matching several patterns are not generated (a sound narrowing)
        raise UnsupportedSchemaError("patternProperties" if has_patterns else "additionalProperties", path,
                                     "key language too large") from None


def required_closure(required: list[str], deps: dict[str, list[str]]) -> set[str]:
    """The required names plus, transitively, the names they depend on."""
    out = set(required)
    todo = list(out)
    while todo:
        for b in deps.get(todo.pop(), []):
            if b not in out:
                out.add(b)
                todo.append(b)
    return out


def pname_lang_is_trivial(pnames: Any) -> bool:
    return pnames is None or pnames is True or pnames == {}


# ------------------------------------------------------------------------------------------ free-form values
def any_value(ws: A.Node, depth: int, cache: dict[int, A.Node]) -> A.Node:
    """Every JSON value nested at most `depth` levels (memoised in `cache` per depth)."""
    hit = cache.get(depth)
    if hit is not None:
        return hit
    comma = A.seq(ws, A.lit(","), ws)
    string = A.seq(A.lit('"'), ANY_STRING_BODY, A.lit('"'))
    scalars = [A.lit("null"), A.lit("true"), A.lit("false"), N.JSON_NUMBER, string]
    if depth <= 0:
        node = A.alt(*scalars, A.seq(A.lit("["), ws, A.lit("]")), A.seq(A.lit("{"), ws, A.lit("}")))
    else:
        inner = any_value(ws, depth - 1, cache)
        arr = A.seq(A.lit("["), ws, A.opt(A.seq(inner, A.star(A.seq(comma, inner)))), ws, A.lit("]"))
        kv = A.seq(string, ws, A.lit(":"), ws, inner)
        obj = A.seq(A.lit("{"), ws, A.opt(A.seq(kv, A.star(A.seq(comma, kv)))), ws, A.lit("}"))
        node = A.alt(*scalars, arr, obj)
    cache[depth] = node
    return node
