"""Schema algebra on the intermediate form: the merge of a conjunction into one `Conjunction` (keyword by
keyword, through a table of how each keyword combines), `not` rewritten as a positive schema, and a cheap
unsatisfiability proof for partial conjunctions."""
from __future__ import annotations

import functools
import json
import math
from types import MappingProxyType
from typing import Any, Callable

from ...errors import InvalidSchemaError, UnsupportedSchemaError
from .context import LoweringContext
from .ir import ApplicatorsEvaluate, Conjunct, Conjunction, ExcludedPattern, Exclusion
from .keywords import (ALL_TYPES, ANNOTATIONS, APPLICATORS, KNOWN_UNSUPPORTED, NEGATED_BOUND, SUPPORTED,
                       independent_keyword_groups, type_set)
from .patterns import pattern_matches
from .values import intersect_types, is_number, json_eq


class _Unsatisfiable(Exception):
    """Raised inside a merge when two conjuncts provably admit no common value."""


# ------------------------------------------------------------------------------------------ keyword merges
def _merge_type(cur: Any, v: Any, path: str) -> list[str]:
    out = sorted(intersect_types(type_set(cur, path), type_set(v, path)))
    if not out:
        raise _Unsatisfiable
    return out


def _merge_enum(cur: list, v: list, path: str) -> list:
    return [x for x in cur if any(json_eq(x, y) for y in v)]


def _merge_const(cur: Any, v: Any, path: str) -> Any:
    if not json_eq(cur, v):
        raise _Unsatisfiable
    return cur


def _larger(cur: Any, v: Any, path: str) -> Any:
    return max(cur, v)


def _smaller(cur: Any, v: Any, path: str) -> Any:
    return min(cur, v)


def _merge_required(cur: list, v: list, path: str) -> list:
    return list(dict.fromkeys(list(cur) + list(v)))


def _merge_schema_map(cur: dict, v: dict, path: str) -> dict:
    """properties / patternProperties: a name in both maps takes both schemas."""
    out = dict(cur)
    for pk, pv in v.items():
        out[pk] = {"allOf": [out[pk], pv]} if pk in out else pv
    return out


def _both_schemas(cur: Any, v: Any, path: str) -> dict:
    return {"allOf": [cur, v]}


def _merge_unique(cur: Any, v: Any, path: str) -> bool:
    return bool(cur) or bool(v)


def _merge_multiple_of(cur: Any, v: Any, path: str) -> Any:
    if cur == v:
        return cur
    if isinstance(cur, int) and isinstance(v, int):
        return cur * v // math.gcd(cur, v)
    raise UnsupportedSchemaError("multipleOf", path, "two different non-integer multipleOf in allOf")


def _merge_dependent_required(cur: dict, v: dict, path: str) -> dict:
    out = {a: list(b) for a, b in cur.items()}
    for a, b in v.items():
        out[a] = list(dict.fromkeys(out.get(a, []) + list(b)))
    return out


# how a keyword present in two conjuncts combines (cur, new, path) -> merged value
KEYWORD_MERGES: dict[str, Callable[[Any, Any, str], Any]] = {
    "type": _merge_type, "enum": _merge_enum, "const": _merge_const,
    "minimum": _larger, "minLength": _larger, "minItems": _larger, "minProperties": _larger,
    "exclusiveMinimum": _larger,
    "maximum": _smaller, "maxLength": _smaller, "maxItems": _smaller, "maxProperties": _smaller,
    "exclusiveMaximum": _smaller,
    "required": _merge_required,
    "properties": _merge_schema_map, "patternProperties": _merge_schema_map,
    "additionalProperties": _both_schemas, "propertyNames": _both_schemas,
    "uniqueItems": _merge_unique, "multipleOf": _merge_multiple_of, "dependentRequired": _merge_dependent_required,
}


def _merge_equal(k: str, cur: Any, v: Any, path: str) -> Any:
    """Other specification keywords: both conjuncts must say the same."""
    if json.dumps(cur, sort_keys=True, default=str) != json.dumps(v, sort_keys=True, default=str):
        raise UnsupportedSchemaError(k, path, "conflicting values in allOf")
    return cur


