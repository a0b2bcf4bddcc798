"""Optional C accelerator for the token-trie walk (the hot loop of the token automaton).

Compiled on first use with the system C compiler into a per-user cache directory and loaded with
ctypes; if no compiler is available (or DLLM_CONSTRAIN_NO_C=1), `load()` returns None and the numpy
walker in token_automaton.py is used instead. Both give identical results (tested).

The walk runs over the trie in DFS preorder (a node's subtree is the contiguous range
[i, i + size[i])), so a dead node skips its whole subtree. The byte DFA is lazy: when the walk meets a
state whose row is not computed yet it records it as pending and skips the subtree; the caller expands
the pending states (in Python) and walks again.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
import threading

import numpy as np

_SRC = r"""
#include <stdint.h>
int walk(const int32_t* parent, const uint8_t* byte, const int32_t* size, const int32_t* node_tok,
         int32_t n_nodes, const int32_t* T, const uint8_t* expanded, int32_t s, int32_t* st,
         int32_t* out_tok, int32_t* out_tgt, int32_t* pending, int32_t max_pending, int32_t* n_pending)
{
    int32_t n_out = 0, np_ = 0;
    st[0] = s;
    int32_t i = 1;
    while (i < n_nodes) {
        int32_t p = st[parent[i]];
        if (!expanded[p]) {
            if (np_ < max_pending) pending[np_++] = p;
            i += size[i];
            continue;
        }
        int32_t q = T[(int64_t)p * 256 + byte[i]];
        st[i] = q;
        if (q == 0) { i += size[i]; continue; }
        if (node_tok[i] >= 0) { out_tok[n_out] = node_tok[i]; out_tgt[n_out] = q; n_out++; }
        i++;
    }
    *n_pending = np_;
    return n_out;
}
"""

_lock = threading.Lock()
_lib = None
_tried = False


def load():
    """The compiled library, or None."""
    global _lib, _tried
    if _tried:
        return _lib
    with _lock:
        if _tried:
            return _lib
        _tried = True
        if os.environ.get("DLLM_CONSTRAIN_NO_C"):
            return None
        try:
            tag = hashlib.sha256((_SRC + sys.version).encode()).hexdigest()[:16]
            base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
            d = os.path.join(base, "dllm_constrain")
            try:
                os.makedirs(d, exist_ok=True)
            except OSError:
                d = tempfile.gettempdir()
            so = os.path.join(d, f"cwalk_{tag}.so")
            if not os.path.exists(so):
                src = os.path.join(d, f"cwalk_{tag}.c")
                with open(src, "w") as f:
                    f.write(_SRC)
                tmp = so + f".{os.getpid()}.tmp"
                cc = os.environ.get("CC", "cc")
                subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", tmp, src], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
                os.replace(tmp, so)
            lib = ctypes.CDLL(so)
            P = ctypes.c_void_p
            lib.walk.argtypes = [P, P, P, P, ctypes.c_int32, P, P, ctypes.c_int32, P, P, P, P, ctypes.c_int32, P]
            lib.walk.restype = ctypes.c_int32
            _lib = lib
        except Exception:
            _lib = None
        return _lib


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


class CWalker:
    """Walks the preorder trie from a DFA state with the C kernel, expanding pending DFA rows."""

    def __init__(self, lib, trie: PreorderTrie, vocab_size: int):
        self.lib = lib
        self.trie = trie
        self.st = np.zeros(trie.n_nodes, dtype=np.int32)
        self.out_tok = np.zeros(max(vocab_size, 1), dtype=np.int32)
        self.out_tgt = np.zeros(max(vocab_size, 1), dtype=np.int32)
        self.max_pending = 4096
        self.pending = np.zeros(self.max_pending, dtype=np.int32)
        self.n_pending = np.zeros(1, dtype=np.int32)
        self._lock = threading.Lock()

    def walk(self, dfa, s: int) -> tuple[np.ndarray, np.ndarray]:
        tr = self.trie
        with self._lock:
            for _ in range(10_000):
                T = dfa.T
                exp = dfa.expanded.view(np.uint8)
                n = self.lib.walk(tr.parent.ctypes.data, tr.byte.ctypes.data, tr.size.ctypes.data,
                                  tr.node_tok.ctypes.data, tr.n_nodes, T.ctypes.data, exp.ctypes.data, int(s),
                                  self.st.ctypes.data, self.out_tok.ctypes.data, self.out_tgt.ctypes.data,
                                  self.pending.ctypes.data, self.max_pending, self.n_pending.ctypes.data)
                k = int(self.n_pending[0])
                if k == 0:
                    tok = self.out_tok[:n].astype(np.int64)
                    tgt = self.out_tgt[:n].astype(np.int64)
                    if tr.dup_primary.size and n:
                        m = np.isin(tr.dup_primary, tok)
                        if m.any():
                            order = np.argsort(tok)
                            pos = np.searchsorted(tok[order], tr.dup_primary[m])
                            tok = np.concatenate((tok, tr.dup_extra[m]))
                            tgt = np.concatenate((tgt, tgt[order][pos]))
                    return tok, tgt
                for p in np.unique(self.pending[:k]).tolist():
                    dfa.expand(p)
            raise RuntimeError("token walk did not converge")
