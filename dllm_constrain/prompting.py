"""The prompt format shared by training and inference; one module so the two can never drift apart.

    Request: <the user's text>
    Fields: name, age, city?, address{street, city}, tags[]
    Answer: 

The schema reaches the model as a compact field sketch, not as its JSON: the constraint layer carries the
structure (keys, types, bounds) and the model only has to know which keys to fill, so a schema costs a few
tokens of context whatever its size. The sketch is cut at `SKETCH_BUDGET` characters (ending in "...") for very
large schemas; the constraint still enforces all of it. The bundled model was trained on exactly this layout;
the tokenizer adds BOS itself (post-processor).
"""
from __future__ import annotations

import json
from typing import Any

SKETCH_BUDGET = 400
_MAX_DEPTH = 3


def _resolve(schema: Any, root: Any) -> Any:
    """Follow a local `$ref` ("#/$defs/x", "#/definitions/x") once or twice; anything else is left as it is."""
    for _ in range(4):
        if not isinstance(schema, dict) or not isinstance(schema.get("$ref"), str):
            return schema
        ref = schema["$ref"]
        if not ref.startswith("#"):
            return schema
        node: Any = root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                return schema
            node = node[part]
        schema = node
    return schema


def _branch(schema: dict[str, Any]) -> Any:
    """The first branch of anyOf/oneOf/allOf that says something about the shape."""
    for keyword in ("allOf", "anyOf", "oneOf"):
        branches = schema.get(keyword)
        if isinstance(branches, list):
            for b in branches:
                if isinstance(b, dict) and ("properties" in b or "items" in b or "$ref" in b):
                    return b
    return None


def _sketch(schema: Any, root: Any, depth: int, room: list[int]) -> str:
    """'{k1, k2?}' for objects, '[...]' for arrays, '' for anything else. `room` is the characters left of the
    budget: once it runs out nothing more is expanded, so a wide, deep or self-referencing schema costs time
    in proportion to the budget, not to its size."""
    schema = _resolve(schema, root)
    if not isinstance(schema, dict) or depth > _MAX_DEPTH or room[0] <= 0:
        return ""
    props = schema.get("properties")
    if isinstance(props, dict) and props:
        required = schema.get("required") if isinstance(schema.get("required"), list) else []
        items = []
        for name, sub in props.items():
            if room[0] <= 0:
                break
            room[0] -= len(str(name)) + 3
            items.append(f"{name}{'' if name in required else '?'}{_sketch(sub, root, depth + 1, room)}")
        return "{" + ", ".join(items) + "}"
    items_schema = schema.get("items")
    if isinstance(items_schema, (dict, bool)) or "prefixItems" in schema:
        inner = _sketch(items_schema, root, depth + 1, room) if isinstance(items_schema, dict) else ""
        return f"[{inner}]"
    branch = _branch(schema)
    return _sketch(branch, root, depth + 1, room) if branch is not None else ""


def schema_sketch(schema: Any, budget: int = SKETCH_BUDGET) -> str:
    """The compact field list of a schema (a dict, JSON text, or True/False): the top-level keys with '?' on
    optional ones, nested objects in braces, arrays as '[]'. A schema with no object at its top gives its
    type ('string', 'array[...]', ...) or 'any'. Never raises for a well-formed JSON value."""
    if isinstance(schema, str):
        schema = json.loads(schema)
    text = _sketch(schema, schema, 0, [budget])
    if text.startswith("{"):
        text = text[1:-1]
    elif not text:
        kind = schema.get("type") if isinstance(schema, dict) else None
        text = kind if isinstance(kind, str) else "any"
    else:
        text = "array" + text if text.startswith("[") else text
    if len(text) > budget:
        text = text[: budget - 3].rsplit(",", 1)[0] + "..."
    return text


def format_prompt(request: str, sketch: str | None) -> str:
    """'Request: <text>\\nFields: <sketch>\\nAnswer: ' (the Fields line only when a schema is given)."""
    fields = f"Fields: {sketch}\n" if sketch is not None else ""
    return f"Request: {request}\n{fields}Answer: "
