"""The compiler's intermediate form between JSON Schema dicts and the regex AST.

A schema's applicators (allOf / anyOf / oneOf / not / if) are distributed into conjunctions of plain
schemas; each conjunction is merged keyword by keyword (algebra.merge) into one `Conjunction`, which the
lowering modules turn into a language per JSON type. The conjunct lists hold, besides schema dicts, the
typed items below: a `not` still to be read as a positive schema, the values a `not enum/const` removes,
and the mark that the applicators' property names count as evaluated. They are never JSON Schema
keywords, so no user schema can be mistaken for them."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
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
    dependencies_split: bool = False  # optional dependentRequired names already split into branches

    def get(self, k: str, default: Any = None) -> Any:
        return self.keywords.get(k, default)

    def __contains__(self, k: object) -> bool:
        return k in self.keywords

    def __getitem__(self, k: str) -> Any:
        return self.keywords[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keywords)

    def with_keywords(self, **kw: Any) -> "Conjunction":
        return replace(self, keywords=MappingProxyType({**self.keywords, **kw}))
