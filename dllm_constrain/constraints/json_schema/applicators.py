"""Applicators: `$ref` (unrolled to the recursion bound), dependentSchemas, and allOf / anyOf / oneOf / not /
if distributed into conjunctions of plain schemas, each merged (algebra.merge) and lowered by the
compiler. The union of the conjunctions' languages is the schema's language."""
from __future__ import annotations


from ...errors import InvalidSchemaError, UnsupportedSchemaError
from .. import regex_ast as A
from .algebra import conjuncts_conflict, merge, negate
from .context import LoweringContext
from .ir import ApplicatorsEvaluate, Conjunct, ExcludedPattern, Exclusion, Negation
from .keywords import ALL_TYPES, refuse_unsupported
from .oneof import disjoint_branches

_IN_PLACE = ("allOf", "anyOf", "oneOf", "not", "if")
_IN_PLACE_ALL = _IN_PLACE + ("then", "else")


def compile_schema_dict(ctx: LoweringContext, s: dict, path: str) -> A.Node:
    """The language of a schema object (not memoised: SchemaCompiler.compile memoises)."""
    refuse_unsupported(s, path)
    if "$ref" in s:
        return _compile_ref(ctx, s, path)
    s = lower_dependent_schemas(ctx, s, path)
    if any(k in s for k in _IN_PLACE):
        return _compile_applicators(ctx, s, path)
    return ctx.lower(s, path)


def _compile_ref(ctx: LoweringContext, s: dict, path: str) -> A.Node:
    target, ref = ctx.refs.resolve_in(s, path)
    rest = ctx.refs.siblings(s)
    cnt = ctx.refs.counts.get(ref, 0)
    if cnt >= ctx.opts.max_recursion_depth:
        return A.NOTHING  # recursion bound reached: this branch is not generated
    ctx.refs.counts[ref] = cnt + 1
    try:
        if not rest:
            return ctx.compile(target, ref)
        # the schema holding the $ref stays the base of the conjunction (for unevaluatedProperties)
        both = {**rest, "allOf": [target] + list(rest.get("allOf", []))}
        ctx.keep(both)
        return ctx.compile(both, path)
    finally:
        if cnt == 0:
            del ctx.refs.counts[ref]
        else:
            ctx.refs.counts[ref] = cnt


def lower_dependent_schemas(ctx: LoweringContext, s: dict, path: str) -> dict:
    """`dependentSchemas` (and `dependencies` with schema values) as applicators: for each name a with
    schema S, a non-object, or an object without a, or an object with a that satisfies S (exact)."""
    deps = dict(s.get("dependentSchemas") or {})
    if not isinstance(deps, dict):
        raise InvalidSchemaError(f"dependentSchemas at {path} must be an object")
    old = s.get("dependencies")
    if isinstance(old, dict):
        deps.update({a: v for a, v in old.items() if not isinstance(v, list)})
    if not deps:
        return s
    rest = {k: v for k, v in s.items() if k != "dependentSchemas"}
    if isinstance(old, dict):
        arrays = {a: v for a, v in old.items() if isinstance(v, list)}
        rest.pop("dependencies")
        if arrays:
            rest["dependencies"] = arrays
    groups = []
    for a, sub in deps.items():
        if sub is True or sub == {}:
            continue
        groups.append({"anyOf": [{"type": [t for t in ALL_TYPES if t != "object"]},
                                 {"type": "object", "properties": {a: False}},
                                 {"allOf": [{"type": "object", "required": [a]}, sub]}]})
    if len(groups) > ctx.opts.max_dependency_branches:
        raise UnsupportedSchemaError("dependentSchemas", path,
                                     f"more than {ctx.opts.max_dependency_branches} schema dependencies")
    if groups:
        rest["allOf"] = list(rest.get("allOf", [])) + groups
    ctx.keep(rest)
    return rest


def _if_branches(x: dict) -> list:
    """`if`/`then`/`else` as two cases: (if AND then) OR (NOT if AND else)."""
    cond = x["if"]
    return [{"allOf": [cond, x.get("then", True)]}, {"allOf": [Negation(cond), x.get("else", True)]}]


def _disjunctions(x: dict, path: str) -> list[tuple[str, list]]:
    """The anyOf / oneOf of x, checked non-empty."""
    out = []
    for kw in ("anyOf", "oneOf"):
        if kw in x:
            if not isinstance(x[kw], list) or not x[kw]:
                raise InvalidSchemaError(f"{kw} at {path} must be a non-empty array")
            out.append((kw, x[kw]))
    return out


def _compile_applicators(ctx: LoweringContext, s: dict, path: str) -> A.Node:
    base = {k: v for k, v in s.items() if k not in _IN_PLACE_ALL}
    conj: list[Conjunct] = [base]
    if s.get("unevaluatedProperties", True) not in (True, {}) and _annotations_are_positive(ctx, s, path):
        conj.append(ApplicatorsEvaluate())
    if "allOf" in s:
        if not isinstance(s["allOf"], list) or not s["allOf"]:
            raise InvalidSchemaError(f"allOf at {path} must be a non-empty array")
        conj.extend(s["allOf"])
    disj_groups = _disjunctions(s, path)
    if "not" in s:
        conj.append(Negation(s["not"]))
    if "if" in s:
        disj_groups.append(("if", _if_branches(s)))
    outer_leaves, ctx.conjunction_leaves = ctx.conjunction_leaves, 0  # counted per distribution
    try:
        return compile_conjunction(ctx, conj, disj_groups, path)
    finally:
        ctx.conjunction_leaves = outer_leaves


