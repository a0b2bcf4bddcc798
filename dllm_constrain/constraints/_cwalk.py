"""The token-trie walk's native core: loading it, the preorder trie it walks, and the walker around it.

The walk itself is C (`_native.c`, built by the package's build as `dllm_constrain.constraints._native`); it runs
with the GIL released, so masks are computed beside the model's forward and beside other requests' masks. When
the extension is absent (no compiler at install time) or DLLM_CONSTRAIN_NO_C=1, `load()` returns None and the
token automaton uses its numpy walker instead. Both give identical results (tests/test_native_core.py).

The walk runs over the trie in DFS preorder (a node's subtree is the contiguous range [i, i + size[i])), so a dead
node skips its whole subtree. The byte DFA is lazy: when the walk meets a state whose row is not computed yet it
takes the GIL back, has the DFA expand it (derivatives: the term algebra of _terms.c, or deriv_terms.py without it) and
goes on from that node.
"""
from __future__ import annotations

import os
import threading
from types import ModuleType

import numpy as np

NO_C_ENV = "DLLM_CONSTRAIN_NO_C"


def load() -> ModuleType | None:
    """The native extension module, or None when it is not built or DLLM_CONSTRAIN_NO_C is set (non-empty)."""
    if os.environ.get(NO_C_ENV):
        return None
    try:
        from . import _native
    except ImportError:
        return None
    return _native


class PreorderTrie:
    """The vocabulary trie in DFS preorder (lexicographic order of all token prefixes)."""

    def __init__(self, token_bytes, vocab_size: int):
        prefixes: set[bytes] = set()
        for b in token_bytes:
            if b:
                for k in range(1, len(b) + 1):
                    prefixes.add(b[:k])
        order = sorted(prefixes)
        n = len(order) + 1
        index = {b"": 0}
        parent = np.zeros(n, dtype=np.int32)
        byte = np.zeros(n, dtype=np.uint8)
        par = [0] * n
        byt = [0] * n
        for k, p in enumerate(order, start=1):
            index[p] = k
            par[k] = index[p[:-1]]
            byt[k] = p[-1]
        parent[:] = par
        byte[:] = byt
        # subtree sizes: accumulate children into parents, deepest (= last in preorder) first
        size = np.ones(n, dtype=np.int64)
        lens = np.fromiter((len(p) for p in order), dtype=np.int32, count=len(order))
        by_depth = np.argsort(-lens, kind="stable") + 1
        for d in np.unique(lens)[::-1]:
            nodes = by_depth[lens[by_depth - 1] == d]
            np.add.at(size, parent[nodes], size[nodes])
        self.size = size.astype(np.int32)
        self.parent = parent
        self.byte = byte
        node_tok = np.full(n, -1, dtype=np.int32)
        dup_primary: list[int] = []
        dup_extra: list[int] = []
        for t, b in enumerate(token_bytes):
            if b:
                k = index[b]
                if node_tok[k] < 0:
                    node_tok[k] = t
                else:  # several ids with the same bytes: the first one is walked, the others follow it
                    dup_primary.append(int(node_tok[k]))
                    dup_extra.append(t)
        self.node_tok = node_tok
        self.dup_primary = np.array(dup_primary, dtype=np.int64)
        self.dup_extra = np.array(dup_extra, dtype=np.int64)
        self.n_nodes = n
        self._native = None
        self._native_lock = threading.Lock()

    def native(self, module: ModuleType):
        """The native (copied, validated) form of this trie, built once and shared by every walker."""
        if self._native is None:
            with self._native_lock:
                if self._native is None:
                    self._native = module.Trie(self.parent, self.byte, self.size, self.node_tok)
        return self._native


class CWalker:
    """Walks the preorder trie from a DFA state with the native core.

    One walker per token automaton: its scratch arrays serve one walk at a time (the lock), while the native trie
    is shared read-only by every walker of the tokenizer. Walks of different automata run in parallel (the native
    walk releases the GIL; it takes it back only to expand a DFA state it meets without a row, then goes on)."""

    def __init__(self, native: ModuleType, trie: PreorderTrie, vocab_size: int):
        self.trie = trie
        self.core = trie.native(native)
        self.st = np.zeros(trie.n_nodes, dtype=np.int32)
        n_out = max(self.core.n_tokens, 1)
        self.out_tok = np.zeros(n_out, dtype=np.int32)
        self.out_tgt = np.zeros(n_out, dtype=np.int32)
        self._lock = threading.Lock()
        self._group = getattr(native, "group_by_target", None)
        # token id -> whether other ids spell the same bytes (the walk outputs the first id only)
        self._has_dup = np.zeros(max(vocab_size, int(trie.node_tok.max(initial=-1)) + 1, 1), dtype=bool)
        self._has_dup[trie.dup_primary] = True

    def walk(self, dfa, s: int) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, target states) of every token t with delta(s, t) != DEAD (s is not DEAD), as int64."""
        tr = self.trie
        with self._lock:
            n = self.core.walk(dfa, int(s), self.st, self.out_tok, self.out_tgt)
            tok = self.out_tok[:n].astype(np.int64)
            tgt = self.out_tgt[:n].astype(np.int64)
        return self._with_duplicates(tok, tgt)

    def _with_duplicates(self, tok: np.ndarray, tgt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add the ids that spell the same bytes as a walked token, with its target."""
        tr = self.trie
        if tr.dup_primary.size and tok.size and self._has_dup[tok].any():
            m = np.isin(tr.dup_primary, tok)
            order = np.argsort(tok)
            pos = np.searchsorted(tok[order], tr.dup_primary[m])
            tok = np.concatenate((tok, tr.dup_extra[m].astype(tok.dtype)))
            tgt = np.concatenate((tgt, tgt[order][pos]))
        return tok, tgt

    @property
    def groups(self) -> bool:
        """Whether `walk_grouped` is native (an extension built before it had the grouping has the walk only)."""
        return self._group is not None

    def walk_grouped(self, dfa, s: int, nbytes: int, dense_min: int, small: int):
        """The walk from s grouped by target state in native code (see `group_by_target` in _native.c):
        (n allowed, [(target, packed, data)], all_row bytes or None, all_sorted bytes or None)."""
        with self._lock:
            n = self.core.walk(dfa, int(s), self.st, self.out_tok, self.out_tgt)
            tok, tgt = self._with_duplicates(self.out_tok[:n], self.out_tgt[:n])
            groups, all_row, all_sorted = self._group(tok, tgt, nbytes, dense_min, small)
            return int(tok.size), groups, all_row, all_sorted
