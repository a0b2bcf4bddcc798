"""Token-level view of a byte DFA over a real vocabulary.

For a DFA state s, `trans(s)` walks the token trie once (vectorised level by level with numpy, pruned
to the live part of the trie when it is small) and groups the vocabulary by target state:
delta(s, t) = u. Groups are stored as packed bitsets (dense) or sorted id arrays (sparse). This is done
lazily, only for states the canvas actually visits, and memoised for the lifetime of the compiled
constraint (it is shared by every request).

`mask_rows` ORs groups into boolean rows: the allowed tokens at an open position are
  { t : exists s in S, delta(s, t) in U }  (+ EOS when asked)
for a set S of states and a set U of admissible targets.
"""
from __future__ import annotations

import threading

import numpy as np

from .deriv import DEAD, DerivDFA
from .tokenizer_info import TokenizerInfo

DENSE_MIN = 2048  # groups larger than this are stored as packed bitsets


class TokTrans:
    """Token transitions out of one DFA state."""

    __slots__ = ("state", "targets", "dense", "sparse", "succ", "n_allowed", "_lookup")

    def __init__(self, state: int):
        self.state = state
        self.targets: tuple[int, ...] = ()
        self.dense: dict[int, np.ndarray] = {}  # target -> packed uint8 bits (little bit order)
        self.sparse: dict[int, np.ndarray] = {}  # target -> int64 sorted token ids
        self.succ: frozenset[int] = frozenset()
        self.n_allowed = 0


