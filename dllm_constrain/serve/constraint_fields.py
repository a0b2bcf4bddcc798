"""What the OpenAI / vLLM structured-output fields mean as this project's constraints, shared by the server
(serve/protocol.py) and the vLLM plugin (vllm_plugin/core.py) so that both read a request the same way.

Schemas themselves (a dict or JSON text) are normalised by the library (`LLM.compile` / `normalize_schema_input`),
not here.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

# `response_format: {"type": "json_object"}` / `structured_outputs.json_object`: any JSON object, compiled with the
# JSON Schema specification's semantics (not the strict narrowings).
JSON_OBJECT_SCHEMA: dict = {"type": "object"}


def choice_regex(choices: Sequence[str]) -> str:
    """`guided_choice` / `structured_outputs.choice`: the regex whose full matches are exactly the given strings."""
    return "|".join(re.escape(c) for c in choices)