# ------------------------------------------------------------------------------------------ merge
class _MergeState:
    """The conjunction being merged (mutable while merging; frozen into a Conjunction at the end)."""

    def __init__(self) -> None:
        self.keywords: dict[str, Any] = {}
        self.conjuncts: list = []
        self.excluded: list = []
        self.patterns: list = []
        self.extra_formats: list = []
        self.applicators_evaluate = False
        self.excluded_patterns: list = []
        self.arrays: list[tuple[list, Any]] = []  # (prefixItems, items) of each conjunct that has either
        self.object_appl: list[tuple[bool, bool]] = []  # (has patternProperties, has additionalProperties)

    def add_keyword(self, k: str, v: Any, path: str) -> None:
        out = self.keywords
        if k == "pattern":
            self.patterns.append(v)
        elif k not in out:
            out[k] = v
        elif k == "format":
            if out[k] != v:
                self.extra_formats.append(v)
        elif k in KEYWORD_MERGES:
            out[k] = KEYWORD_MERGES[k](out[k], v, path)
        elif k in SUPPORTED or k in KNOWN_UNSUPPORTED:
            out[k] = _merge_equal(k, out[k], v, path)

    def frozen(self) -> Conjunction:
        return Conjunction(MappingProxyType(self.keywords), tuple(self.conjuncts), tuple(self.excluded),
                           tuple(self.patterns), tuple(self.extra_formats), self.applicators_evaluate,
                           tuple(self.excluded_patterns))


@functools.singledispatch
def _add_conjunct(s0: Any, st: _MergeState, path: str) -> None:
    raise TypeError(f"not a conjunct: {s0!r}")


@_add_conjunct.register
def _(s0: dict, st: _MergeState, path: str) -> None:
    s = normalize_draft(s0)
    st.conjuncts.append(s0)
    if "prefixItems" in s or "items" in s:
        prefix = s.get("prefixItems", [])
        if not isinstance(prefix, list):
            raise InvalidSchemaError(f"prefixItems at {path} must be an array")
        st.arrays.append((prefix, s.get("items")))
    if "patternProperties" in s or s.get("additionalProperties", True) not in (True, {}):
        st.object_appl.append(("patternProperties" in s, s.get("additionalProperties", True) not in (True, {})))
    for k, v in s.items():
        if k in ANNOTATIONS or k in ("prefixItems", "items"):
            continue
        st.add_keyword(k, v, path)


@_add_conjunct.register
def _(s0: Exclusion, st: _MergeState, path: str) -> None:
    st.excluded.extend(s0.values)


@_add_conjunct.register
def _(s0: ExcludedPattern, st: _MergeState, path: str) -> None:
    st.excluded_patterns.append(s0.pattern)


@_add_conjunct.register
def _(s0: ApplicatorsEvaluate, st: _MergeState, path: str) -> None:
    st.applicators_evaluate = True


def merge(ctx: LoweringContext, schemas: list[Conjunct], path: str) -> Conjunction | None:
    """Merge a conjunction of (ref-free at top level, applicator-free) schemas and typed conjuncts into one
    Conjunction. Returns None when provably unsatisfiable."""
    st = _MergeState()
    try:
        for s0 in schemas:
            _add_conjunct(s0, st, path)
    except _Unsatisfiable:
        return None
    if st.arrays:
        _merge_array_items(st.keywords, st.arrays)
    appl = st.object_appl
    if any(pp for pp, _ in appl) and sum(1 for pp, ad in appl if pp or ad) > 1 and any(ad for _, ad in appl):
        # a key matching one subschema's pattern must also satisfy another subschema's
        # additionalProperties unless that subschema declares or matches it: not tracked per key
        raise UnsupportedSchemaError("patternProperties", path,
                                     "in allOf next to another subschema's additionalProperties")
    # properties from one conjunct that another conjunct's additionalProperties governs
    _fix_additional_in_conj(st.keywords, st.conjuncts, path)
    out = st.frozen()
    ctx.keep(out)
    return out


def _merge_array_items(out: dict, arrays: list[tuple[list, Any]]) -> None:
    """prefixItems/items of several conjuncts. Each conjunct's `items` applies after its own prefix, so
    element k must satisfy, for every conjunct, its prefixItems[k] if it has one, else its `items`."""
    n = max(len(prefix) for prefix, _ in arrays)

    def conj(xs: list) -> Any:
        xs = [x for x in xs if x is not None and x is not True and x != {}]
        if not xs:
            return True
        return xs[0] if len(xs) == 1 else {"allOf": xs}

    if n:
        out["prefixItems"] = [conj([prefix[k] if k < len(prefix) else items for prefix, items in arrays])
                              for k in range(n)]
    if any(items is not None for _, items in arrays):  # (present, even if true: unevaluatedItems)
        out["items"] = conj([items for _, items in arrays])


