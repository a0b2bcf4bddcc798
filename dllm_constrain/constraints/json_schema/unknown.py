"""Keywords outside the JSON Schema vocabularies: found once, by a walk over the subschemas reachable from
the root, before compiling (they are never enforced; the caller warns, refuses or only lists them)."""
from __future__ import annotations

from typing import Any

from ...errors import InvalidSchemaError, UnsupportedSchemaError
from .keywords import ANNOTATIONS, KNOWN_UNSUPPORTED, SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_VALUES, SUPPORTED
from .refs import RefResolver, escape_pointer


def unknown_keywords(refs: RefResolver) -> list[tuple[str, str]]:
    """(JSON pointer, keyword) of every keyword outside the JSON Schema vocabularies in the subschemas
    reachable from the root (following local $refs); annotations are not listed."""
    out: list[tuple[str, str]] = []
    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(refs.root, "#")]
    while stack:
        x, path = stack.pop()
        if not isinstance(x, dict) or id(x) in seen:
            continue
        seen.add(id(x))
        for k, v in x.items():
            if k not in ANNOTATIONS and k not in SUPPORTED and k not in KNOWN_UNSUPPORTED \
                    and not (k == "discriminator" and implied_discriminator(refs, x, path)):
                out.append((path, k))
                continue
            stack.extend(_subschemas(refs, x, k, v, path))
    return sorted(set(out))


def _subschemas(refs: RefResolver, x: dict, k: str, v: Any, path: str) -> list[tuple[Any, str]]:
    """(subschema, JSON pointer) of the subschemas keyword k of x holds (a $ref's target included)."""
    sub = f"{path}/{escape_pointer(k)}"
    if k in SCHEMA_MAPS and isinstance(v, dict):
        return [(w, f"{sub}/{escape_pointer(n)}") for n, w in v.items()]
    if k in SCHEMA_LISTS and isinstance(v, list):
        return [(w, f"{sub}/{i}") for i, w in enumerate(v)]
    if k in SCHEMA_VALUES:
        return [(v, sub)]
    if k == "$ref" and isinstance(v, str):
        try:
            target, uri = refs.resolve(v, path, refs.base_of(x))
        except (InvalidSchemaError, UnsupportedSchemaError):
            return []  # (compiling reports it)
        return [(target, uri)]
    return []


def implied_discriminator(refs: RefResolver, s: dict, path: str) -> bool:
    """OpenAPI's `discriminator` (Pydantic emits it beside a tagged union's oneOf) has no meaning for a
    JSON Schema validator; it is taken as an annotation only when the branches already decide what an
    OpenAPI reader would check: each branch is a $ref that requires `propertyName` and fixes it (const or
    enum) to strings that `mapping` sends to that same $ref. Otherwise it is reported as unknown."""
    d = s.get("discriminator")
    branches = s.get("oneOf", s.get("anyOf"))
    if not (isinstance(d, dict) and isinstance(d.get("propertyName"), str) and isinstance(d.get("mapping"), dict)
            and isinstance(branches, list) and branches):
        return False
    name, mapping = d["propertyName"], d["mapping"]
    for b in branches:
        ref = b.get("$ref") if isinstance(b, dict) else None
        if not isinstance(ref, str):
            return False
        try:
            target, _uri = refs.resolve(ref, path, refs.base_of(s))
        except (InvalidSchemaError, UnsupportedSchemaError):
            return False
        if not isinstance(target, dict) or name not in (target.get("required") or []):
            return False
        prop = (target.get("properties") or {}).get(name)
        vals = ([prop["const"]] if "const" in prop else prop.get("enum")) if isinstance(prop, dict) else None
        if not isinstance(vals, list) or not vals or any(not isinstance(v, str) or mapping.get(v) != ref
                                                         for v in vals):
            return False
    return True
