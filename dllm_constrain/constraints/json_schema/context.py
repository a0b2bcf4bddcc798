"""What the algebra and lowering modules may ask of the compiler that calls them. They receive an object with
this interface (the SchemaCompiler) and never import the compiler module, so the package has no import
cycle and each lowering module can be read on its own."""
from __future__ import annotations

from typing import Any, Protocol

from .. import regex_ast as A
from ..deadline import Deadline
from .ir import Conjunction
from .options import SchemaOptions
from .refs import RefResolver
from .validation import InstanceValidator


class LoweringContext(Protocol):
    opts: SchemaOptions
    deadline: Deadline | None
    ws: A.Node  # whitespace allowed between tokens
    refs: RefResolver
    validation: InstanceValidator
    unsat: list[str]  # why sub-languages came out empty (for UnsatisfiableSchemaError)
    enc_memo: dict  # memo of json_encode_string_body over this compilation
    conjunction_leaves: int  # conjunctions merged in the current distribution (bounds if/else cases)

    def compile(self, s: Any, path: str) -> A.Node:
        """The language of the JSON texts of subschema s (memoised)."""

    def lower(self, s: dict | Conjunction, path: str) -> A.Node:
        """The language of an applicator-free schema, or of a merged conjunction, per JSON type."""

    def check_deadline(self) -> None:
        """ConstraintTimeoutError once the call's deadline has passed."""

    def keep(self, x: Any) -> None:
        """Keep a schema the compiler made alive for the compilation (memo keys are ids)."""

    def difference(self, node: A.Node, negs: list[A.Node], kw: str, path: str) -> A.Node:
        """node minus the texts of negs (UnsupportedSchemaError naming kw when too large)."""

    def any_value(self, depth: int) -> A.Node:
        """Every JSON value nested at most `depth` levels."""