def _fix_additional_in_conj(out: dict, conj: list, path: str) -> None:
    """A property declared by one conjunct also takes the patternProperties / additionalProperties schemas
    another conjunct applies to it."""
    if len(conj) < 2:
        return
    props = out.get("properties")
    if not props:
        return
    new_props = dict(props)
    changed = False
    for c in conj:
        if "additionalProperties" not in c and "patternProperties" not in c:
            continue
        own = c.get("properties", {}) or {}
        for pk in props:
            if pk in own:
                continue
            extra = _governing_schemas(c, pk, path)
            if extra:
                new_props[pk] = {"allOf": [new_props[pk]] + extra}
                changed = True
    if changed:
        out["properties"] = new_props


def _governing_schemas(c: dict, name: str, path: str) -> list:
    """The schemas conjunct c applies to a property it does not declare: those of the patterns matching it
    under some reading, and additionalProperties unless a pattern matches it under every reading."""
    pats = list((c.get("patternProperties") or {}).keys())
    addl = c.get("additionalProperties", True)
    extra = []
    matched = False  # (under every reading)
    for p in pats:
        if pattern_matches(p, name, path, "any"):
            extra.append(c["patternProperties"][p])
            matched = matched or pattern_matches(p, name, path, "all")
    if not matched and addl is not True:
        extra.append(addl)
    return extra


def normalize_draft(s: dict) -> dict:
    """Draft-04 boolean exclusiveMinimum/Maximum, tuple `items`; minContains/maxContains without
    `contains` in the same schema mean nothing."""
    if "contains" not in s and ("minContains" in s or "maxContains" in s):
        s = {k: v for k, v in s.items() if k not in ("minContains", "maxContains")}
    if isinstance(s.get("exclusiveMinimum"), bool) or isinstance(s.get("exclusiveMaximum"), bool):
        s = dict(s)
        for ex, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if isinstance(s.get(ex), bool):
                flag = s.pop(ex)
                if flag and bound in s:
                    s[ex] = s.pop(bound)
    if isinstance(s.get("items"), list):
        s = dict(s)
        s["prefixItems"] = s.pop("items")
        if "additionalItems" in s:
            s["items"] = s.pop("additionalItems")
    elif "additionalItems" in s and "prefixItems" not in s:
        s = {k: v for k, v in s.items() if k != "additionalItems"}  # ignored without tuple items
    return s


# ------------------------------------------------------------------------------------------ conflicts
def conjuncts_conflict(flat: list[Conjunct], path: str) -> bool:
    """A cheap unsatisfiability proof for a partial conjunction: disjoint `type`s, or objects only with a
    required property whose const/enum values the conjuncts leave empty (a discriminator chosen twice by
    if/then or oneOf branches). False means nothing proven."""
    types: set[str] | None = None
    required: set[str] = set()
    values: dict[str, list] = {}
    for x in flat:
        if not isinstance(x, dict):
            continue
        if "type" in x:
            t = type_set(x["type"], path)
            types = t if types is None else intersect_types(types, t)
            if not types:
                return True
        req = x.get("required")
        if isinstance(req, list):
            required.update(r for r in req if isinstance(r, str))
        props = x.get("properties")
        if isinstance(props, dict):
            _narrow_fixed_values(values, props)
    # required/properties bind objects only: other types satisfy them vacuously
    return types == {"object"} and any(not values[p] for p in required if p in values)


def _narrow_fixed_values(values: dict[str, list], props: dict) -> None:
    """Intersect the const/enum values each property may take with those `props` allows."""
    for p, sub in props.items():
        if sub is False:
            vals = []
        elif not isinstance(sub, dict):
            continue
        elif "const" in sub:
            vals = [sub["const"]]
        elif isinstance(sub.get("enum"), list):
            vals = sub["enum"]
        else:
            continue
        cur = values.get(p)
        values[p] = vals if cur is None else [v for v in cur if any(json_eq(v, w) for w in vals)]


# ------------------------------------------------------------------------------------------ not
def negate(ctx: LoweringContext, n: Any, path: str) -> Any:
    """An equivalent positive schema for `not n` (or an Exclusion of values, an ExcludedPattern); UnsupportedSchemaError
    naming `not` for forms we cannot express."""
    with ctx.refs.dereferenced(n, path) as n:
        if n is True:
            return False
        if n is False:
            return True
        if not isinstance(n, dict):
            raise InvalidSchemaError(f"'not' at {path} must hold a schema")
        n = normalize_draft(n)
        kws = {k for k in n if k not in ANNOTATIONS}
        if not kws:
            return False
        for rule in _NEGATION_RULES:
            out = rule(ctx, n, kws, path)
            if out is not _NO_RULE:
                return out
        raise UnsupportedSchemaError("not", path, f"negation of {sorted(kws)}")


