"""The prompt format shared by training and inference; one function so the two can never drift apart.

The bundled model was trained on exactly this layout; the tokenizer adds BOS itself (post-processor).
"""
from __future__ import annotations

import json
from typing import Any


def schema_to_prompt_json(schema: dict[str, Any] | str) -> str:
    """Compact JSON of a schema, the way the training data shows it."""
    if isinstance(schema, str):
        schema = json.loads(schema)
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def format_prompt(request: str, schema_json: str | None) -> str:
    """'Schema: <compact schema>\\nRequest: <text>\\nAnswer: ' (the schema line only when a schema is given)."""
    head = f"Schema: {schema_json}\n" if schema_json is not None else ""
    return f"{head}Request: {request}\nAnswer: "
