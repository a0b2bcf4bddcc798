"""SchemaCompiler: a JSON Schema to the regex AST of its JSON texts (see the package docstring for the
narrowings), and schema_to_regex_ast, the entry point.

The compiler holds the state of one compilation (options, deadline, $ref counts, memo) and is the context
the applicator, algebra and lowering modules receive: it memoises subschemas, hands applicator-free
schemas to the lowering of each JSON type they allow, and reports why a schema came out empty."""
from __future__ import annotations

import warnings
from dataclasses import fields
from typing import Any, Callable

from ...errors import (InvalidSchemaError, UnknownKeywordError, UnknownKeywordWarning, UnsatisfiableSchemaError,
                       UnsupportedSchemaError)
from .. import dfa_ops
from .. import regex_ast as A
from ..deadline import Deadline
from ..formats import STANDARD_FORMATS
from .algebra import merge
from .applicators import compile_schema_dict
from .ir import Conjunction
from .keywords import ALL_TYPES, ARRAY_KW, NUMBER_KW, OBJECT_KW, STRING_KW, type_set
from .lower_arrays import lower_array
from .lower_objects import any_value, lower_object
from .lower_scalars import lower_boolean, lower_enum, lower_integer, lower_null, lower_number
from .lower_strings import lower_string
from .options import SchemaOptions, without_narrowings
from .refs import RefResolver
from .unknown import unknown_keywords
from .validation import InstanceValidator
from .values import type_of

_WHITESPACE_CHARS = [(0x20, 0x20), (0x0A, 0x0A), (0x0D, 0x0D), (0x09, 0x09)]

# the lowering of each JSON type: (context, conjunction, path, excluded values of that type) -> language
_LOWER_BY_TYPE: dict[str, Callable[..., A.Node]] = {
    "null": lower_null, "boolean": lower_boolean, "integer": lower_integer, "number": lower_number,
    "string": lower_string, "array": lower_array, "object": lower_object,
}


class SchemaCompiler:
    """One compilation of one schema document (the LoweringContext of the package's modules)."""

    def __init__(self, root: Any, opts: SchemaOptions, deadline: Deadline | None):
        if not isinstance(root, (dict, bool)):
            raise InvalidSchemaError("a JSON Schema must be an object or a boolean")
        self.root = root
        self.opts = opts
        self.deadline = deadline
        self.refs = RefResolver(root, opts.max_recursion_depth)
        self.validation = InstanceValidator(root)
        self.memo: dict = {}
        self._keep: list = []  # keep the compiler's own schemas alive (memo keys use id())
        self.ws = (A.EMPTY if opts.whitespace == "compact"
                   else A.rep(A.chars(_WHITESPACE_CHARS), 0, opts.flexible_whitespace_max))
        self._any_cache: dict[int, A.Node] = {}
        self.enc_memo: dict = {}
        self.conjunction_leaves = 0  # merged conjunctions compiled so far (bounds if/else distribution)
        self.unsat: list[str] = []  # why sub-languages came out empty (for UnsatisfiableSchemaError)

    # -------------------------------------------------------------- context services
    def keep(self, x: Any) -> None:
        self._keep.append(x)

    def check_deadline(self) -> None:
        if self.deadline is not None:
            self.deadline.check()

    def difference(self, node: A.Node, negs: list[A.Node], kw: str, path: str) -> A.Node:
        try:
            return dfa_ops.difference(node, [A.alt(*negs)], self.deadline, self.opts.intersection_limit)
        except dfa_ops.TooLarge:
            raise UnsupportedSchemaError(kw, path, "exclusion over a too complex language") from None

    def any_value(self, depth: int) -> A.Node:
        return any_value(self.ws, depth, self._any_cache)

    def unknown_keywords(self) -> list[tuple[str, str]]:
        return unknown_keywords(self.refs)

    # -------------------------------------------------------------- compiling
    def compile_root(self) -> A.Node:
        return self.compile(self.root, "#")

    def compile(self, s: Any, path: str) -> A.Node:
        self.check_deadline()
        if s is True:
            return self.any_value(self.opts.any_json_depth)
        if s is False:
            return A.NOTHING
        if not isinstance(s, dict):
            raise InvalidSchemaError(f"schema at {path} must be an object or a boolean, got {type(s).__name__}")
        key = self.refs.memo_key(s)
        hit = self.memo.get(key)
        if hit is not None and hit[0] is s:
            return hit[1]
        node = compile_schema_dict(self, s, path)
        self.memo[key] = (s, node)
        return node

    def lower(self, s: dict | Conjunction, path: str) -> A.Node:
        if not isinstance(s, Conjunction):
            s = merge(self, [s], path)
            if s is None:
                return A.NOTHING
        # enum / const: the finite set of values that satisfy every conjunct
        if "const" in s or "enum" in s:
            return lower_enum(self, s, path)
        if "type" in s:
            types = type_set(s["type"], path)
        elif self.opts.untyped_types == "inferred":
            types = _inferred_types(s)
            if types != set(ALL_TYPES):
                # the narrowing never empties a satisfiable schema: if the implied types admit no value,
                # the other types do (their keywords do not apply to them), as in the specification
                node = self._lower_types(s, path, types)
                if A.is_nothing(node):
                    others = set(ALL_TYPES) - types - ({"integer"} if "number" in types else set())
                    node = self._lower_types(s, path, others)
                return node
        else:
            types = set(ALL_TYPES)  # JSON Schema: keywords constrain only the values of their own type
        return self._lower_types(s, path, types)

    def _lower_types(self, s: Conjunction, path: str, types: set[str]) -> A.Node:
        types = set(types)
        if "number" in types and "integer" in types:
            types.discard("integer")
        parts = []
        for t in ALL_TYPES:
            if t not in types:
                continue
            self.check_deadline()
            ex = [v for v in s.excluded if type_of(v) == t or (t == "number" and type_of(v) == "integer")
                  or (t == "integer" and type_of(v) == "integer")]
            parts.append(_LOWER_BY_TYPE[t](self, s, path, ex))
        return A.alt(*parts)


