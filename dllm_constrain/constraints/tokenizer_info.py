"""What the constraint layer needs to know about a tokenizer: the bytes of every token, which ids are
special (never produced by a constraint), and the explicit EOS and mask ids.

Byte-level BPE vocabularies (GPT-2 / Llama-3 / Qwen style) store tokens through the GPT-2
`bytes_to_unicode` table; SentencePiece-style vocabularies use `▁` for a space and `<0xAB>` byte-fallback
tokens. Both are decoded to raw bytes here. Special added tokens get `None` (never allowed; EOS is
handled by the canvas logic, not as text).

The token trie (`trie()`) is built once per TokenizerInfo and cached on it; `TokenizerInfo.from_tokenizer`
caches instances per (path, ids), so every constraint compiled for the same tokenizer shares one trie.
"""
from __future__ import annotations

from bisect import bisect_left

import functools
import hashlib
import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import _cwalk
from ._cwalk import PreorderTrie
from .class_split import ClassSplit


@functools.lru_cache(maxsize=1)
def gpt2_byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable stand-in character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


@dataclass
class TokenTrie:
    """Byte trie of the vocabulary in level order.

    Node 0 is the root; the nodes of depth d occupy [level_start[d], level_start[d+1]), sorted by
    (parent, byte), so a node's children are contiguous: [child_start[p], child_end[p]).
    `token_node[t]` is the node spelling token t, or `n_nodes` (a sentinel that is always dead) for
    tokens without bytes (specials) and for ids past the tokenizer's vocabulary."""

    parent: np.ndarray  # int32 [n_nodes]  (parent[0] = 0)
    byte: np.ndarray  # int32 [n_nodes]
    level_start: list[int]
    child_start: np.ndarray  # int32 [n_nodes]
    child_end: np.ndarray  # int32 [n_nodes]
    token_node: np.ndarray  # int32 [vocab_size]
    node_token: np.ndarray  # int32 [n_nodes + 1]: a token spelled by the node, -1 if none
    dup_nodes: np.ndarray  # int32: nodes spelling more than one token ...
    dup_tokens: np.ndarray  # int32: ... and the extra tokens
    n_nodes: int
    max_depth: int
    max_token_len: int