class TokenAutomaton:
    def __init__(self, dfa: DerivDFA, tok: TokenizerInfo):
        self.dfa = dfa
        self.tok = tok
        self.trie = tok.trie()
        self.vocab_size = tok.vocab_size
        self.nbytes = (self.vocab_size + 7) // 8
        self.eos_id = tok.eos_id
        self._trans: dict[int, TokTrans] = {}
        self._delta: dict[tuple[int, int], int] = {}
        self._lock = threading.RLock()
        self.max_token_len = self.trie.max_token_len
        singles = {b[0] for b in tok.token_bytes if b is not None and len(b) == 1}
        # every byte is a token of its own: a byte path of length d is spelled by d tokens
        self.single_byte_complete = len(singles) == 256

    # ------------------------------------------------------------------ single transitions
    def delta(self, s: int, t: int) -> int:
        """DFA state after token t from s (DEAD if not allowed; EOS and specials are DEAD here)."""
        key = (s, t)
        r = self._delta.get(key)
        if r is None:
            tb = self.tok.token_bytes
            b = tb[t] if 0 <= t < len(tb) else None
            r = DEAD if (b is None or s == DEAD) else self.dfa.walk(s, b)
            self._delta[key] = r
        return r

    # ------------------------------------------------------------------ trie walk
    def walk_trie(self, s: int) -> np.ndarray:
        """DFA state reached at every trie node when starting from state s (DEAD = 0); index n_nodes is
        a sentinel that stays DEAD."""
        tr = self.trie
        dfa = self.dfa
        st = np.zeros(tr.n_nodes + 1, dtype=np.int32)
        st[0] = s
        if s == DEAD:
            return st
        dfa.expand(s)
        parent, byte, ls = tr.parent, tr.byte, tr.level_start
        alive_prev: np.ndarray | None = np.array([0], dtype=np.int64)  # alive node ids of previous level
        n_alive_prev = 1
        for lvl in range(1, len(ls) - 1):
            a, b = ls[lvl], ls[lvl + 1]
            if a >= b:
                break
            size = b - a
            if alive_prev is None:
                # previous level was done densely; decide whether to go sparse
                if n_alive_prev * 4 < size:
                    prev_a = ls[lvl - 1]
                    alive_prev = prev_a + np.flatnonzero(st[prev_a:a])
            if alive_prev is not None:
                cs = tr.child_start[alive_prev]
                ce = tr.child_end[alive_prev]
                cnt = ce - cs
                tot = int(cnt.sum())
                if tot == 0:
                    break
                if tot * 2 < size:
                    # sparse: gather only the children of live nodes
                    nz = cnt > 0
                    cs, cnt = cs[nz], cnt[nz]
                    offs = np.repeat(cs - np.concatenate(([0], np.cumsum(cnt)[:-1])), cnt)
                    idx = offs + np.arange(tot)
                    par_states = st[parent[idx]]
                    dfa.ensure_rows(par_states)
                    vals = dfa.T.ravel()[par_states.astype(np.int64) * 256 + byte[idx]]
                    st[idx] = vals
                    live = vals != 0
                    alive_prev = idx[live]
                    n_alive_prev = alive_prev.size
                    if n_alive_prev == 0:
                        break
                    continue
            # dense level
            par_states = st[parent[a:b]]
            dfa.ensure_rows(par_states)
            vals = dfa.T.ravel()[par_states.astype(np.int64) * 256 + byte[a:b]]
            st[a:b] = vals
            n_alive_prev = int(np.count_nonzero(vals))
            alive_prev = None
            if n_alive_prev == 0:
                break
        st[tr.n_nodes] = DEAD
        return st

    def trans(self, s: int) -> TokTrans:
        tt = self._trans.get(s)
        if tt is not None:
            return tt
        with self._lock:
            tt = self._trans.get(s)
            if tt is not None:
                return tt
            tt = self._compute_trans(s)
            self._trans[s] = tt
            return tt

    def _compute_trans(self, s: int) -> TokTrans:
        tt = TokTrans(s)
        if s == DEAD:
            return tt
        st = self.walk_trie(s)
        nxt = st[self.trie.token_node]  # [vocab_size]
        idx = np.flatnonzero(nxt)
        tt.n_allowed = int(idx.size)
        if idx.size == 0:
            return tt
        tg = nxt[idx]
        if idx.size <= DENSE_MIN:
            order = np.argsort(tg, kind="stable")
            tg_s, idx_s = tg[order], idx[order]
            cuts = np.flatnonzero(np.diff(tg_s)) + 1
            starts = np.concatenate(([0], cuts))
            ends = np.concatenate((cuts, [tg_s.size]))
            for a, b in zip(starts.tolist(), ends.tolist()):
                tt.sparse[int(tg_s[a])] = idx_s[a:b]
        else:
            counts = np.bincount(tg)
            targets = np.flatnonzero(counts)
            if targets.size > 8:
                key = tg.astype(np.uint16) if self.dfa.n_states < 65536 else tg
                order = np.argsort(key, kind="stable")
                tg_s, idx_s = tg[order], idx[order]
                cuts = np.flatnonzero(np.diff(tg_s)) + 1
                starts = np.concatenate(([0], cuts)).tolist()
                ends = np.concatenate((cuts, [tg_s.size])).tolist()
                for a, b in zip(starts, ends):
                    u = int(tg_s[a])
                    ids = idx_s[a:b]
                    if b - a > DENSE_MIN:
                        bits = np.zeros(self.vocab_size, dtype=bool)
                        bits[ids] = True
                        tt.dense[u] = np.packbits(bits, bitorder="little")
                    else:
                        tt.sparse[u] = ids
            else:
                for u in targets.tolist():
                    eq = nxt == u
                    if counts[u] > DENSE_MIN:
                        tt.dense[u] = np.packbits(eq, bitorder="little")
                    else:
                        tt.sparse[u] = np.flatnonzero(eq)
        tt.targets = tuple(sorted(list(tt.dense) + list(tt.sparse)))
        tt.succ = frozenset(tt.targets)
        return tt

    def succ(self, s: int) -> frozenset[int]:
        return self.trans(s).succ

    # ------------------------------------------------------------------ masks
    def allowed_packed(self, pairs) -> tuple[np.ndarray | None, list[np.ndarray]]:
        """OR of the groups (s, u) in `pairs`: (packed dense bits or None, list of sparse id arrays)."""
        acc = None
        sparse: list[np.ndarray] = []
        for s, u in pairs:
            tt = self.trans(s)
            d = tt.dense.get(u)
            if d is not None:
                if acc is None:
                    acc = d.copy()
                else:
                    np.bitwise_or(acc, d, out=acc)
                continue
            sp = tt.sparse.get(u)
            if sp is not None:
                sparse.append(sp)
        return acc, sparse

    def row(self, pairs, eos: bool, out: np.ndarray) -> None:
        """Write the boolean row for `pairs` (+EOS) into `out` (bool [vocab_size], zeroed by caller)."""
        acc, sparse = self.allowed_packed(pairs)
        if acc is not None:
            out[:] = np.unpackbits(acc, bitorder="little", count=self.vocab_size).view(bool)
        for sp in sparse:
            out[sp] = True
        if eos:
            out[self.eos_id] = True

    def count_allowed(self, pairs, limit: int = 2) -> tuple[int, int | None]:
        """(number of allowed tokens capped at `limit`, the token if exactly one)."""
        acc, sparse = self.allowed_packed(pairs)
        if acc is not None:
            return limit, None
        if not sparse:
            return 0, None
        u = np.unique(np.concatenate(sparse)) if len(sparse) > 1 else sparse[0]
        if u.size == 1:
            return 1, int(u[0])
        return min(int(u.size), limit), None
