"""The JSON Schema vocabulary as the compiler reads it: which keywords exist, which are annotations, which
ones apply to which JSON type, which are refused, and where subschemas stand."""
from __future__ import annotations

from typing import Any

from ...errors import InvalidSchemaError, UnsupportedSchemaError

ANNOTATIONS = frozenset({
    "title", "description", "examples", "default", "$schema", "$id", "id", "$comment", "deprecated", "readOnly",
    "writeOnly", "contentMediaType", "contentEncoding", "contentSchema", "$anchor", "$dynamicAnchor",
    "$vocabulary", "definitions", "$defs", "$recursiveAnchor",
    "example",  # OpenAPI's singular example (an annotation there too)
})
OBJECT_KW = frozenset({"properties", "required", "additionalProperties", "patternProperties", "minProperties",
                       "maxProperties", "propertyNames", "dependentRequired", "dependencies", "dependentSchemas",
                       "unevaluatedProperties"})
ARRAY_KW = frozenset({"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains",
                      "minContains", "maxContains", "unevaluatedItems"})
STRING_KW = frozenset({"minLength", "maxLength", "pattern", "format"})
NUMBER_KW = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
APPLICATORS = frozenset({"allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref"})
# keywords whose meaning depends on each other (a schema is the conjunction of these groups and of every
# other keyword alone)
DEPENDENT_KEYWORDS = (frozenset({"properties", "patternProperties", "additionalProperties", "unevaluatedProperties"}),
                       frozenset({"prefixItems", "items", "additionalItems", "unevaluatedItems"}),
                       frozenset({"contains", "minContains", "maxContains"}),
                       frozenset({"if", "then", "else"}))


def independent_keyword_groups(kws: set[str]) -> list[frozenset[str]]:
    groups = []
    rest = set(kws)
    for g in DEPENDENT_KEYWORDS:
        if rest & g:
            groups.append(frozenset(rest & g))
            rest -= g
    return groups + [frozenset({k}) for k in sorted(rest)]
SUPPORTED = OBJECT_KW | ARRAY_KW | STRING_KW | NUMBER_KW | APPLICATORS | {"type", "enum", "const"}
# where subschemas stand (for listing unknown keywords)
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas", "dependencies"})
SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
SCHEMA_VALUES = frozenset({"additionalProperties", "unevaluatedProperties", "propertyNames", "items",
                            "additionalItems", "unevaluatedItems", "contains", "not", "if", "then", "else"})
# spec keywords we refuse (always, or in the forms we cannot honour)
KNOWN_UNSUPPORTED = frozenset({"$dynamicRef", "$recursiveRef", "extends", "disallow", "divisibleBy"})
# the keywords a validator acts on: any other (annotations, extensions such as `x-*`, typos) it ignores
VALIDATED = SUPPORTED | KNOWN_UNSUPPORTED
ALL_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")


# `not {k: v}` for a single bound k: the values of k's type beyond the bound (type, keyword, shift of v)
NEGATED_BOUND = {
    "minimum": ("number", "exclusiveMaximum", 0), "maximum": ("number", "exclusiveMinimum", 0),
    "exclusiveMinimum": ("number", "maximum", 0), "exclusiveMaximum": ("number", "minimum", 0),
    "minLength": ("string", "maxLength", -1), "maxLength": ("string", "minLength", 1),
    "minItems": ("array", "maxItems", -1), "maxItems": ("array", "minItems", 1),
    "minProperties": ("object", "maxProperties", -1), "maxProperties": ("object", "minProperties", 1),
}


def type_set(t: Any, path: str) -> set[str]:
    """The JSON types a `type` value names ("any", draft 3, names all)."""
    if isinstance(t, str):
        t = [t]
    if not isinstance(t, list) or not t:
        raise InvalidSchemaError(f"'type' at {path} must be a string or a non-empty array")
    out = set()
    for x in t:
        if x == "any":
            out.update(ALL_TYPES)
            continue
        if x not in ALL_TYPES:
            raise InvalidSchemaError(f"unknown type {x!r} at {path}")
        out.add(x)
    return out


def refuse_unsupported(s: dict, path: str) -> None:
    """UnsupportedSchemaError for a specification keyword we never honour. (Keywords outside the
    vocabularies are reported or refused before compiling: see unknown_keywords.)"""
    for k in s:
        if k in KNOWN_UNSUPPORTED:
            raise UnsupportedSchemaError(k, path)