def _annotations_are_positive(ctx: LoweringContext, s: dict, path: str) -> bool:
    """True when the properties the in-place applicators under s name may all count as evaluated for s's
    unevaluatedProperties: each conjunction we build from them then evaluates a subset of what the
    validator sees (a sound narrowing). Not so with `not`/`if` (their negations are compiled to
    positive schemas that name properties but produce no annotations), with an unevaluatedProperties
    below s (it sees only its own subtree) or with dynamic references."""
    stack: list = [(s, True)]
    seen: set[int] = set()
    while stack:
        x, is_root = stack.pop()
        if not isinstance(x, dict) or id(x) in seen:
            continue
        seen.add(id(x))
        if "not" in x or "if" in x or "$dynamicRef" in x or "$recursiveRef" in x:
            return False
        if not is_root and "unevaluatedProperties" in x:
            return False
        for kw in ("allOf", "anyOf", "oneOf"):
            if isinstance(x.get(kw), list):
                stack.extend((y, False) for y in x[kw])
        for kw in ("dependentSchemas", "dependencies"):
            if isinstance(x.get(kw), dict):
                stack.extend((y, False) for y in x[kw].values())
        if "$ref" in x:
            try:
                target, _ = ctx.refs.resolve_in(x, path)
            except (InvalidSchemaError, UnsupportedSchemaError):
                return False
            stack.append((target, False))
    return True


def compile_conjunction(ctx: LoweringContext, conj: list[Conjunct], disj_groups: list, path: str) -> A.Node:
    """The language of conj AND every disjunction of disj_groups: the first disjunction is distributed
    over the rest, each case compiled as a conjunction of its own."""
    entered: list[str] = []
    try:
        flat = _flatten(ctx, conj, disj_groups, entered, path)
        if flat is None:
            return A.NOTHING
        if not disj_groups:
            ctx.conjunction_leaves += 1
            merged = merge(ctx, flat, path)
            if merged is None:
                return A.NOTHING
            return ctx.lower(merged, path)
        if conjuncts_conflict(flat, path):
            return A.NOTHING  # prune before distributing the remaining disjunctions
        return _distribute(ctx, flat, disj_groups, path)
    finally:
        ctx.refs.leave_all(entered)


def _flatten(ctx: LoweringContext, conj: list[Conjunct], disj_groups: list, entered: list[str],
             path: str) -> list[Conjunct] | None:
    """conj with nested allOf and bare refs flattened, `not`s rewritten, and the anyOf/oneOf/if found on
    the way appended to disj_groups; None when a conjunct admits nothing. The refs entered are appended
    to `entered` (the caller leaves them)."""
    flat: list[Conjunct] = []
    stack = list(reversed(conj))
    while stack:
        ctx.check_deadline()
        x = stack.pop()
        if x is True or x == {}:
            continue
        if x is False:
            return None
        if isinstance(x, (ApplicatorsEvaluate, Exclusion, ExcludedPattern)):  # (already flat: carried into each case)
            flat.append(x)
            continue
        if isinstance(x, Negation):
            neg = negate(ctx, x.schema, path)
            if neg is False:
                return None
            if neg is not True:
                (flat if isinstance(neg, (Exclusion, ExcludedPattern)) else stack).append(neg)
            continue
        if not isinstance(x, dict):
            raise InvalidSchemaError(f"subschema at {path} must be an object or a boolean")
        x, ent = ctx.refs.deref(x, path)
        entered.extend(ent)
        if x is False:
            return None
        if x is True:
            continue
        if not isinstance(x, dict):
            raise InvalidSchemaError(f"subschema at {path} must be an object or a boolean")
        refuse_unsupported(x, path)
        x = lower_dependent_schemas(ctx, x, path)
        if not any(k in x for k in _IN_PLACE):
            flat.append(x)
            continue
        flat.append({k: v for k, v in x.items() if k not in _IN_PLACE_ALL})
        if "allOf" in x:
            stack.extend(reversed(x["allOf"]))
        disj_groups.extend(_disjunctions(x, path))
        if "not" in x:
            stack.append(Negation(x["not"]))
        if "if" in x:
            disj_groups.append(("if", _if_branches(x)))
    return flat


def _distribute(ctx: LoweringContext, flat: list[Conjunct], disj_groups: list, path: str) -> A.Node:
    """The first disjunction distributed over the conjunction flat AND the other disjunctions."""
    kw, branches = disj_groups[0]
    rest_groups = disj_groups[1:]
    if kw == "oneOf":
        branches = disjoint_branches(ctx, flat, branches, path)
    outs = []
    for k, b in enumerate(branches):
        ctx.check_deadline()
        if kw == "if" and k == 1 and ctx.conjunction_leaves > ctx.opts.max_conjunction_leaves:
            # distributing many if/then/else over each other multiplies the cases: past the
            # bound, values that fail `if` are not generated (a sound narrowing)
            continue
        saved = dict(ctx.refs.counts)
        try:
            outs.append(compile_conjunction(ctx, list(flat) + [b], list(rest_groups), f"{path}/{kw}/{k}"))
        except UnsupportedSchemaError as e:
            if kw == "if" and k == 1 and e.keyword == "not":
                # the `else` side needs the negation of `if`, which we cannot express: generate only
                # values satisfying `if` and `then` (a sound narrowing)
                ctx.refs.counts = saved
                continue
            raise
    return A.alt(*outs)