def _inferred_types(s: Conjunction) -> set[str]:
    """The JSON types s's keywords apply to (all types when none does)."""
    kws = set(s)
    types = set()
    if kws & OBJECT_KW:
        types.add("object")
    if kws & ARRAY_KW:
        types.add("array")
    if kws & (STRING_KW - {"format"}) or s.patterns:
        types.add("string")
    if "format" in kws and s["format"] in STANDARD_FORMATS:
        types.add("string")
    if kws & NUMBER_KW:
        types.add("number")
    return types or set(ALL_TYPES)


# ------------------------------------------------------------------------------------------ entry point
def schema_to_regex_ast(schema: Any, opts: SchemaOptions | None = None, deadline: Deadline | None = None,
                        ignored: list | None = None) -> A.Node:
    """Compile a JSON Schema to the regex AST of its (narrowed) JSON texts. Keywords outside the JSON Schema
    vocabularies are appended to `ignored` as (JSON pointer, keyword) and, by `opts.unknown_keywords`,
    warned about (UnknownKeywordWarning), refused (UnknownKeywordError) or only listed."""
    opts = opts or SchemaOptions()
    try:
        sc = SchemaCompiler(schema, opts, deadline)
        _report_unknown_keywords(sc.unknown_keywords(), opts, ignored)
        node = sc.compile_root()
    except RecursionError:
        raise UnsupportedSchemaError("$ref", "#", "schema nesting too deep") from None
    if A.is_nothing(node):
        raise _unsatisfiable(schema, opts, deadline, sc.unsat)
    return node


def _report_unknown_keywords(unknown: list[tuple[str, str]], opts: SchemaOptions, ignored: list | None) -> None:
    """Refuse, warn about (attributed to schema_to_regex_ast's caller) or only list unknown keywords."""
    if not unknown:
        return
    if opts.unknown_keywords == "error":
        path, kw = unknown[0]
        raise UnknownKeywordError(kw, path, "unknown keyword, not enforced (unknown_keywords='error'); "
                                  f"all: {', '.join(f'{k!r} at {p}' for p, k in unknown)}")
    if opts.unknown_keywords == "warn":
        warnings.warn("JSON Schema keyword(s) not enforced (outside the JSON Schema vocabularies): "
                      + ", ".join(f"{k!r} at {p}" for p, k in unknown)
                      + "; pass unknown_keywords='error' to refuse them or 'ignore' to silence this",
                      UnknownKeywordWarning, stacklevel=3)
    if ignored is not None:
        ignored.extend(unknown)


def _unsatisfiable(schema: Any, opts: SchemaOptions, deadline: Deadline | None,
                   unsat: list[str]) -> UnsatisfiableSchemaError:
    """The error for a schema that compiled to nothing: never blamed on the schema when a narrowing option
    is the cause (the schema is compiled again without the narrowings to tell)."""
    why = "; ".join(dict.fromkeys(unsat)) or "no JSON value satisfies the schema"
    spec = without_narrowings(opts)
    if spec != opts:
        try:
            spec_node = SchemaCompiler(schema, spec, deadline).compile_root()
        except (UnsupportedSchemaError, RecursionError):
            spec_node = A.NOTHING
        if not A.is_nothing(spec_node):
            changed = [f"{f.name}={getattr(opts, f.name)!r}" for f in fields(opts)
                       if getattr(opts, f.name) != getattr(spec, f.name)]
            return UnsatisfiableSchemaError(
                f"the narrowing options ({', '.join(changed)}) leave no output for this schema, which is "
                f"satisfiable under the specification's semantics; pass strict=False ({why})")
    return UnsatisfiableSchemaError(why)
