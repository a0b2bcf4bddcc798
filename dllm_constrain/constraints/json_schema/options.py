"""SchemaOptions: the knobs of the JSON Schema compiler (narrowings, unroll caps, whitespace), validated
once where they are made, and the reading of a set of options without the narrowings."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from ...errors import InvalidOptionError

WHITESPACE_MODES = ("compact", "flexible")


@dataclass(frozen=True)
class SchemaOptions:
    whitespace: str = "compact"  # "compact" | "flexible"
    flexible_whitespace_max: int = 4  # max whitespace chars between tokens in "flexible" mode
    max_recursion_depth: int = 5  # $ref recursion unrolled this many times
    any_json_depth: int = 6  # nesting depth of free-form values (schema `true` / `{}`, additional properties)
    additional_properties: str = "allow"  # when the schema does not say: "allow" (spec) | "forbid"
    # keywords outside the JSON Schema vocabularies (never enforced): "warn" (UnknownKeywordWarning; listed in
    # `ignored_keywords` either way) | "ignore" (listed only) | "error" (UnknownKeywordError)
    unknown_keywords: str = "warn"
    unique_items: str = "narrow"  # "narrow" | "error"
    max_string_unroll: int = 1024
    max_items_unroll: int = 64
    intersection_limit: int = 20000  # states of an eager intersection automaton
    additional_names: str = "any"  # names of undeclared properties: "any" | "nonempty" (never "")
    untyped_types: str = "all"  # a schema without `type`: "all" JSON types (spec) | "inferred" from its keywords
    # integers spelled with a zero fraction ("1.0"): "auto" = where the schema's draft counts them as integers
    # (draft 6 and later; draft-03/04 validators reject 1.0 for "integer") | "never"
    integer_zero_fraction: str = "auto"
    max_dependency_branches: int = 3  # optional dependentRequired names compiled exactly (2^n object branches)
    property_order: str = "any"  # declared properties: "any" order (spec) | "declared" order (cheaper canvas masks)
    # additional properties stand anywhere among the declared ones in objects with at most this many declared
    # properties, after them in larger objects (each interleaved state is a written subset times a key prefix)
    interleave_additional_max: int = 32
    # cases of a distributed conjunction (allOf over anyOf/oneOf/if) compiled before further `else` sides
    # (values failing an `if`) are dropped
    max_conjunction_leaves: int = 256
    # multipleOf a non-integer: "float" = the multiples python-jsonschema's float test accepts (x / k an integer
    # in doubles, as ajv computes it too) | "decimal" = every decimal multiple (validators that divide exactly:
    # ajv with multipleOfPrecision, Decimal-based ones), some of which the float test rejects (19.99 for 0.01)
    multiple_of: str = "float"

    def __post_init__(self):
        ws = self.whitespace
        if ws is None:
            object.__setattr__(self, "whitespace", "compact")
        elif ws not in WHITESPACE_MODES:
            raise InvalidOptionError(f"whitespace must be one of {WHITESPACE_MODES}, got {ws!r}")
        if self.additional_properties not in ("allow", "forbid"):
            raise InvalidOptionError("additional_properties must be 'allow' or 'forbid'")
        if self.unknown_keywords not in ("warn", "ignore", "error"):
            raise InvalidOptionError("unknown_keywords must be 'warn', 'ignore' or 'error'")
        if self.additional_names not in ("any", "nonempty"):
            raise InvalidOptionError("additional_names must be 'any' or 'nonempty'")
        if self.integer_zero_fraction not in ("auto", "never"):
            raise InvalidOptionError("integer_zero_fraction must be 'auto' or 'never'")
        if self.untyped_types not in ("all", "inferred"):
            raise InvalidOptionError("untyped_types must be 'all' or 'inferred'")
        if self.unique_items not in ("narrow", "error"):
            raise InvalidOptionError("unique_items must be 'narrow' or 'error'")
        if self.property_order not in ("any", "declared"):
            raise InvalidOptionError("property_order must be 'any' or 'declared'")
        if self.multiple_of not in ("float", "decimal"):
            raise InvalidOptionError("multiple_of must be 'float' or 'decimal'")
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(f.default, int) and not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                raise InvalidOptionError(f"{f.name} must be an integer >= 0, got {v!r}")

    def key(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))

    @classmethod
    def from_options(cls, **options: Any) -> "SchemaOptions":
        """SchemaOptions from keyword options, refusing unknown names with InvalidOptionError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InvalidOptionError(f"unknown JSON Schema option(s) {', '.join(map(repr, unknown))}; "
                                     f"known: {', '.join(sorted(known))}")
        return cls(**options)



# the options that narrow the specification's semantics (STRICT_SCHEMA_OPTIONS sets them), and their defaults
NARROWING_OPTIONS = ("additional_properties", "untyped_types", "additional_names", "property_order",
                      "integer_zero_fraction", "any_json_depth")


def without_narrowings(opts: SchemaOptions) -> SchemaOptions:
    defaults = SchemaOptions()
    kw = {name: getattr(defaults, name) for name in NARROWING_OPTIONS}
    if opts.any_json_depth > defaults.any_json_depth:
        kw["any_json_depth"] = opts.any_json_depth
    return replace(opts, **kw)
