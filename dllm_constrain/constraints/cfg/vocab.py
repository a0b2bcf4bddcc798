"""Token lookup by bytes: turning a grammar's completion bytes into tokens of one vocabulary.

Shared by every grammar compiled against the same tokenizer (one table per TokenizerInfo, held weakly).
"""
from __future__ import annotations

import threading
import weakref

from ..bounds import INF
from ..tokenizer_info import TokenizerInfo


class Vocab:
    """Token lookup by bytes, for turning completion bytes into tokens (min count or an exact count)."""

    def __init__(self, tok: TokenizerInfo):
        self.by_bytes: dict[bytes, int] = {}
        prefixes: set[bytes] = set()
        maxlen = 0
        for i, b in enumerate(tok.token_bytes):
            if b and b not in self.by_bytes:
                self.by_bytes[b] = i
                maxlen = max(maxlen, len(b))
                for k in range(1, len(b)):
                    prefixes.add(b[:k])
        prefixes.update(self.by_bytes)
        self.prefixes = prefixes
        self.maxlen = maxlen
        self.single_bytes = all(bytes([x]) in self.by_bytes for x in range(256))

    def _edges(self, data: bytes, i: int):
        pre, byb = self.prefixes, self.by_bytes
        for L in range(1, min(self.maxlen, len(data) - i) + 1):
            piece = data[i:i + L]
            if piece not in pre:
                break
            t = byb.get(piece)
            if t is not None:
                yield L, t

    def segment_min(self, data: bytes) -> list[int] | None:
        n = len(data)
        best = [INF] * (n + 1)
        back: list[tuple[int, int]] = [(-1, -1)] * (n + 1)
        best[0] = 0
        for i in range(n):
            if best[i] >= INF:
                continue
            for L, t in self._edges(data, i):
                if best[i] + 1 < best[i + L]:
                    best[i + L] = best[i] + 1
                    back[i + L] = (i, t)
        if best[n] >= INF:
            return None
        out = []
        j = n
        while j > 0:
            i, t = back[j]
            out.append(t)
            j = i
        out.reverse()
        return out


_VOCABS: "weakref.WeakKeyDictionary[TokenizerInfo, Vocab]" = weakref.WeakKeyDictionary()
_VLOCK = threading.Lock()


def vocab_for(tok: TokenizerInfo) -> Vocab:
    with _VLOCK:
        v = _VOCABS.get(tok)
        if v is None:
            v = Vocab(tok)
            _VOCABS[tok] = v
        return v


__all__ = ["Vocab", "vocab_for"]
