"""`oneOf` as schema algebra: each branch narrowed (to the JSON types where it is provably disjoint from every
other branch, and by forbidding properties other branches require) so that no output satisfies two."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import InvalidSchemaError, UnsupportedSchemaError
from .algebra import merge
from .context import LoweringContext
from .ir import Conjunct, Conjunction
from .keywords import ALL_TYPES, type_set
from .patterns import pattern_matches
from .values import kind_of, kinds_of_types, types_of_kinds

_APPLICATORS_DROPPED = ("anyOf", "oneOf", "not", "if", "then", "else")


@dataclass(frozen=True, eq=False)
class BranchSummary:
    """What the disjointness checks know of a branch: the kinds of JSON values it accepts (JSON Schema
    semantics: an untyped schema accepts every type its keywords do not restrict), its finite set of values
    if any, and the merged schema (applicators dropped: a weaker schema)."""
    kinds: frozenset
    schema: Any  # a Conjunction, or {} for a branch that accepts nothing
    values: list | None
    branch: Any


def disjoint_branches(ctx: LoweringContext, base: list[Conjunct], branches: list, path: str) -> list:
    """Branches of a oneOf, narrowed so that no output satisfies two."""
    infos = [branch_summary(ctx, base, b, path) for b in branches]
    # the summaries of the branches' property schemas, which every pair of branches compares again: one per
    # schema object for this oneOf (the refs entered meanwhile are the same for all of them: each summary leaves
    # the ones it entered)
    summaries: dict[int, tuple[Any, BranchSummary | None]] = {}
    out = []
    dropped = []
    for i in range(len(branches)):
        forbid: list[str] = []
        kinds = set(infos[i].kinds) if infos[i] is not None else set()
        for j in range(len(branches)):
            if i != j and kinds:
                ctx.check_deadline()  # pairs of a wide oneOf: milliseconds between the lowering's own checks
                kinds &= kinds_failing(ctx, infos[i], infos[j], forbid, summaries)
                if not kinds:
                    dropped.append((i, j))
        types = types_of_kinds(kinds)
        if not types:
            continue  # a branch whose outputs might satisfy another branch is not generated
        extra: list = []
        if kinds_of_types(types) != infos[i].kinds:
            extra.append({"type": types})
        if forbid and "object" in types:
            extra.append({"properties": {p: False for p in forbid}})
        out.append({"allOf": [branches[i]] + extra} if extra else branches[i])
    if not out:
        i, j = dropped[0] if dropped else (0, 1)
        raise UnsupportedSchemaError("oneOf", path, f"branches {i} and {j} are not provably disjoint")
    return out


def branch_summary(ctx: LoweringContext, base: list[Conjunct], b: Any, path: str) -> BranchSummary | None:
    """The summary of branch b under the conjuncts `base` (None = unknown)."""
    empty = BranchSummary(frozenset(), {}, [], b)
    try:
        flat = _flat_conjuncts(ctx, [x for x in base if x] + [b], path)
        if flat is False:
            return empty
        if flat is None:
            return None
        m = merge(ctx, flat, path) if flat else Conjunction()
    except (UnsupportedSchemaError, InvalidSchemaError):
        return None
    if m is None:
        return empty
    kinds = kinds_of_types(type_set(m["type"], path) if "type" in m else ALL_TYPES)
    values = None
    if "const" in m:
        values = [m["const"]]
    elif "enum" in m:
        values = list(m["enum"])
    if values is not None:
        kinds &= {kind_of(v) for v in values}
    return BranchSummary(frozenset(kinds), m, values, b)


def _flat_conjuncts(ctx: LoweringContext, parts: list, path: str) -> list | bool | None:
    """The schema dicts of a conjunction with bare $refs followed, one level of allOf pulled up and the
    other applicators dropped; False for a conjunction with a `false` part, None where the recursion bound
    hides the language."""
    flat: list = []
    entered: list[str] = []
    try:
        for x in parts:
            if x is True:
                continue
            if x is False:
                return False
            x, ent = ctx.refs.deref(x, path)
            entered.extend(ent)
            if x is False:
                return None  # recursion bound reached: the branch's language is not known here
            if not isinstance(x, dict):
                continue
            if any(k in x for k in ("anyOf", "oneOf", "not", "if")):
                x = {k: v for k, v in x.items() if k not in _APPLICATORS_DROPPED}
            if "allOf" in x:
                for y in x["allOf"]:
                    y2, ent2 = ctx.refs.deref(y, path)
                    entered.extend(ent2)
                    if isinstance(y2, dict):
                        flat.append({k: v for k, v in y2.items() if k not in ("anyOf", "oneOf", "not", "if", "allOf")})
                x = {k: v for k, v in x.items() if k != "allOf"}
            flat.append(x)
    finally:
        ctx.refs.leave_all(entered)
    return flat


def kinds_failing(ctx: LoweringContext, a: BranchSummary | None, b: BranchSummary | None,
                  forbid: list[str], summaries: dict[int, tuple[Any, BranchSummary | None]]) -> set[str]:
    """The kinds of values of branch a proven not to satisfy branch b (possibly after adding property
    names to `forbid`, which narrows a's objects). `summaries`: property schemas' summaries already made (by
    schema object), shared by the comparisons of one oneOf."""
    if a is None or b is None:
        return set()
    ka, kb = a.kinds, b.kinds
    if not (ka & kb):
        return set(ka)
    safe = set(ka - kb)
    if a.values is not None:
        try:
            return set(ka) if all(not _valid_against_branch(ctx, v, b) for v in a.values) else safe
        except Exception:
            return safe
    if b.values is not None:
        # b only accepts its enumerated values: a's outputs fail b if a rejects them all
        try:
            return set(ka) if all(not _valid_against_branch(ctx, v, a) for v in b.values) else safe
        except Exception:
            return safe
    if "object" in ka & kb and _objects_fail(ctx, a, b, forbid, summaries):
        safe.add("object")
    return safe


def _property_summary(ctx: LoweringContext, schema: Any,
                      summaries: dict[int, tuple[Any, BranchSummary | None]]) -> BranchSummary | None:
    """`branch_summary` of a property schema on its own, made once per schema object (the object is kept with it,
    so its id is not reused meanwhile)."""
    hit = summaries.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    summary = branch_summary(ctx, [], schema, "#")
    summaries[id(schema)] = (schema, summary)
    return summary


def _objects_fail(ctx: LoweringContext, a: BranchSummary, b: BranchSummary, forbid: list[str],
                  summaries: dict[int, tuple[Any, BranchSummary | None]]) -> bool:
    """True when no object generated for branch a satisfies branch b (possibly after forbidding names)."""
    sa, sb = a.schema, b.schema
    req_a = list(sa.get("required", []) or [])
    props_a = sa.get("properties", {}) or {}
    props_b = sb.get("properties", {}) or {}
    req_b = list(sb.get("required", []) or [])
    # a requires p and b forbids p / b's schema for p is disjoint from a's
    b_addl = sb.get("additionalProperties", True)
    b_pats = sb.get("patternProperties") or {}
    for p in req_a:
        if p not in props_b and b_addl is False and not any(pattern_matches(q, p, "#", "any") for q in b_pats):
            return True
        if p in props_b and p in props_a:
            pa = _property_summary(ctx, props_a[p], summaries)
            pb = _property_summary(ctx, props_b[p], summaries)
            if pb is not None and pb.schema == {} and props_b[p] is False:
                return True
            if props_b[p] is False:
                return True
            if pa is not None and pa.kinds and kinds_failing(ctx, pa, pb, [], summaries) >= pa.kinds:
                return True
    # narrow a: forbid a property that b requires and a does not
    for p in req_b:
        if p not in req_a:
            forbid.append(p)
            return True
    return False


def _valid_against_branch(ctx: LoweringContext, v: Any, info: BranchSummary) -> bool:
    b = info.branch
    if b is None:
        return True
    return ctx.validation.is_valid(v, b)