class TokenizerInfo:
    """Token bytes + special ids. `vocab_size` is the width of the model's logits (>= len(token_bytes))."""

    def __init__(
        self,
        token_bytes: Sequence[bytes | None],
        eos_id: int,
        mask_id: int | None = None,
        special_ids: Sequence[int] = (),
        vocab_size: int | None = None,
        name: str = "",
    ):
        tb = list(token_bytes)
        vocab_size = len(tb) if vocab_size is None else int(vocab_size)
        if vocab_size < len(tb):
            raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {len(tb)} tokens")
        if not 0 <= eos_id < vocab_size:
            raise ValueError(f"eos_id {eos_id} outside the vocabulary")
        specials = set(int(i) for i in special_ids)
        specials.add(int(eos_id))
        if mask_id is not None:
            specials.add(int(mask_id))
        for i in specials:
            if i < len(tb):
                tb[i] = None
        for i, b in enumerate(tb):
            if b is not None and len(b) == 0:
                tb[i] = None
        self.token_bytes: list[bytes | None] = tb
        self.eos_id = int(eos_id)
        self.mask_id = None if mask_id is None else int(mask_id)
        self.special_ids = frozenset(specials)
        self.vocab_size = vocab_size
        self.name = name
        h = hashlib.sha256()
        h.update(repr((self.eos_id, self.mask_id, sorted(self.special_ids), vocab_size)).encode())
        for b in tb:
            h.update(b"\x00N" if b is None else len(b).to_bytes(2, "little") + b)
        self.fingerprint = h.hexdigest()[:16]
        self._trie: TokenTrie | None = None
        self._pre = None
        self._split = None
        self._byte_set: frozenset[bytes] | None = None
        self._sorted_bytes: list[bytes] | None = None
        self._singles: bool | None = None
        self._max_len: int | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"TokenizerInfo({self.name or 'custom'}, tokens={len(self.token_bytes)}, vocab_size={self.vocab_size}, "
                f"eos_id={self.eos_id}, mask_id={self.mask_id})")

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_tokenizer(
        cls,
        tokenizer,
        eos_id: int | None = None,
        mask_id: int | None = None,
        special_ids: Sequence[int] | None = None,
        vocab_size: int | None = None,
    ) -> "TokenizerInfo":
        """From a tokenizer.json path (or its folder), a `tokenizers.Tokenizer`, a transformers fast
        tokenizer, or an object with `token_bytes()` (the engine's Tokenizer wrapper).

        eos_id defaults to the tokenizer's declared EOS (tokenizer_config.json / the wrapper's eos_id);
        special_ids defaults to every special added token."""
        if isinstance(tokenizer, (str, os.PathLike)):
            return cls.from_tokenizer_json(tokenizer, eos_id=eos_id, mask_id=mask_id, special_ids=special_ids,
                                           vocab_size=vocab_size)
        if hasattr(tokenizer, "token_bytes") and callable(tokenizer.token_bytes):
            tb = tokenizer.token_bytes()
            if eos_id is None:
                eos_id = getattr(tokenizer, "eos_id", None)
                if eos_id is None:
                    eos_id = getattr(tokenizer, "eos_token_id", None)
            if mask_id is None:
                mask_id = getattr(tokenizer, "mask_id", None)
            if special_ids is None:
                special_ids = list(getattr(tokenizer, "special_ids", ()) or ())
            if eos_id is None:
                raise ValueError("eos_id is required")
            return cls(tb, eos_id, mask_id, special_ids, vocab_size, name=type(tokenizer).__name__)
        # transformers fast tokenizer -> its backend tokenizers.Tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            if eos_id is None:
                eos_id = getattr(tokenizer, "eos_token_id", None)
            if special_ids is None:
                special_ids = list(getattr(tokenizer, "all_special_ids", []) or [])
            tokenizer = backend
        if hasattr(tokenizer, "to_str"):
            return cls.from_tokenizers(tokenizer, eos_id=eos_id, mask_id=mask_id, special_ids=special_ids,
                                       vocab_size=vocab_size)
        raise TypeError(f"cannot read token bytes from {type(tokenizer).__name__}")

    @classmethod
    def from_tokenizer_json(cls, path, eos_id=None, mask_id=None, special_ids=None, vocab_size=None):
        path = os.fspath(path)
        folder = path if os.path.isdir(path) else os.path.dirname(path)
        tj_path = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        st = os.stat(tj_path)
        key = (os.path.realpath(tj_path), st.st_size, st.st_mtime_ns, eos_id, mask_id,
               None if special_ids is None else tuple(sorted(special_ids)), vocab_size)
        with _CACHE_LOCK:
            hit = _INFO_CACHE.get(key)
        if hit is not None:
            return hit
        with open(tj_path, encoding="utf-8") as f:
            tj = json.load(f)
        if eos_id is None:
            eos_id = _eos_from_config(folder, tj)
        info = cls._from_json_obj(tj, eos_id, mask_id, special_ids, vocab_size, name=tj_path)
        with _CACHE_LOCK:
            _INFO_CACHE[key] = info
        return info

    @classmethod
    def from_tokenizers(cls, tok, eos_id=None, mask_id=None, special_ids=None, vocab_size=None):
        tj = json.loads(tok.to_str())
        if eos_id is None:
            eos_id = _eos_from_config(None, tj)
        return cls._from_json_obj(tj, eos_id, mask_id, special_ids, vocab_size, name="tokenizers.Tokenizer")

    @classmethod
    def _from_json_obj(cls, tj: dict, eos_id, mask_id, special_ids, vocab_size, name: str):
        tb, specials = decode_vocab(tj)
        if special_ids is None:
            special_ids = specials
        if eos_id is None:
            raise ValueError("eos_id is required (no EOS declared by the tokenizer)")
        return cls(tb, eos_id, mask_id, special_ids, vocab_size, name=name)

    # ------------------------------------------------------------------ trie
    def trie(self) -> TokenTrie:
        if self._trie is None:
            with self._lock:
                if self._trie is None:
                    self._trie = _build_trie(self.token_bytes, self.vocab_size)
        return self._trie


    def max_token_len(self) -> int:
        if self._max_len is None:
            self._max_len = max((len(b) for b in self.token_bytes if b), default=1)
        return self._max_len

    def single_byte_complete(self) -> bool:
        """Every byte value is a token on its own."""
        if self._singles is None:
            self._singles = len({b[0] for b in self.token_bytes if b is not None and len(b) == 1}) == 256
        return self._singles

    def byte_set(self) -> frozenset[bytes]:
        """The set of token byte strings (for longest-match tokenization)."""
        if self._byte_set is None:
            self._byte_set = frozenset(b for b in self.token_bytes if b)
        return self._byte_set

    def is_token_prefix(self, data: bytes) -> bool:
        """Whether some token's bytes start with `data` (binary search over the sorted token byte strings: the
        first string >= data is the one that would start with it)."""
        sb = self._sorted_bytes
        if sb is None:
            sb = self._sorted_bytes = sorted(self.byte_set())
        i = bisect_left(sb, data)
        return i < len(sb) and sb[i].startswith(data)

    def preorder_trie(self):
        """The trie in DFS preorder for the C walker (built once, cached)."""
        if self._pre is None:
            with self._lock:
                if self._pre is None:
                    self._pre = PreorderTrie(self.token_bytes, self.vocab_size)
        return self._pre

    def prepare(self) -> "TokenizerInfo":
        """Build now every table the constraint layer builds once per tokenizer on first use (the tries, the split by
        byte class, the sorted token bytes): about a second for a 128K vocabulary, paid here rather than by the
        first request that needs each table. Returns self."""
        self.trie()
        self.is_token_prefix(b"")  # the sorted token bytes (and the set of them)
        if _cwalk.load() is not None:
            self.preorder_trie()
            self.class_split()
        return self

    def class_split(self):
        """The vocabulary split by the JSON-string byte class, for the C walker (class_split.py; built once, cached)."""
        if self._split is None:
            with self._lock:
                if self._split is None:
                    self._split = ClassSplit(self.token_bytes, self.vocab_size)
        return self._split


