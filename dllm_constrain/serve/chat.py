"""Chat messages -> the prompt handed to `LLM.generate`.

An LLM that prompts through its checkpoint's chat template (`prompt_format="chat"`, the default for a checkpoint
whose tokenizer_config.json has a `chat_template`, as LLaDA-8B-Instruct's and Dream-v0-Instruct-7B's do) gets the
messages themselves: it renders them on the same code path as `LLM.generate(messages)`, `dc.generate` and the CLI
(dllm_constrain.chat_template). An LLM prompted raw whose checkpoint ships a template gets the rendered text
(the same renderer); one prompted in this project's request format (the bundled model, which was trained on single
requests and wraps the prompt itself), or without a template, gets the user messages' text joined by newlines.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dllm_constrain.chat_template import ChatTemplate, normalize_messages
from dllm_constrain.errors import InvalidRequestError
from dllm_constrain.serve.errors import BadRequest


class ChatFormatter:
    """Renders a conversation into the prompt handed to the LLM (see the module docstring)."""

    def __init__(self, template: str | None = None, special_tokens: dict[str, str] | None = None,
                 strip_prefix: str = "", *, pass_messages: bool = False) -> None:
        """template: a Jinja chat template (None: join the user messages). special_tokens: bos_token, eos_token...
        passed to the template. strip_prefix: removed from the start of the rendered text (the BOS the tokenizer
        adds again when encoding, so the prompt does not start with two). pass_messages: hand the checked
        messages to the LLM, which renders them itself (an LLM with prompt_format="chat")."""
        self.template_source = template
        self.special_tokens = dict(special_tokens or {})
        self.strip_prefix = strip_prefix
        self.pass_messages = pass_messages
        self._template = ChatTemplate(template, special_tokens) if template is not None else None

    @classmethod
    def for_llm(cls, llm: Any) -> "ChatFormatter":
        """The formatter for a loaded `LLM`: the messages themselves for one that renders its chat template, the
        rendered template for one prompted raw whose checkpoint has a template, else the joined user messages."""
        if getattr(llm, "prompt_format", "raw") == "chat":
            return cls(pass_messages=True)
        path = getattr(llm, "path", None)
        if getattr(llm, "prompt_format", "raw") == "request" or path is None:
            return cls()
        config_file = Path(path) / "tokenizer_config.json"
        if not config_file.is_file():
            return cls()
        template = ChatTemplate.from_tokenizer_config(json.loads(config_file.read_text()))
        if template is None:
            return cls()
        bos = template.special_tokens.get("bos_token", "")
        strip = ""
        if bos:
            bos_id = llm.tokenizer.token_to_id(bos)
            ids = llm.encode("a")
            if bos_id is not None and ids and ids[0] == bos_id:
                strip = bos
        return cls(template.source, template.special_tokens, strip)

    def render(self, messages: Sequence[dict[str, Any]]) -> Any:
        """The prompt for `messages` (dicts with role and content): text, or with `pass_messages` the checked
        messages (a tuple of dicts); BadRequest when there is nothing to answer."""
        if not messages:
            raise BadRequest("messages must not be empty", param="messages")
        try:
            checked = normalize_messages(messages)  # content as text, one check for every path
            if self.pass_messages:
                return checked
            if self._template is None:
                text = "\n".join(m["content"] for m in checked if m["role"] == "user" and m["content"].strip())
                if not text:
                    raise BadRequest("no user message with text content", param="messages")
                return text
            text = self._template.render(checked)
        except InvalidRequestError as exc:
            raise BadRequest(str(exc), param="messages") from None
        if self.strip_prefix and text.startswith(self.strip_prefix):
            text = text[len(self.strip_prefix):]
        return text
