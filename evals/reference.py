"""The reference validator (python-jsonschema) and static facts about schemas.

`reference_validator(schema)`: the jsonschema validator class the schema's `$schema` names, Draft 2020-12
when it names none (or one jsonschema does not know), with that draft's format checker (format assertion on).
Generated outputs are checked with it; the dataset's own valid/invalid labels are compared against it.

`remote_refs(schema)`: the `$ref` / `$dynamicRef` targets that resolve to a document outside the schema
(neither the schema itself nor an embedded resource with that `$id`): the JSON-Schema-Test-Suite cases
the JSONSchemaBench paper leaves out as "remote-ref tests".
"""
from __future__ import annotations

import json
from typing import Any
from urllib.parse import urldefrag, urljoin

import jsonschema
from jsonschema import validators

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = ("not", "if", "then", "else", "contains", "additionalProperties", "additionalItems",
               "unevaluatedItems", "unevaluatedProperties", "propertyNames", "contentSchema", "items")


def _subschemas(s: dict) -> list[Any]:
    out: list[Any] = []
    for k in _SCHEMA_MAPS:
        v = s.get(k)
        if isinstance(v, dict):
            out += list(v.values())
    dep = s.get("dependencies")
    if isinstance(dep, dict):
        out += [v for v in dep.values() if isinstance(v, (dict, bool))]
    for k in _SCHEMA_LISTS:
        v = s.get(k)
        if isinstance(v, list):
            out += v
    for k in _SCHEMA_ONE:
        v = s.get(k)
        if isinstance(v, (dict, bool)):
            out.append(v)
        elif k == "items" and isinstance(v, list):
            out += v
    return out


def remote_refs(schema: Any) -> set[str]:
    """References whose target document is not the schema or one of its embedded resources."""
    ids: set[str] = set()
    refs: list[str] = []

    def walk(s: Any, base: str) -> None:
        if not isinstance(s, dict):
            return
        sid = s.get("$id")
        if isinstance(sid, str):
            base = urljoin(base, sid)
            ids.add(urldefrag(base)[0])
        for k in ("$ref", "$dynamicRef", "$recursiveRef"):
            v = s.get(k)
            if isinstance(v, str):
                refs.append(urljoin(base, v))
        for sub in _subschemas(s):
            walk(sub, base)

    walk(schema, "")
    ids.add("")
    return {r for r in refs if urldefrag(r)[0] not in ids}


def _refuse(uri: str):
    from referencing.exceptions import NoSuchResource

    raise NoSuchResource(ref=uri)


_REGISTRY = None


def _offline_registry():
    """The metaschemas, and no network: an unknown remote document is unresolvable (never fetched)."""
    global _REGISTRY
    if _REGISTRY is None:
        from referencing import Registry

        _REGISTRY = validators.SPECIFICATIONS.combine(Registry(retrieve=_refuse))
    return _REGISTRY


def reference_validator(schema: Any):
    """A jsonschema validator (format assertion on) for `schema`. Remote references are never fetched:
    validating through one raises (is_valid() then answers None)."""
    try:
        cls = validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    except Exception:  # unknown $schema value
        cls = jsonschema.Draft202012Validator
    return cls(schema, format_checker=cls.FORMAT_CHECKER, registry=_offline_registry())


def is_valid(validator, instance: Any) -> bool | None:
    """True / False, or None when the validator itself fails (bad schema, unresolvable ref, ...)."""
    try:
        return bool(validator.is_valid(instance))
    except Exception:
        return None


def _resolve_local(root: Any, s: Any, depth: int = 0) -> Any:
    """Follow a local JSON-pointer $ref ("#/a/b"), a few levels; anything else is returned as is."""
    while isinstance(s, dict) and isinstance(s.get("$ref"), str) and s["$ref"].startswith("#") and depth < 20:
        node = root
        try:
            for part in s["$ref"][1:].split("/")[1:]:
                part = part.replace("~1", "/").replace("~0", "~")
                node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            return s
        s, depth = node, depth + 1
    return s


def schema_order(schema: Any, instance: Any) -> Any:
    """Diagnostic only: `instance` with the keys of every object put in the schema's declared order
    (`properties` order, also through local $refs, allOf and the first anyOf/oneOf branch the instance
    validates against; then `required` names; then the remaining keys as they were). Used to tell how many
    rejected valid instances an engine would accept if properties came in the order the schema lists them."""
    root = schema

    def branches(s: Any) -> list[dict]:
        s = _resolve_local(root, s)
        if not isinstance(s, dict):
            return []
        out = [s]
        for sub in s.get("allOf") or []:
            out += branches(sub)
        return out

    def pick(s: Any, x: Any) -> list[dict]:
        bs = branches(s)
        for b in list(bs):
            for kw in ("anyOf", "oneOf"):
                for alt in b.get(kw) or []:
                    extra = {k: root[k] for k in ("$defs", "definitions") if isinstance(root, dict) and k in root}
                    try:
                        ok = reference_validator({**extra, **alt} if isinstance(alt, dict) else alt).is_valid(x)
                    except Exception:
                        ok = False
                    if ok:
                        bs += branches(alt)
                        break
        return bs

    def rec(s: Any, x: Any, depth: int = 0) -> Any:
        if depth > 60:
            return x
        bs = pick(s, x) if isinstance(x, (dict, list)) else []
        if isinstance(x, dict):
            order: list[str] = []
            props: dict[str, Any] = {}
            for b in bs:
                p = b.get("properties")
                if isinstance(p, dict):
                    for k, v in p.items():
                        if k not in props:
                            props[k] = v
                            order.append(k)
            for b in bs:
                for k in b.get("required") or []:
                    if isinstance(k, str) and k not in order:
                        order.append(k)
            keys = [k for k in order if k in x] + [k for k in x if k not in order]
            out = {}
            for k in keys:
                sub = props.get(k)
                if sub is None:
                    sub = next((b.get("additionalProperties") for b in bs if isinstance(b.get("additionalProperties"), dict)), None)
                out[k] = rec(sub, x[k], depth + 1) if sub is not None else x[k]
            return out
        if isinstance(x, list):
            prefix: list[Any] = []
            items = None
            for b in bs:
                if isinstance(b.get("prefixItems"), list) and not prefix:
                    prefix = b["prefixItems"]
                it = b.get("items")
                if isinstance(it, list) and not prefix:
                    prefix = it
                elif isinstance(it, dict) and items is None:
                    items = it
            return [rec(prefix[i] if i < len(prefix) else items, v, depth + 1)
                    if (i < len(prefix) or items is not None) else v for i, v in enumerate(x)]
        return x

    try:
        return rec(schema, instance)
    except RecursionError:
        return instance


def repeated_key_probe(instance: Any) -> str | None:
    """The compact spelling of an object instance with its first member written again at the end,
    {"a":1,"b":2} -> {"a":1,"b":2,"a":1}: the same value for json.loads, but a repeated name, which no
    engine should emit (RFC 8259: names SHOULD be unique; parsers keep the first, the last or fail).
    None when the instance is not a non-empty object."""
    if not isinstance(instance, dict) or not instance:
        return None
    k, v = next(iter(instance.items()))
    body = compact_json(instance)
    return body[:-1] + "," + compact_json({k: v})[1:]


def compact_json(x: Any) -> str:
    """The instance spelling every engine is walked over: compact separators, key order as given, UTF-8."""
    return json.dumps(x, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