_NO_RULE = object()  # a negation rule that does not apply


def _negate_type(ctx: LoweringContext, n: dict, kws: set, path: str) -> Any:
    if kws != {"type"}:
        return _NO_RULE
    t = type_set(n["type"], path)
    rem = set(ALL_TYPES) - t
    if "integer" in t:
        rem.discard("number")  # non-integer numbers are not expressible: narrow them away
    if "number" in t:
        rem.discard("integer")
    return {"type": sorted(rem)} if rem else False


def _negate_bound(ctx: LoweringContext, n: dict, kws: set, path: str) -> Any:
    if not (len(kws) == 1 and next(iter(kws)) in NEGATED_BOUND):
        return _NO_RULE
    k = next(iter(kws))
    v = n[k]
    if not is_number(v):
        raise InvalidSchemaError(f"{k} at {path} must be a number")
    t, k2, shift = NEGATED_BOUND[k]
    if shift and v + shift < 0:
        return False  # not {minLength: 0}: nothing
    return {"type": t, k2: v + shift}


def _negate_values(ctx: LoweringContext, n: dict, kws: set, path: str) -> Any:
    if kws not in ({"enum"}, {"const"}, {"enum", "type"}, {"const", "type"}):
        return _NO_RULE
    vals = list(n["enum"]) if "enum" in n else [n["const"]]
    if "type" in n:
        vals = [v for v in vals if ctx.validation.is_valid(v, {"type": n["type"]})]
    return Exclusion(tuple(vals))


def _negate_pattern(ctx: LoweringContext, n: dict, kws: set, path: str) -> Any:
    if kws != {"pattern"}:
        return _NO_RULE
    if not isinstance(n["pattern"], str):
        raise InvalidSchemaError(f"pattern at {path} must be a string")
    # every non-string satisfies `pattern`: its negation holds strings only
    return {"type": "string", "allOf": [ExcludedPattern(n["pattern"])]}


def _negate_required(ctx: LoweringContext, n: dict, kws: set, path: str) -> Any:
    if kws != {"required"}:
        return _NO_RULE
    ps = n["required"]
    if not isinstance(ps, list) or not ps:
        return False
    alts = [{"properties": {p: False}} for p in ps]
    return {"type": "object", **({"anyOf": alts} if len(alts) > 1 else alts[0])}


def _negate_one_property(ctx: LoweringContext, n: dict, kws: set, path: str) -> Any:
    if not (kws <= {"properties", "required"} and isinstance(n.get("properties"), dict)
            and len(n["properties"]) == 1):
        return _NO_RULE
    (p, sub), = n["properties"].items()
    req = n.get("required", [])
    if req and req != [p]:
        raise UnsupportedSchemaError("not", path, "not {properties, required} over different names")
    present_bad = {"required": [p], "properties": {p: {"not": sub}}}
    if req:
        return {"type": "object", "anyOf": [{"properties": {p: False}}, present_bad]}
    return {"type": "object", **present_bad}


def _negate_applicator(ctx: LoweringContext, n: dict, kws: set, path: str) -> Any:
    if kws == {"not"}:
        return n["not"]
    if kws == {"anyOf"}:
        return {"allOf": [{"not": b} for b in n["anyOf"]]}
    if kws == {"allOf"}:
        return {"anyOf": [{"not": b} for b in n["allOf"]]}
    return _NO_RULE


def _negate_properties(ctx: LoweringContext, n: dict, kws: set, path: str) -> Any:
    if not (kws == {"properties"} and isinstance(n["properties"], dict) and n["properties"]):
        return _NO_RULE
    # some declared property is present and fails its schema
    return {"type": "object", "anyOf": [{"required": [p], "properties": {p: {"not": sub}}}
                                        for p, sub in n["properties"].items()]}


def _negate_groups(ctx: LoweringContext, n: dict, kws: set, path: str) -> Any:
    groups = independent_keyword_groups(kws)
    if len(groups) > 1 and not (kws & APPLICATORS):
        # a schema is the conjunction of its independent keyword groups: not (A and B) = not A or not B
        return {"anyOf": [{"not": {k: n[k] for k in g}} for g in groups]}
    return _NO_RULE


# tried in order; the first that applies gives the negation
_NEGATION_RULES = (_negate_type, _negate_bound, _negate_values, _negate_pattern, _negate_required, _negate_one_property,
                   _negate_applicator, _negate_properties, _negate_groups)
