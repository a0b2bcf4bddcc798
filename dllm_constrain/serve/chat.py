"""Chat messages -> the prompt text handed to `LLM.generate`.

A checkpoint that ships a chat template (`chat_template` in its tokenizer_config.json, as Hugging Face instruct
checkpoints such as LLaDA-8B-Instruct do) is prompted through it, rendered the way transformers'
`apply_chat_template` renders it (sandboxed Jinja, trim_blocks/lstrip_blocks, `add_generation_prompt=True`).
A checkpoint without one, or one that `LLM` prompts in this project's request format (the bundled model, which
was trained on single requests and wraps the prompt itself), gets the user messages' text joined by newlines.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from dllm_constrain.serve.errors import BadRequest


def message_text(content: Any, index: int) -> str:
    """A message's content as text: a string, or a list of text parts (other part types are refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise BadRequest(f"messages[{index}]: only text content parts are supported, got {kind!r}",
                             param=f"messages[{index}].content")
        parts.append(part["text"])
    return "".join(parts)


def _special_token(value: Any) -> str:
    if isinstance(value, dict):  # {"content": "<s>", ...} in older tokenizer configs
        value = value.get("content")
    return value if isinstance(value, str) else ""


class ChatFormatter:
    """Renders a conversation into one prompt string (see the module docstring)."""

    def __init__(self, template: str | None = None, special_tokens: dict[str, str] | None = None,
                 strip_prefix: str = "") -> None:
        """template: a Jinja chat template (None: join the user messages). special_tokens: bos_token, eos_token...
        passed to the template. strip_prefix: removed from the start of the rendered text (the BOS the tokenizer
        adds again when encoding, so the prompt does not start with two)."""
        self.template_source = template
        self.special_tokens = dict(special_tokens or {})
        self.strip_prefix = strip_prefix
        self._template = self._compile(template) if template is not None else None

    @staticmethod
    def _compile(source: str) -> Any:
        from jinja2 import TemplateError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
                   sort_keys: bool = False) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(source)

    @classmethod
    def for_llm(cls, llm: Any) -> "ChatFormatter":
        """The formatter for a loaded `LLM`: its checkpoint's chat template when it has one and is prompted raw."""
        path = getattr(llm, "path", None)
        if getattr(llm, "prompt_format", "raw") == "request" or path is None:
            return cls()
        config_file = Path(path) / "tokenizer_config.json"
        if not config_file.is_file():
            return cls()
        config = json.loads(config_file.read_text())
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if not isinstance(template, str):
            return cls()
        specials = {k: _special_token(v) for k, v in config.items() if k.endswith("_token")}
        bos = specials.get("bos_token", "")
        strip = ""
        if bos:
            bos_id = llm.tokenizer.token_to_id(bos)
            ids = llm.encode("a")
            if bos_id is not None and ids and ids[0] == bos_id:
                strip = bos
        return cls(template, specials, strip)

    def render(self, messages: Sequence[dict[str, Any]]) -> str:
        """The prompt for `messages` (dicts with role and content); BadRequest when there is nothing to answer."""
        if not messages:
            raise BadRequest("messages must not be empty", param="messages")
        if self._template is None:
            users = [message_text(m.get("content"), i) for i, m in enumerate(messages) if m.get("role") == "user"]
            text = "\n".join(u for u in users if u.strip())
            if not text:
                raise BadRequest("no user message with text content", param="messages")
            return text
        from jinja2 import TemplateError

        plain = [{**m, "content": message_text(m.get("content"), i)} for i, m in enumerate(messages)]
        try:
            text = self._template.render(messages=plain, add_generation_prompt=True, **self.special_tokens)
        except TemplateError as exc:
            raise BadRequest(f"the checkpoint's chat template refused the messages: {exc}", param="messages") from None
        if self.strip_prefix and text.startswith(self.strip_prefix):
            text = text[len(self.strip_prefix):]
        return text
