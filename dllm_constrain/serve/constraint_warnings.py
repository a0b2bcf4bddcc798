"""What the server tells a client about its constraint besides accepting it: schema keywords that are not enforced.

A keyword outside the JSON Schema vocabularies (`x-*`, `nullable`, a typo such as `maxLenght`) is never enforced;
the library reports it (UnknownKeywordWarning, `compiled.ignored_keywords`) rather than fail, and over HTTP that
report has to reach the client, not only the server's log. The walk here is the compiler's own
(`json_schema.unknown.unknown_keywords`), run on the request's schema before it is queued, so the warnings are
known before the response headers go out (for streams too). The app sends them as the `X-Constraint-Warnings`
header (a JSON array of strings) and, in a non-streamed body, as `constraint_warnings`.
"""
from __future__ import annotations

import json

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dllm_constrain.engine.state import OutputConstraint

HEADER = "X-Constraint-Warnings"
MAX_WARNINGS = 32  # listed in full up to this many; the rest are counted
MAX_HEADER_CHARS = 4096


def constraint_warnings(constraint: OutputConstraint | None) -> list[str]:
    """One line per schema keyword the compiler will not enforce (empty for other constraints, or for a schema
    the compiler will refuse anyway: its error is the answer then)."""
    if constraint is None or not isinstance(constraint.schema, dict):  # normalised: a dict, or a bool schema
        return []
    from dllm_constrain.constraints.json_schema.options import SchemaOptions
    from dllm_constrain.constraints.json_schema.refs import RefResolver
    from dllm_constrain.constraints.json_schema.unknown import unknown_keywords
    from dllm_constrain.errors import DllmConstrainError

    try:
        found = unknown_keywords(RefResolver(constraint.schema, SchemaOptions().max_recursion_depth))
    except (DllmConstrainError, ValueError, RecursionError):
        return []
    lines = [f"JSON Schema keyword {_short(kw)!r} at {_short(path)} is not enforced (outside the JSON Schema "
             "vocabularies)" for path, kw in found[:MAX_WARNINGS]]
    if len(found) > MAX_WARNINGS:
        lines.append(f"... and {len(found) - MAX_WARNINGS} more keywords not enforced")
    return lines


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def warnings_header(warnings: list[str]) -> dict[str, str]:
    """The response header for `warnings` (none when empty): a JSON array, ASCII-escaped, at most
    MAX_HEADER_CHARS long (later entries dropped and counted)."""
    if not warnings:
        return {}
    shown = list(warnings)
    value = json.dumps(shown, ensure_ascii=True)
    while len(value) > MAX_HEADER_CHARS and len(shown) > 1:
        shown.pop()
        value = json.dumps(shown + [f"... and {len(warnings) - len(shown)} more"], ensure_ascii=True)
    return {HEADER: value[:MAX_HEADER_CHARS]}
