"""A `tokenizer.json` wrapper with the special ids the engine needs, and the raw bytes of every token.

Special ids (bos, eos, pad, mask) are resolved per role, first hit wins:
  1. config.json `<role>_token_id` (top level, then `text_config`; a list of eos ids gives its first id),
  2. tokenizer_config.json `<role>_token`, then special_tokens_map.json `<role>_token` (string or
     {"content": ...}), looked up in the vocabulary,
  3. well-known token names (LLaDA `<|mdm_mask|>`, Dream `<|mask|>`, `<|endoftext|>`, `<|eot_id|>`, `<eos>`, ...).
A missing pad falls back to eos. A role that resolves nowhere is None (the model config may still supply it).

Stop ids (`stop_ids`): every id of an `eos_token_id` list in config.json (top level or text_config) and in
generation_config.json (an int or a list), the resolved eos first. The checkpoint's tokenizer_config.json is kept
as `tokenizer_config` (its chat template is rendered by dllm_constrain.chat_template).

`token_bytes()` is what the constraint compiler consumes: the exact bytes a token contributes to the decoded
text. Byte-level BPE (GPT-2/Llama-3/Qwen layout) inverts the GPT-2 bytes-to-unicode table; SentencePiece-style
tokenizers (Metaspace or Replace('▁', ' ') decoders, ByteFallback `<0xAB>` tokens) map '▁' to a space and byte
tokens to their byte. Decode-time artefacts at the very start of a text (Strip of the first space, Metaspace's
prepended space) are NOT applied: a token's bytes are the same wherever it stands.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import tokenizers

from dllm_constrain.errors import CheckpointError

ROLES = ("bos", "eos", "pad", "mask")

# Tried in order when neither config.json nor the tokenizer configs name the token.
WELL_KNOWN: dict[str, tuple[str, ...]] = {
    "mask": ("<|mdm_mask|>", "<|mask|>", "<mask>", "[MASK]"),
    "eos": ("<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|eos|>", "<eos>", "</s>"),
    "bos": ("<|begin_of_text|>", "<|startoftext|>", "<|bos|>", "<bos>", "<s>"),
    "pad": ("<|pad|>", "<pad>", "[PAD]"),
}

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the printable stand-in character of each byte -> the byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path.name} is not valid JSON: {exc}") from exc


def _token_content(value: Any) -> str | None:
    """A tokenizer_config / special_tokens_map entry: "<tok>" or {"content": "<tok>", ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _config_id(config: Mapping[str, Any], role: str) -> int | None:
    """`<role>_token_id` from config.json, top level first, then a nested text_config (DiffusionGemma)."""
    for scope in (config, config.get("text_config") or {}):
        value = scope.get(f"{role}_token_id") if isinstance(scope, Mapping) else None
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _id_list(config: Mapping[str, Any], key: str) -> list[int]:
    """Every id of `key` (an int or a list of ints) at the top level of a config and in its text_config."""
    out: list[int] = []
    for scope in (config, config.get("text_config") or {}):
        value = scope.get(key) if isinstance(scope, Mapping) else None
        values = value if isinstance(value, list) else [value]
        out += [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return out


def _flatten(component: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """A decoder/pre-tokenizer JSON node as a flat list (Sequence nodes expanded)."""
    if not component:
        return []
    if component.get("type") == "Sequence":
        children = component.get("decoders") or component.get("pretokenizers") or []
        return [leaf for child in children for leaf in _flatten(child)]
    return [component]


class Tokenizer:
    """tokenizer.json plus the special ids; see the module docstring for how they are resolved.

    `Tokenizer(folder)` reads folder/tokenizer.json and the configs beside it; `Tokenizer(file, config)` reads
    one tokenizer.json with an explicit config.json dict; `Tokenizer(backend, config)` wraps a
    `tokenizers.Tokenizer`.
    """

    def __init__(
        self,
        source: str | Path | tokenizers.Tokenizer,
        config: Mapping[str, Any] | None = None,
        *,
        tokenizer_config: Mapping[str, Any] | None = None,
        special_tokens_map: Mapping[str, Any] | None = None,
    ) -> None:
        self.path: Path | None = None
        generation_config: Mapping[str, Any] = {}
        if isinstance(source, tokenizers.Tokenizer):
            backend = source
        else:
            path = Path(source)
            if path.is_dir():
                folder = path
                path = folder / "tokenizer.json"
                if config is None and (folder / "config.json").is_file():
                    config = _read_json(folder / "config.json")
                if tokenizer_config is None and (folder / "tokenizer_config.json").is_file():
                    tokenizer_config = _read_json(folder / "tokenizer_config.json")
                if special_tokens_map is None and (folder / "special_tokens_map.json").is_file():
                    special_tokens_map = _read_json(folder / "special_tokens_map.json")
                if (folder / "generation_config.json").is_file():
                    generation_config = _read_json(folder / "generation_config.json")
            if not path.is_file():
                raise CheckpointError(f"tokenizer.json not found: {path}")
            try:
                backend = tokenizers.Tokenizer.from_file(str(path))
            except Exception as exc:  # tokenizers raises a bare Exception on malformed files
                raise CheckpointError(f"{path.name} cannot be parsed by `tokenizers`: {exc}") from exc
            self.path = path
        self.backend: tokenizers.Tokenizer = backend
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        ids = {role: self._resolve(role, config or {}, tokenizer_config or {}, special_tokens_map or {})
               for role in ROLES}
        if ids["pad"] is None:
            ids["pad"] = ids["eos"]
        self.bos_id: int | None = ids["bos"]
        self.eos_id: int | None = ids["eos"]
        self.pad_id: int | None = ids["pad"]
        self.mask_id: int | None = ids["mask"]
        self.tokenizer_config: dict[str, Any] = dict(tokenizer_config or {})
        listed = [*_id_list(config or {}, "eos_token_id"), *_id_list(generation_config, "eos_token_id")]
        ordered = ([self.eos_id] if self.eos_id is not None else []) + listed
        self.stop_ids: tuple[int, ...] = tuple(dict.fromkeys(t for t in ordered if 0 <= t < self.vocab_size))

    # ------------------------------------------------------------------ special ids
    def _resolve(self, role: str, config: Mapping[str, Any], tokenizer_config: Mapping[str, Any],
                 special_tokens_map: Mapping[str, Any]) -> int | None:
        found = _config_id(config, role)
        if found is not None:
            return found
        for source in (tokenizer_config, special_tokens_map):
            content = _token_content(source.get(f"{role}_token"))
            if content is not None and self.backend.token_to_id(content) is not None:
                return self.backend.token_to_id(content)
        for name in WELL_KNOWN[role]:
            tid = self.backend.token_to_id(name)
            if tid is not None:
                return tid
        return None

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of the added tokens marked special (skipped by decode) plus the resolved role ids."""
        added = {i for i, tok in self.backend.get_added_tokens_decoder().items() if tok.special}
        roles = {i for i in (self.bos_id, self.eos_id, self.pad_id, self.mask_id) if i is not None}
        return frozenset(added | roles)

    # ------------------------------------------------------------------ text <-> ids
    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of text; add_special=True runs the tokenizer's post-processor (e.g. prepends BOS)."""
        return self.backend.encode(text, add_special_tokens=add_special).ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ids with special tokens (and ids beyond the tokenizer's vocabulary) left out."""
        special = self.special_ids
        kept = [int(i) for i in ids if 0 <= int(i) < self.vocab_size and int(i) not in special]
        return self.backend.decode(kept, skip_special_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def save(self, path: str | Path) -> None:
        """Write tokenizer.json (the backend's own serialisation)."""
        self.backend.save(str(path))

    # ------------------------------------------------------------------ token bytes
    def token_bytes(self, size: int | None = None) -> list[bytes | None]:
        """Raw bytes of each token id (index = id); None for special/added tokens and unused ids.

        size pads (with None) or truncates the list to a model's vocabulary size, which is often larger than
        the tokenizer's. Raises CheckpointError for decoders whose token text is not recoverable per token
        (e.g. WordPiece), rather than guessing.
        """
        spec = json.loads(self.backend.to_str())
        decoders = _flatten(spec.get("decoder"))
        kinds = {d.get("type") for d in decoders}
        if not decoders:  # no decoder: infer the layout from the pre-tokenizer
            kinds = {p.get("type") for p in _flatten(spec.get("pre_tokenizer"))} & {"ByteLevel", "Metaspace"}
        unsupported = kinds - {"ByteLevel", "Metaspace", "Replace", "ByteFallback", "Fuse", "Strip"}
        if unsupported or not kinds:
            raise CheckpointError(f"token_bytes: unsupported tokenizer decoder {sorted(map(str, unsupported)) or None}")
        added = set(self.backend.get_added_tokens_decoder())
        n = self.vocab_size if size is None else size
        out: list[bytes | None] = [None] * n
        if "ByteLevel" in kinds:
            table = gpt2_unicode_to_byte()
            for tid in range(min(n, self.vocab_size)):
                tok = self.backend.id_to_token(tid)
                if tok is None or tid in added:
                    continue
                try:
                    out[tid] = bytes(table[c] for c in tok)
                except KeyError:
                    out[tid] = None  # not a byte-level symbol string: cannot stand for raw bytes
            return out
        byte_fallback = "ByteFallback" in kinds or bool(spec.get("model", {}).get("byte_fallback"))
        replacements = self._replacements(decoders)
        for tid in range(min(n, self.vocab_size)):
            tok = self.backend.id_to_token(tid)
            if tok is None or tid in added:
                continue
            m = _BYTE_TOKEN.fullmatch(tok) if byte_fallback else None
            if m is not None:
                out[tid] = bytes([int(m.group(1), 16)])
                continue
            for pattern, content in replacements:
                tok = pattern.sub(content, tok)
            out[tid] = tok.encode("utf-8")
        return out

    @staticmethod
    def _replacements(decoders: Sequence[Mapping[str, Any]]) -> list[tuple[re.Pattern[str], str]]:
        """Replace/Metaspace decoders as (pattern, replacement) pairs, applied in decoder order."""
        out: list[tuple[re.Pattern[str], str]] = []
        for d in decoders:
            if d.get("type") == "Metaspace":
                out.append((re.compile(re.escape(d.get("replacement", "▁"))), " "))
            elif d.get("type") == "Replace":
                pattern = d.get("pattern", {})
                regex = re.escape(pattern["String"]) if "String" in pattern else pattern.get("Regex", "")
                out.append((re.compile(regex), d.get("content", "").replace("\\", "\\\\")))
        if not out:  # Metaspace pre-tokenizer without a decoder entry: '▁' still means a space
            out.append((re.compile("▁"), " "))
        return out
