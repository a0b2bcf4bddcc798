"""The compiler's intermediate form between JSON Schema dicts and the regex AST.

A schema's applicators (allOf / anyOf / oneOf / not / if) are distributed into conjunctions of plain
schemas; each conjunction is merged keyword by keyword (algebra.merge) into one `Conjunction`, which the
lowering modules turn into a language per JSON type. The conjunct lists hold, besides schema dicts, the
typed items below: a `not` still to be read as a positive schema, the values a `not enum/const` removes,
the patterns a `not pattern` forbids strings to match, and the mark that the applicators' property names count as evaluated. They are never JSON Schema
keywords, so no user schema can be mistaken for them.

Each per-type lowering first reads what a Conjunction says of its type into a small value (NumberRange,
StringSpec, ArraySpec, ObjectSpec), checking the keyword values it needs, and compiles from that."""
from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Iterator, Mapping


@dataclass(frozen=True, eq=False)
class Negation:
    """`not schema` as a conjunct, before it is rewritten as a positive schema (algebra.negate)."""
    schema: Any


@dataclass(frozen=True, eq=False)
class Exclusion:
    """The JSON values a conjunction must not produce (`not` over enum/const)."""
    values: tuple


@dataclass(frozen=True, eq=False)
class ExcludedPattern:
    """A conjunct: strings must not match p under any regex reading (`not {pattern: p}` is this and type string);
    it says nothing of other types."""
    pattern: str


@dataclass(frozen=True)
class ApplicatorsEvaluate:
    """Conjunct mark: the properties the applicators next to an `unevaluatedProperties` name may all count as
    evaluated (the conjunction built from them evaluates a subset of what a validator sees)."""


# a conjunct: a schema (dict or bool) or one of the typed items above
Conjunct = Any


@dataclass(frozen=True, eq=False)
class Conjunction:
    """A conjunction of applicator-free schemas merged into one: the merged JSON Schema keywords, plus what
    the merge keeps beside them. Read like a schema dict (`get`, `in`, `[]`) by the lowering modules."""
    keywords: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))  # read-only
    conjuncts: tuple = ()  # the original schemas (enum/const values are validated against each)
    excluded: tuple = ()  # values removed by `not enum/const`
    patterns: tuple = ()  # every `pattern` of the conjuncts (all must match)
    extra_formats: tuple = ()  # `format`s other than keywords["format"] (all must hold)
    applicators_evaluate: bool = False  # see ApplicatorsEvaluate
    excluded_patterns: tuple = ()  # patterns no string may match (`not {pattern}`, see ExcludedPattern)

    def get(self, k: str, default: Any = None) -> Any:
        return self.keywords.get(k, default)

    def __contains__(self, k: object) -> bool:
        return k in self.keywords

    def __getitem__(self, k: str) -> Any:
        return self.keywords[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keywords)


# ------------------------------------------------------------------------------------------ per-type readings
# What one JSON type's lowering reads from a Conjunction (or, for strings, a plain propertyNames schema),
# checked and normalised once: the lowering modules build these first and compile from them.
@dataclass(frozen=True)
class NumberRange:
    """Numeric bounds as Decimals (None: unbounded), moved inward where a double reading could cross them."""
    lo: Decimal | None
    lo_strict: bool
    hi: Decimal | None
    hi_strict: bool

    @property
    def bounded(self) -> bool:
        return self.lo is not None or self.hi is not None


@dataclass(frozen=True)
class StringSpec:
    """A string's length bounds (maximum capped at max_string_unroll) and the patterns and formats that
    must all hold (values as written in the schema: checked where they are compiled)."""
    min_length: int
    max_length: int | None
    patterns: tuple
    formats: tuple


@dataclass(frozen=True, eq=False)
class ArraySpec:
    """An array's items by position (`prefix`, then `rest` for every later item), its length bounds, and
    its uniqueItems / contains (schema, minimum count, maximum count or None) constraints."""
    prefix: tuple
    rest: Any
    min_items: int
    max_items: int | None
    unique: bool
    contains: tuple | None


@dataclass(frozen=True, eq=False)
class ObjectSpec:
    """An object's declared properties, required names (with their dependencies), pattern and additional
    property schemas, propertyNames and member count bounds."""
    properties: Mapping[str, Any]
    required: tuple
    pattern_properties: Mapping[str, Any]
    additional: Any  # schema of undeclared properties (False: none)
    undeclared_value: Any  # schema of required names that nothing declares
    property_names: Any
    min_properties: int
    max_properties: int | None
    dependencies: Mapping[str, list]  # name -> names its presence requires
