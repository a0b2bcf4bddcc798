"""Lark's basic lexer as a deterministic byte automaton with output, and its token-level view.

A lexer state is the pending lexeme: the first terminal in Lark's order that has matched a prefix of it, each
scanner terminal's DFA state on it (pike.py's for regex terminals), and the keyword tries' nodes. State 0 is DEAD,
1 is START; T[q, b] is the next state and E[q, b] the type emitted on that transition (-1: none, -2: an ignored
lexeme ended). Every accepted text is lexed exactly as Lark's scanner lexes it. `trans(q)` groups the vocabulary's
tokens by (emitted type sequence, end state) in one walk of the byte trie. docs/grammars.md, "The lexer
automaton", has the rules.
"""
from __future__ import annotations

import threading

import numpy as np

from ..deriv import DerivDFA
from .pike import PikeDFA
from ..tokenizer_info import TokenizerInfo
from .frontend import GrammarSpec

DEAD = 0
START = 1
_START_KEY = ("START",)


class _KwTrie:
    """Byte trie of keyword values; node 0 is the root, -1 dead."""

    def __init__(self) -> None:
        self.next: list[dict[int, int]] = [{}]
        self.ends: list[tuple[int, ...]] = [()]

    def add(self, data: bytes, tid: int) -> None:
        n = 0
        for b in data:
            nx = self.next[n].get(b)
            if nx is None:
                nx = len(self.next)
                self.next[n][b] = nx
                self.next.append({})
                self.ends.append(())
            n = nx
        self.ends[n] = self.ends[n] + (tid,)

    def table(self) -> np.ndarray:
        t = np.full((len(self.next) + 1, 256), -1, dtype=np.int32)  # row len(next) = dead sink
        for n, d in enumerate(self.next):
            for b, nx in d.items():
                t[n, b] = nx
        return t


class LexTrans:
    """Token transitions out of one lexer state, grouped by (emitted seq, end state)."""

    __slots__ = ("q", "tokens", "offsets", "g_seq", "g_end", "group_of", "n_groups", "useq", "useq_groups",
                 "end_ptypes")

    def __init__(self, q: int, tokens: np.ndarray, offsets: np.ndarray, g_seq: np.ndarray, g_end: np.ndarray):
        self.q = q
        self.tokens = tokens  # int64 token ids sorted by group
        self.offsets = offsets  # int64 [n_groups + 1]
        self.g_seq = g_seq  # int64 [n_groups]
        self.g_end = g_end  # int64 [n_groups]
        self.n_groups = int(g_seq.size)
        self.group_of = np.repeat(np.arange(self.n_groups, dtype=np.int32), np.diff(offsets))
        useq, inv = np.unique(g_seq, return_inverse=True)
        inv = inv.reshape(-1)
        order = np.argsort(inv, kind="stable")
        cuts = np.searchsorted(inv[order], np.arange(useq.size + 1))
        self.useq = useq.tolist()  # distinct emitted sequences
        self.useq_groups = [order[cuts[k]:cuts[k + 1]] for k in range(useq.size)]  # groups per sequence
        self.end_ptypes = None  # bool [n_groups, types + 1]: what each group's pending lexeme can still become

    def group_tokens(self, g: int) -> np.ndarray:
        return self.tokens[self.offsets[g]:self.offsets[g + 1]]