_INFO_CACHE: dict = {}
_CACHE_LOCK = threading.Lock()


def _eos_from_config(folder: str | None, tj: dict) -> int | None:
    added = {a["content"]: a["id"] for a in tj.get("added_tokens", [])}
    if folder:
        for fn in ("tokenizer_config.json", "special_tokens_map.json"):
            p = os.path.join(folder, fn)
            if os.path.exists(p):
                with open(p, encoding="utf-8") as f:
                    cfg = json.load(f)
                eos = cfg.get("eos_token")
                if isinstance(eos, dict):
                    eos = eos.get("content")
                if eos in added:
                    return added[eos]
                vocab = tj.get("model", {}).get("vocab", {})
                if isinstance(vocab, dict) and eos in vocab:
                    return vocab[eos]
    for name in ("<|end_of_text|>", "<|endoftext|>", "</s>", "<|eot_id|>", "<eos>", "<|im_end|>"):
        if name in added:
            return added[name]
    return None


def decode_vocab(tj: dict) -> tuple[list[bytes | None], list[int]]:
    """tokenizer.json -> (bytes per id, special ids)."""
    model = tj.get("model", {})
    vocab = model.get("vocab", {})
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        items = [(p[0], i) for i, p in enumerate(vocab)]
    else:
        items = list(vocab.items())
    added = tj.get("added_tokens", [])
    size = max([i for _, i in items] + [a["id"] for a in added] + [-1]) + 1
    tb: list[bytes | None] = [None] * size
    decoder = json.dumps(tj.get("decoder")) + json.dumps(tj.get("pre_tokenizer"))
    byte_level = "ByteLevel" in decoder
    if byte_level:
        table = {ord(c): b for c, b in gpt2_byte_decoder().items()}
        for s, i in items:
            try:
                tb[i] = s.translate(table).encode("latin-1")
            except UnicodeEncodeError:
                tb[i] = s.encode("utf-8")
    else:
        byte_fallback = bool(model.get("byte_fallback")) or "ByteFallback" in decoder
        for s, i in items:
            if byte_fallback and len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
                try:
                    tb[i] = bytes([int(s[3:5], 16)])
                    continue
                except ValueError:
                    pass
            tb[i] = s.replace("\u2581", " ").encode("utf-8")
    specials = []
    for a in added:
        if a.get("special", False):
            tb[a["id"]] = None
            specials.append(a["id"])
        else:
            tb[a["id"]] = a["content"].encode("utf-8")
    return tb, specials


def _build_trie(token_bytes: Sequence[bytes | None], vocab_size: int) -> TokenTrie:
    prefixes: set[bytes] = set()
    maxlen = 0
    for b in token_bytes:
        if b:
            if len(b) > maxlen:
                maxlen = len(b)
            for k in range(1, len(b) + 1):
                prefixes.add(b[:k])
    ordered = sorted(prefixes)
    ordered.sort(key=len)  # stable: level order, lexicographic within a level
    n = len(ordered) + 1
    index = {b"": 0}
    parent = np.zeros(n, dtype=np.int32)
    byte = np.zeros(n, dtype=np.int32)
    level_start = [0, 1]
    cur_len = 1
    par_list = [0] * n
    byte_list = [0] * n
    for k, p in enumerate(ordered, start=1):
        if len(p) != cur_len:
            level_start.append(k)
            cur_len = len(p)
        index[p] = k
        par_list[k] = index[p[:-1]]
        byte_list[k] = p[-1]
    level_start.append(n)
    parent[:] = par_list
    byte[:] = byte_list
    # children ranges (children of p are contiguous because levels are sorted by (parent, byte))
    child_start = np.zeros(n, dtype=np.int32)
    child_end = np.zeros(n, dtype=np.int32)
    if n > 1:
        # level order sorted by (parent, byte) makes parent[1:] non-decreasing
        pk = parent[1:]
        nodes = np.arange(n, dtype=np.int32)
        child_start[:] = np.searchsorted(pk, nodes, side="left") + 1
        child_end[:] = np.searchsorted(pk, nodes, side="right") + 1
    token_node = np.full(vocab_size, n, dtype=np.int32)
    node_token = np.full(n + 1, -1, dtype=np.int32)
    dup_n: list[int] = []
    dup_t: list[int] = []
    for t, b in enumerate(token_bytes):
        if b:
            k = index[b]
            token_node[t] = k
            if node_token[k] < 0:
                node_token[k] = t
            else:
                dup_n.append(k)
                dup_t.append(t)
    return TokenTrie(parent=parent, byte=byte, level_start=level_start, child_start=child_start,
                     child_end=child_end, token_node=token_node, node_token=node_token,
                     dup_nodes=np.array(dup_n, dtype=np.int32), dup_tokens=np.array(dup_t, dtype=np.int32),
                     n_nodes=n, max_depth=len(level_start) - 2, max_token_len=maxlen)
