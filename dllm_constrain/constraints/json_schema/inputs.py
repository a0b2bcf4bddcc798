"""The forms a schema may be given in (dict, bool, JSON text, Pydantic model, outlines type), read as a dict, and
`NormalizedSchema`, a schema read once (what the compiler keys its cache by), so that no caller reads it twice."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidSchemaError


def normalize_schema_input(x: Any) -> dict:
    """A JSON Schema as a dict, from a dict, a bool, a JSON string/bytes, a Pydantic model class (or any
    type pydantic.TypeAdapter understands), or an outlines JsonSchema-like object (`.schema`)."""
    if isinstance(x, bool):
        return {} if x else {"not": {}}
    if isinstance(x, dict):
        return x
    if isinstance(x, (bytes, bytearray)):
        x = x.decode("utf-8")
    if isinstance(x, str):
        try:
            v = json.loads(x)
        except json.JSONDecodeError as e:
            raise InvalidSchemaError(f"schema is not valid JSON: {e}") from None
        if isinstance(v, bool):
            return normalize_schema_input(v)
        if not isinstance(v, dict):
            raise InvalidSchemaError(f"a JSON Schema must be an object or a boolean, got {type(v).__name__}")
        return v
    to_schema = getattr(x, "model_json_schema", None)
    if callable(to_schema):
        return to_schema()
    # outlines output types: outlines.types.JsonSchema(schema=...) and friends
    sch = getattr(x, "schema", None)
    if isinstance(sch, (str, dict)) and type(x).__module__.split(".")[0] in ("outlines", "outlines_core"):
        return normalize_schema_input(sch)
    if isinstance(x, type) or hasattr(x, "__origin__"):
        try:
            from pydantic import TypeAdapter  # optional

            return TypeAdapter(x).json_schema()
        except ImportError:
            pass
        except Exception as e:
            raise InvalidSchemaError(f"cannot derive a JSON Schema from {x!r}: {e}") from None
    raise InvalidSchemaError(
        f"schema must be a dict, a JSON string, a Pydantic model class or an outlines type, got {type(x).__name__}")



@dataclass(frozen=True, eq=False)
class NormalizedSchema:
    """A JSON Schema read once by `normalize_schema`: the dict, and its compact JSON text (the compile cache's key).
    `ConstraintCompiler.compile(schema=...)` takes it as it is: the schema is neither read nor serialised again.
    The dict belongs to it: do not change it afterwards."""

    schema: dict
    text: str


def normalize_schema(x: Any) -> NormalizedSchema:
    """`x` read as a JSON Schema (any form `normalize_schema_input` takes; a NormalizedSchema is returned as it
    is), with its compact JSON text; InvalidSchemaError when it is none."""
    if isinstance(x, NormalizedSchema):
        return x
    sch = normalize_schema_input(x)
    return NormalizedSchema(sch, json.dumps(sch, sort_keys=False, separators=(",", ":"), ensure_ascii=False,
                                            default=str))