class Lexer:
    def __init__(self, spec: GrammarSpec, tok: TokenizerInfo, max_states: int = 200_000):
        self.spec = spec
        self.tok = tok
        self.m = len(spec.scan)
        # string terminals: their value (a derivative DFA); regex terminals: Python's first-match semantics
        self.dfas = [DerivDFA(t.ast) if t.matcher is None else PikeDFA(t.matcher) for t in spec.scan]
        for d in self.dfas:
            d.expand(1)
        self.scan_type = [t.type_id for t in spec.scan]
        self.ignored_type = {t.type_id for t in spec.scan if t.ignored}
        self.ignored_mask = np.zeros(len(spec.type_names) + 1, dtype=bool)
        for t in self.ignored_type:
            self.ignored_mask[t] = True
        self.unless = [t.unless for t in spec.scan]
        self.has_kw = any(self.unless)
        ks, ki = _KwTrie(), _KwTrie()
        for tid, (value, icase) in spec.keywords.items():
            if icase:
                ki.add(value.lower(), tid)
            else:
                ks.add(value, tid)
        self.kw_s, self.kw_i = ks, ki
        self.kw_s_T = ks.table()
        self.kw_i_T = ki.table()
        lower = np.arange(256, dtype=np.int64)
        lower[ord("A"):ord("Z") + 1] += 32
        self._lower = lower
        self.max_states = max_states
        # states
        self.keys: list[tuple] = [("DEAD",), _START_KEY]
        self.index: dict[tuple, int] = {self.keys[0]: DEAD, _START_KEY: START}
        cap = 256
        self.T = np.zeros((cap, 256), dtype=np.int32)
        self.E = np.full((cap, 256), -1, dtype=np.int32)
        self.expanded = np.zeros(cap, dtype=bool)
        self.expanded[DEAD] = True
        self.end_type = np.full(cap, -2, dtype=np.int32)  # type emitted at end of text (-1 ignored, -2 none)
        self.end_type[START] = -2
        # sequences of emitted (non-ignored) types
        self.seq_parent: list[int] = [-1]
        self.seq_type: list[int] = [-1]
        self.seq_len: list[int] = [0]
        self.seq_index: dict[tuple[int, int], int] = {}
        self._trans: dict[int, LexTrans] = {}
        self._delta: dict[tuple[int, int], tuple[int, int]] = {}
        self._lock = threading.RLock()
        self.trie = tok.trie()
        self.n_types = len(spec.type_names) + 1
        self.expand(START)

    # ------------------------------------------------------------------ states
    @property
    def n_states(self) -> int:
        return len(self.keys)

    def _grow(self) -> None:
        cap = self.T.shape[0] * 2
        for name, fill in (("T", 0), ("E", -1)):
            old = getattr(self, name)
            new = np.full((cap, 256), fill, dtype=np.int32)
            new[: old.shape[0]] = old
            setattr(self, name, new)
        ex = np.zeros(cap, dtype=bool)
        ex[: self.expanded.size] = self.expanded
        self.expanded = ex
        et = np.full(cap, -2, dtype=np.int32)
        et[: self.end_type.size] = self.end_type
        self.end_type = et

    def intern(self, key: tuple) -> int:
        q = self.index.get(key)
        if q is not None:
            return q
        q = len(self.keys)
        if q >= self.max_states:
            from ...errors import CompilationTimeoutError

            raise CompilationTimeoutError(f"lexer automaton too large (> {self.max_states} states)")
        if q >= self.T.shape[0]:
            self._grow()
        self.keys.append(key)
        self.index[key] = q
        self.end_type[q] = self._end_type_of(key)
        return q

    def _resolve(self, a: int, ks: int, ki: int) -> int:
        """Type id of a lexeme matched by scanner terminal a (keyword retyping)."""
        unl = self.unless[a]
        if unl:
            ends = set()
            if ks >= 0:
                ends.update(self.kw_s.ends[ks])
            if ki >= 0:
                ends.update(self.kw_i.ends[ki])
            for k in unl:
                if k in ends:
                    return k
        return self.scan_type[a]

    def _end_type_of(self, key: tuple) -> int:
        a = key[0]
        if a < 0:
            return -2
        s_a = key[1 + a]
        if s_a == 0 or not self.dfas[a].accepting[s_a]:
            return -2
        t = self._resolve(a, key[1 + self.m], key[2 + self.m])
        return -1 if self.ignored_mask[self.scan_type[a]] else t

    def lexeme_type(self, q: int) -> int:
        """Type the pending lexeme would be emitted with now (-1 ignored, -2 cannot end here)."""
        return int(self.end_type[q])

    def expand(self, q: int) -> None:
        if self.expanded[q]:
            return
        with self._lock:
            if self.expanded[q]:
                return
            self._expand(q)

    def _expand(self, q: int) -> None:
        m = self.m
        key = self.keys[q]
        if q == START:
            a = -1
            S = [1] * m
            ks, ki = 0, 0
        else:
            a = key[0]
            S = key[1:1 + m]
            ks, ki = key[1 + m], key[2 + m]
        M = np.zeros((m, 256), dtype=np.int32)
        ACC = np.zeros((m, 256), dtype=bool)
        for j in range(m):
            s = S[j]
            if s == 0:
                continue
            d = self.dfas[j]
            if not d.expanded[s]:
                d.expand(s)
            row = d.T[s]
            M[j] = row
            ACC[j] = d.accepting[row]
        limit = m if a < 0 else a + 1
        cont = M[:limit].any(axis=0)
        any_acc = ACC.any(axis=0)
        first_acc = np.where(any_acc, ACC.argmax(axis=0), m) if m else np.zeros(256, dtype=np.int64)
        a_new = np.minimum(first_acc, m if a < 0 else a)
        # drop terminals after A'
        rows = np.arange(m)[:, None]
        M = np.where(rows <= a_new[None, :], M, 0)
        a_new = np.where(a_new >= m, -1, a_new)
        kss = self.kw_s_T[ks if ks >= 0 else -1]
        kis = self.kw_i_T[ki if ki >= 0 else -1][self._lower]
        K = np.concatenate([a_new[None, :], M, kss[None, :], kis[None, :]], axis=0).T  # [256, m+3]
        uniq, inv = np.unique(K, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        ids = np.array([self.intern(tuple(int(x) for x in u)) for u in uniq], dtype=np.int32)
        nxt = ids[inv]
        emit = np.full(256, -1, dtype=np.int32)
        if q == START:
            nxt = np.where(cont, nxt, DEAD)
        else:
            et = self._end_type_of(key)
            if et == -2:
                nxt = np.where(cont, nxt, DEAD)
            else:
                srow = self.T[START]
                nxt = np.where(cont, nxt, srow)
                emit = np.where(cont | (srow == DEAD), -1, et if et >= 0 else -2).astype(np.int32)
        self.T[q] = nxt
        self.E[q] = emit
        self.expanded[q] = True

    def ensure_rows(self, qs: np.ndarray) -> None:
        if qs.size == 0:
            return
        ex = self.expanded
        if ex[qs].all():
            return
        for q in np.unique(qs[~ex[qs]]).tolist():
            self.expand(q)

    def step(self, q: int, b: int) -> tuple[int, int]:
        """(next state, emitted type or -1)."""
        if not self.expanded[q]:
            self.expand(q)
        return int(self.T[q, b]), int(self.E[q, b])

    # ------------------------------------------------------------------ sequences
    def seq_extend(self, parent: int, t: int) -> int:
        k = (parent, t)
        s = self.seq_index.get(k)
        if s is None:
            s = len(self.seq_parent)
            self.seq_index[k] = s
            self.seq_parent.append(parent)
            self.seq_type.append(t)
            self.seq_len.append(self.seq_len[parent] + 1)
        return s

    def seq_types(self, s: int) -> list[int]:
        out = []
        while s > 0:
            out.append(self.seq_type[s])
            s = self.seq_parent[s]
        out.reverse()
        return out

    def walk_bytes(self, q: int, data: bytes, seq: int = 0) -> tuple[int, int]:
        """(end state, seq) after feeding data from q; end state DEAD if rejected."""
        T, E = self.T, self.E
        for b in data:
            if q == DEAD:
                return DEAD, seq
            if not self.expanded[q]:
                self.expand(q)
                T, E = self.T, self.E
            e = int(E[q, b])
            q = int(T[q, b])
            if e >= 0 and q != DEAD:
                seq = self.seq_extend(seq, e)
        return q, seq

    def delta(self, q: int, t: int) -> tuple[int, int]:
        """(end state, seq) for token t from lexer state q (DEAD for specials / rejected)."""
        key = (q, t)
        r = self._delta.get(key)
        if r is None:
            tb = self.tok.token_bytes
            b = tb[t] if 0 <= t < len(tb) else None
            r = (DEAD, 0) if b is None or q == DEAD else self.walk_bytes(q, b)
            if len(self._delta) > 2_000_000:
                self._delta.clear()
            self._delta[key] = r
        return r

    # ------------------------------------------------------------------ token level
    def has_trans(self, q: int) -> bool:
        return q in self._trans

    def trans(self, q: int) -> LexTrans:
        tt = self._trans.get(q)
        if tt is not None:
            return tt
        with self._lock:
            tt = self._trans.get(q)
            if tt is None:
                tt = self._compute_trans(q)
                self._trans[q] = tt
            return tt

    def _compute_trans(self, q: int) -> LexTrans:
        tr = self.trie
        n = tr.n_nodes
        st = np.zeros(n + 1, dtype=np.int32)
        sq = np.zeros(n + 1, dtype=np.int64)
        st[0] = q
        if q != DEAD:
            alive = np.array([0], dtype=np.int64)
            for lvl in range(1, len(tr.level_start) - 1):
                cs = tr.child_start[alive].astype(np.int64)
                ce = tr.child_end[alive].astype(np.int64)
                cnt = ce - cs
                tot = int(cnt.sum())
                if tot == 0:
                    break
                nz = cnt > 0
                cs, cnt = cs[nz], cnt[nz]
                offs = np.repeat(cs - np.concatenate(([0], np.cumsum(cnt)[:-1])), cnt)
                idx = offs + np.arange(tot)
                par = tr.parent[idx]
                ps = st[par]
                self.ensure_rows(ps)
                b = tr.byte[idx]
                nxt = self.T[ps, b]
                em = self.E[ps, b]
                pseq = sq[par]
                live = nxt != DEAD
                has = (em >= 0) & live
                if has.any():
                    keys = pseq[has] * self.n_types + em[has]
                    uk, inv = np.unique(keys, return_inverse=True)
                    nt = self.n_types
                    ids = np.array([self.seq_extend(int(k) // nt, int(k) % nt) for k in uk.tolist()], dtype=np.int64)
                    pseq = pseq.copy()
                    pseq[has] = ids[inv.reshape(-1)]
                st[idx] = nxt
                sq[idx] = pseq
                alive = idx[live]
                if alive.size == 0:
                    break
        st[n] = DEAD
        tn = tr.token_node
        t_state = st[tn]
        t_seq = sq[tn]
        ok = np.flatnonzero(t_state != DEAD)
        if ok.size == 0:
            z = np.zeros(0, dtype=np.int64)
            return LexTrans(q, z, np.zeros(1, dtype=np.int64), z, z)
        key = t_seq[ok] * (1 << 31) + t_state[ok]
        order = np.argsort(key, kind="stable")
        ks = key[order]
        toks = ok[order].astype(np.int64)
        cuts = np.flatnonzero(np.diff(ks)) + 1
        starts = np.concatenate(([0], cuts))
        offsets = np.concatenate((starts, [ks.size])).astype(np.int64)
        gk = ks[starts]
        return LexTrans(q, toks, offsets, gk >> 31, gk & ((1 << 31) - 1))
