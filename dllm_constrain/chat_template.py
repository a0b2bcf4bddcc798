"""A checkpoint's chat template: messages -> the prompt text an Instruct model was trained on.

Hugging Face instruct checkpoints (LLaDA-8B-Instruct, Dream-v0-Instruct-7B) ship a Jinja template as
`chat_template` in tokenizer_config.json, and their authors' demos always prompt through it
(`tokenizer.apply_chat_template(messages, add_generation_prompt=True)`): an Instruct model answers a bare prompt
poorly. This module renders it the way transformers does (a sandboxed Jinja environment with trim_blocks and
lstrip_blocks, the loop-control extension, `raise_exception`, a `tojson` filter, `strftime_now`, the tokenizer
config's special tokens as variables), with no hub access. The rendered text carries every special token the
template writes (e.g. the BOS), so it is encoded without the tokenizer's own post-processing, as
`apply_chat_template(..., tokenize=True)` encodes it.

`normalize_messages` is the one check of a conversation (role and text content per message) shared by the
Python API, the CLI and the server.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from dllm_constrain.errors import InvalidRequestError

__all__ = ["ChatTemplate", "is_conversation", "normalize_messages", "template_source"]

# end-of-turn tokens of the common chat formats: one the template writes ends an assistant turn, so it ends the
# answer too (Llama-3 / LLaDA-Instruct `<|eot_id|>`, ChatML / Dream `<|im_end|>`, Gemma `<end_of_turn>`, Phi `<|end|>`)
END_OF_TURN_TOKENS = ("<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>")


def is_conversation(x: Any) -> bool:
    """Whether `x` is one conversation: a non-empty list (or tuple) of message mappings."""
    return isinstance(x, (list, tuple)) and bool(x) and all(isinstance(m, Mapping) for m in x)


def _content_text(content: Any, where: str) -> str:
    """A message's content as text: a string, None (empty), or a list of {"type": "text", "text": ...} parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequestError(f"{where}: only text content parts are supported, got {kind!r}")
            parts.append(part["text"])
        return "".join(parts)
    raise InvalidRequestError(f"{where}: content must be a string or a list of text parts, got "
                              f"{type(content).__name__}")


def normalize_messages(messages: Sequence[Mapping[str, Any]], where: str = "messages") -> tuple[dict[str, Any], ...]:
    """The conversation with every message's content as text (other keys kept); InvalidRequestError naming the
    message for a missing role, non-text content or a conversation without any text."""
    out = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidRequestError(f"{where}[{i}] has no role (a string such as 'user')")
        out.append({**m, "content": _content_text(m.get("content"), f"{where}[{i}]")})
    if not any(m["content"].strip() for m in out):
        raise InvalidRequestError(f"{where}: no message has text content")
    return tuple(out)


def template_source(tokenizer_config: Mapping[str, Any]) -> str | None:
    """The chat template of a tokenizer_config.json (a named list picks "default", else its first), or None."""
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def _special_text(value: Any) -> str | None:
    if isinstance(value, Mapping):  # {"content": "<s>", ...} in older tokenizer configs
        value = value.get("content")
    return value if isinstance(value, str) else None


class ChatTemplate:
    """A compiled chat template and the special-token strings it is rendered with."""

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self._template = self._compile(source)

    @classmethod
    def from_tokenizer_config(cls, config: Mapping[str, Any]) -> "ChatTemplate | None":
        """The template of a tokenizer_config.json dict with its `*_token` entries as variables, or None."""
        source = template_source(config)
        if source is None:
            return None
        specials = {k: text for k, v in config.items() if k.endswith("_token")
                    and (text := _special_text(v)) is not None}
        return cls(source, specials)

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
        try:
            return env.from_string(source)
        except TemplateError as exc:
            from dllm_constrain.errors import CheckpointError

            raise CheckpointError(f"the checkpoint's chat template does not compile: {exc}") from None

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt text for `messages` (checked by `normalize_messages`); InvalidRequestError when the template
        refuses them (its raise_exception, e.g. roles out of order)."""
        from jinja2 import TemplateError

        plain = list(normalize_messages(messages))
        try:
            return self._template.render(messages=plain, add_generation_prompt=add_generation_prompt,
                                         **self.special_tokens)
        except (TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            # the template's own raise_exception, or its code tripping over what a message holds (a field of an
            # unexpected type): either way these messages, not the server, are at fault
            raise InvalidRequestError(f"the checkpoint's chat template refused the messages: {exc}") from None

    def end_of_turn_tokens(self) -> tuple[str, ...]:
        """The well-known end-of-turn tokens this template writes (they end an assistant's answer)."""
        return tuple(t for t in END_OF_TURN_TOKENS if t in self.source)
