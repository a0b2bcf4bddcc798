"""The vocabulary split by one byte class, so that a state looping on the class is walked over a small trie.

The token walks that visit the whole trie are mostly those of states inside a JSON string (or a `.*`): every printable
ASCII byte but the quote and the backslash takes such a state s to one same state u_1 (s itself, or the next state of
a counted chain), and from u_1 to one same u_2, and so on. A token spelled only with bytes of that class (122,149 of
the 128,000 tokens of a 128K byte-level BPE) then goes from s to u_k, k its length in bytes, so the class tokens of
each length form one packed row computed once per tokenizer, and only the other tokens need a walk, over a trie of
their own (11,154 nodes there, against 354,317 for the whole vocabulary).

Exact, not a heuristic: `chain(dfa, s)` reads the DFA rows of s, u_1, ..., and gives up (None: walk the whole trie)
as soon as one of them sends two class bytes to different states.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._cwalk import PreorderTrie

# printable ASCII but the quote and the backslash: the bytes a JSON string's characters loop on
LOOP_CLASS = bytes(b for b in range(0x20, 0x7F) if b not in (0x22, 0x5C))


def packed_row_bytes(vocab_size: int) -> int:
    """Bytes of a packed token row (token t = bit t % 8 of byte t // 8), padded to whole uint64 words: the width of
    the class rows here, and of every row the token automaton keeps and ORs them into (token_automaton.py)."""
    return ((vocab_size + 63) // 64) * 8


class ClassSplit:
    """The tokens spelled only with bytes of `byte_class`, by length, and a preorder trie of the others.

    rows_from[k]: the packed row of the class tokens of length >= k (k = 1 .. max_len + 1; the sets of different
    lengths are disjoint, so the row of the lengths a..b is rows_from[a] ^ rows_from[b + 1]); count_from[k]: their
    number; ids_by_len[k]: their ids ascending."""

    def __init__(self, token_bytes: Sequence[bytes | None], vocab_size: int, byte_class: bytes = LOOP_CLASS):
        self.byte_class = bytes(sorted(set(byte_class)))
        self.class_index = np.frombuffer(self.byte_class, dtype=np.uint8).astype(np.intp)
        self.nbytes = packed_row_bytes(vocab_size)
        by_len: dict[int, list[int]] = {}
        rest: list[bytes | None] = []
        for t, b in enumerate(token_bytes):
            if b and not b.translate(None, self.byte_class):  # every byte of b is in the class
                by_len.setdefault(len(b), []).append(t)
                rest.append(None)
            else:
                rest.append(b)
        self.max_len = max(by_len, default=0)
        L = self.max_len
        self.ids_by_len = [np.array(by_len.get(k, []), dtype=np.int64) for k in range(L + 2)]
        rows = np.zeros((L + 2, self.nbytes), dtype=np.uint8)
        for k in range(1, L + 1):
            ids = self.ids_by_len[k]
            if ids.size:
                np.bitwise_or.at(rows[k], ids >> 3, (1 << (ids & 7)).astype(np.uint8))
        self.rows_from = np.bitwise_xor.accumulate(rows[::-1], axis=0)[::-1].copy()
        counts = np.array([ids.size for ids in self.ids_by_len], dtype=np.int64)
        self.count_from = np.cumsum(counts[::-1])[::-1].copy()
        self.n_class_tokens = int(counts.sum())
        self.rest_trie = PreorderTrie(rest, vocab_size)

    def chain(self, dfa, s: int) -> list[int] | None:
        """[u_1, ..., u_max_len]: the state after k class bytes from s, whichever bytes (0 = DEAD), or None when
        some u_k (k < max_len) sends two class bytes to different states. Expands the DFA rows it reads (the whole
        walk would expand them too)."""
        L = self.max_len
        out: list[int] = []
        u = s
        cls = self.class_index
        while len(out) < L:
            if not dfa.expanded[u]:
                dfa.expand(u)
            targets = dfa.T[u][cls]
            v = int(targets[0])
            if not (targets == v).all():
                return None
            if v == 0 or v == u:  # dead, or a loop: the same state for every longer length
                out.extend([v] * (L - len(out)))
                break
            out.append(v)
            u = v
        return out

    def runs(self, lengths: list[int]) -> list[tuple[int, int]]:
        """Ascending lengths as maximal runs [(a, b)] of consecutive ones."""
        out: list[tuple[int, int]] = []
        for k in lengths:
            if out and out[-1][1] == k - 1:
                out[-1] = (out[-1][0], k)
            else:
                out.append((k, k))
        return out

    def row_of(self, runs: list[tuple[int, int]]) -> np.ndarray:
        """A new packed row of the class tokens whose lengths lie in the runs."""
        row = np.zeros(self.nbytes, dtype=np.uint8)
        for a, b in runs:
            row ^= self.rows_from[a]
            row ^= self.rows_from[b + 1]
        return row

    def count_of(self, runs: list[tuple[int, int]]) -> int:
        return int(sum(self.count_from[a] - self.count_from[b + 1] for a, b in runs))

    def ids_of(self, runs: list[tuple[int, int]]) -> list[np.ndarray]:
        return [self.ids_by_len[k] for a, b in runs for k in range(a, b + 1)]
