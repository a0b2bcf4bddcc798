"""The server's bounds on what one request may cost before the engine sees it, with their defaults.

- body size (`--max-body-bytes`, 8 MiB): larger bodies get 413 before they are read in full;
- JSON nesting (MAX_JSON_DEPTH): deeper bodies get 400 (the decoder and every recursive walk after it would
  otherwise hit Python's recursion limit: a 500);
- prompt length in characters (`prompt_char_bound`): a prompt that cannot fit the model's context whatever
  its tokenization is refused (400 context_length_exceeded) before it is tokenised, so a 10 MB prompt costs
  milliseconds, not seconds of tokenizer time on the thread every request shares;
- queue time (`--max-queue-time`, 30 s): a request that has not reached the engine by then is dropped with 503
  and Retry-After instead of waiting without bound (serve/backend.py applies it).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dllm_constrain.errors import PromptTooLongError

DEFAULT_MAX_BODY_BYTES = 8 << 20
DEFAULT_MAX_QUEUE_TIME = 30.0
DEFAULT_SHUTDOWN_TIMEOUT = 20.0  # seconds (serve/shutdown.py); below Kubernetes' default grace period of 30 s
MAX_JSON_DEPTH = 100  # arrays/objects inside each other in a request body
NORMALIZER_SLACK = 2  # a normalizer may shorten the text (NFC composes pairs), so the bound allows twice as much


@dataclass(frozen=True)
class ServeLimits:
    """max_body_bytes: the largest request body; max_prompt_chars: the longest prompt text (None: no character
    bound, the tokenizer's count alone decides); max_queue_time: seconds a request may wait for the engine
    (None: unbounded)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_prompt_chars: int | None = None
    max_queue_time: float | None = DEFAULT_MAX_QUEUE_TIME

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ValueError("max_body_bytes must be >= 1")
        if self.max_prompt_chars is not None and self.max_prompt_chars < 1:
            raise ValueError("max_prompt_chars must be >= 1")
        if self.max_queue_time is not None and self.max_queue_time <= 0:
            raise ValueError("max_queue_time must be > 0")

    def check_prompt(self, prompt: str | Sequence[Mapping[str, Any]]) -> None:
        """PromptTooLongError when `prompt` (text, or chat messages for the checkpoint's own template: their contents
        counted together) has more characters than any prompt that fits the context."""
        if self.max_prompt_chars is None:
            return
        n = len(prompt) if isinstance(prompt, str) else sum(len(str(m.get("content") or "")) for m in prompt)
        if n > self.max_prompt_chars:
            raise PromptTooLongError(
                f"the prompt has {n} characters; no prompt over {self.max_prompt_chars} characters fits the "
                "model's context with this tokenizer")


def prompt_char_bound(llm: Any) -> int:
    """The most characters a prompt can have and still fit `llm`'s context: context tokens times the longest
    text one token stands for (the longest vocabulary entry in bytes, which is at least its length in characters;
    special tokens, matched whole in the text, by their own text), with slack for normalizers. Prompts over it need
    more tokens than the context holds, whatever the tokenizer does with them."""
    context = int(llm.engine.model.max_sequence_length)
    longest = 1
    for token_id, raw in enumerate(llm.tokenizer_info().token_bytes):
        if raw is None:  # a special token: its text
            text = llm.tokenizer.id_to_token(token_id)
            longest = max(longest, len(text) if isinstance(text, str) else 1)
        else:
            longest = max(longest, len(raw))
    return context * longest * NORMALIZER_SLACK


def json_depth(value: Any) -> int:
    """How deeply arrays and objects nest in `value` (0 for a scalar), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest
