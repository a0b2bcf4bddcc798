"""Token-level view of a byte DFA over a real vocabulary.

For a DFA state s, `trans(s)` walks the token trie once (with the native core of _cwalk.py when the package's
build compiled it, which releases the GIL; else vectorised level by level with numpy, pruned to the live part of
the trie when it is small) and groups the vocabulary by target state:
delta(s, t) = u. Groups are stored as packed bitsets (dense) or sorted id arrays (sparse). This is done
lazily, only for states the canvas actually visits, and memoised for the lifetime of the compiled
constraint (it is shared by every request).

`mask_rows` ORs groups into boolean rows: the allowed tokens at an open position are
  { t : exists s in S, delta(s, t) in U }  (+ EOS when asked)
for a set S of states and a set U of admissible targets.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from .class_split import packed_row_bytes
from .deadline import check_active
from .deriv import DEAD, DerivDFA
from .tokenizer_info import TokenizerInfo

DENSE_MIN = 2048  # groups larger than this are stored as packed bitsets
SMALL = 32  # states allowing more tokens than this also keep a packed row of all of them
# memory a known state costs beyond its arrays (its objects, the set-level memos over it): see footprint_bytes
STATE_OVERHEAD_BYTES = 3072


class TokTrans:
    """Token transitions out of one DFA state."""

    __slots__ = ("state", "targets", "dense", "sparse", "succ", "succ_bits", "n_allowed", "all_row", "all_sparse")

    def __init__(self, state: int):
        self.state = state
        self.targets: tuple[int, ...] = ()
        self.dense: dict[int, int] = {}  # target -> row of TokenAutomaton.allp (packed bits, interned)
        self.sparse: dict[int, np.ndarray] = {}  # target -> int64 sorted token ids
        self.succ: frozenset[int] = frozenset()
        self.succ_bits = 0  # the targets as an int bitset
        self.n_allowed = 0
        self.all_row = -1  # allp row (interned) of every allowed token, when there are more than SMALL
        self.all_sparse: np.ndarray | None = None  # every allowed token, when there are at most DENSE_MIN


class TokenAutomaton:
    def __init__(self, dfa: DerivDFA, tok: TokenizerInfo, use_c: bool = True):
        self.dfa = dfa
        self.tok = tok
        self.vocab_size = tok.vocab_size
        self.nbytes = packed_row_bytes(self.vocab_size)
        self.eos_id = tok.eos_id
        self._trans: dict[int, TokTrans] = {}
        self._unconfirmed: set[int] = set()  # states whose row-store entry may exist ahead of the table (see trans)
        self._delta: dict[tuple[int, int], int] = {}
        self._lock = threading.RLock()
        self.max_token_len = tok.max_token_len()
        from . import _cwalk

        native = _cwalk.load() if use_c else None  # None: no native core built, or DLLM_CONSTRAIN_NO_C=1
        self._cwalker = _cwalk.CWalker(native, tok.preorder_trie(), self.vocab_size) if native is not None else None
        # states looping on the JSON-string byte class: the class tokens by length, a walk over the other tokens only
        self._split = tok.class_split() if native is not None else None
        self._rest_walker = (_cwalk.CWalker(native, self._split.rest_trie, self.vocab_size)
                             if self._split is not None else None)
        # the known states' transitions in flat arrays: mask rows between state sets built in C (`set_row`)
        self.row_store = native.RowStore(self.nbytes) if native is not None and hasattr(native, "RowStore") else None
        self._trie = None  # level-order trie: only for the numpy walker (built on first use)
        self.allp = np.zeros((8, self.nbytes), dtype=np.uint8)  # packed "every allowed token" rows
        self.n_allp = 0
        self._row_ids: dict[int, int] = {}
        self._unions: OrderedDict = OrderedDict()
        self.succ_bits: dict[int, int] = {}  # state -> successor bitset (filled by trans)
        self._trans_bytes = 0  # what the published transitions hold (their id arrays and successor sets)
        self.acc_bits = 1 << 1 if dfa.accepting[1] else 0  # accepting states seen so far (bitset)
        # every byte is a token of its own: a byte path of length d is spelled by d tokens
        self.single_byte_complete = tok.single_byte_complete()

    @property
    def trie(self):
        if self._trie is None:
            self._trie = self.tok.trie()
            self._buf = np.zeros(self._trie.n_nodes + 1, dtype=np.int64)  # per-walk scratch (node -> state)
            self._parent64 = self._trie.parent.astype(np.int64)
            self._byte64 = self._trie.byte.astype(np.int64)
        return self._trie

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
    def walk_tokens(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        if self._cwalker is not None and s != DEAD:
            return self._cwalker.walk(self.dfa, s)
        return self._walk_tokens_numpy(s)

    def _walk_tokens_numpy(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, target states) of every token t with delta(s, t) != DEAD.

        Level-by-level over the trie; a level is done densely (one numpy gather over the whole level)
        when many nodes are live, else only the children of the live nodes are visited, so the cost is
        proportional to the live part of the trie (tiny for states inside literals, keys, numbers)."""
        empty = np.zeros(0, dtype=np.int64)
        if s == DEAD:
            return empty, empty
        self.dfa.expand(s)
        tr = self.trie  # (builds the scratch buffer on first use)
        buf, ls = self._buf, tr.level_start
        buf[0] = s
        alive_prev = np.zeros(1, dtype=np.int64)  # live nodes of the previous level (sparse mode)
        n_alive = 1
        prev_size = 1
        prev_dense = False
        out_tok: list[np.ndarray] = []
        out_tgt: list[np.ndarray] = []
        for lvl in range(1, len(ls) - 1):
            a, b = ls[lvl], ls[lvl + 1]
            if a >= b or n_alive == 0:
                break
            dense = prev_dense and n_alive * 3 > prev_size
            if not dense:
                if prev_dense:
                    alive_prev = ls[lvl - 1] + np.flatnonzero(buf[ls[lvl - 1]:a])
                cs = tr.child_start[alive_prev]
                cnt = tr.child_end[alive_prev] - cs
                tot = int(cnt.sum())
                if tot == 0:
                    break
                dense = tot * 3 >= b - a
            if dense:
                if not prev_dense:
                    self._clear_dead_nodes(ls[lvl - 1], a, alive_prev)
                n_alive, toks, tgts = self._step_level_dense(a, b)
            else:
                alive_prev, toks, tgts = self._step_level_sparse(cs, cnt, tot)
                n_alive = alive_prev.size
            out_tok.append(toks)
            out_tgt.append(tgts)
            prev_dense = dense
            prev_size = b - a
        if not out_tok:
            return empty, empty
        return self._with_duplicate_tokens(np.concatenate(out_tok).astype(np.int64), np.concatenate(out_tgt))

    def _child_states(self, nodes: np.ndarray | slice) -> np.ndarray:
        """DFA state after each trie node's byte from its parent's state (0: DEAD)."""
        par_states = self._buf[self._parent64[nodes]]
        self.dfa.ensure_rows(par_states)
        return self.dfa.T.ravel()[par_states * 256 + self._byte64[nodes]]

    def _step_level_sparse(self, cs: np.ndarray, cnt: np.ndarray, tot: int
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Visit only the children (cs[i] .. cs[i] + cnt[i], tot in all) of the previous level's live nodes:
        (live children, token ids they spell, their target states)."""
        nz = cnt > 0
        cs, cnt = cs[nz], cnt[nz]
        if cs.size == 1:
            idx = np.arange(int(cs[0]), int(cs[0]) + tot, dtype=np.int64)
        else:
            offs = np.repeat(cs.astype(np.int64) - np.concatenate(([0], np.cumsum(cnt)[:-1])), cnt)
            idx = offs + np.arange(tot, dtype=np.int64)
        vals = self._child_states(idx)
        live = vals != 0
        alive = idx[live]
        v = vals[live]
        self._buf[alive] = v
        t = self.trie.node_token[alive]
        h = t >= 0
        return alive, t[h], v[h]

    def _step_level_dense(self, a: int, b: int) -> tuple[int, np.ndarray, np.ndarray]:
        """Visit every node a .. b-1 of a level in one gather: (live count, token ids, target states)."""
        vals = self._child_states(slice(a, b))
        self._buf[a:b] = vals
        live = vals != 0
        t = self.trie.node_token[a:b]
        h = live & (t >= 0)
        return int(np.count_nonzero(live)), t[h], vals[h]

    def _clear_dead_nodes(self, a: int, b: int, alive: np.ndarray) -> None:
        """A level a .. b-1 written sparsely holds stale states on its dead nodes: zero them before a dense
        level reads it."""
        buf = self._buf
        keep = buf[alive].copy()
        buf[a:b] = 0
        buf[alive] = keep

    def _with_duplicate_tokens(self, tok_ids: np.ndarray, tgts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add the extra ids of trie nodes that spell several tokens (identical bytes)."""
        tr = self.trie
        if tr.dup_nodes.size:
            m = np.isin(tr.dup_nodes, tr.token_node[tok_ids])
            if m.any():
                tok_ids = np.concatenate((tok_ids, tr.dup_tokens[m].astype(np.int64)))
                tgts = np.concatenate((tgts, self._buf[tr.dup_nodes[m]]))
        return tok_ids, tgts

    def known_trans(self, s: int) -> TokTrans | None:
        """The token transitions of state s if they were computed already, else None (no work, no lock)."""
        return self._trans.get(s)

    @property
    def known_count(self) -> int:
        """How many states' token transitions are known: it only grows, so an answer read off the known
        transitions (no new one computed) holds while it stays the same. Read without the lock."""
        return len(self._trans)

    def trans(self, s: int) -> TokTrans:
        """The token transitions out of s, computed once, shared (thread-safe), published in steps (row store,
        successor sets, table): an exception in between (KeyboardInterrupt, a signal-based timeout) leaves a
        row-store entry the next call keeps (`_store_state`); only the byte tally may then be one state off."""
        tt = self._trans.get(s)
        if tt is not None:
            return tt
        with self._lock:
            tt = self._trans.get(s)
            if tt is not None:
                return tt
            check_active(s)  # a request's call deadline: before the walk (the table is published only once whole)
            tt = self._compute_trans(s)
            if s != DEAD:
                # published even without an allowed token (the state after a closing brace allows only EOS): such a
                # state is known, with no successor, or every set holding it would look partial
                self._store_state(s, tt)
                self._trans_bytes += _held_bytes(tt)
                self.succ_bits[s] = tt.succ_bits  # known from here on: set last (readers do not take the lock)
            self._trans[s] = tt
            self._unconfirmed.discard(s)
            return tt

    def _store_state(self, s: int, tt: TokTrans) -> None:
        """Add state s's transitions to the native row store (one C call: all or nothing). s is marked unconfirmed
        first: a later call for s that finds the entry (an interrupted `trans(s)` wrote it) keeps it."""
        if self.row_store is None:
            return
        entries = [(u, tt.dense.get(u, -1), tt.sparse.get(u, NO_IDS)) for u in tt.targets]
        retry = s in self._unconfirmed
        self._unconfirmed.add(s)
        try:
            self.row_store.add_state(s, entries, tt.all_row, tt.all_sparse)
        except ValueError:
            if not retry:  # else the store has s from the interrupted call: the same transitions
                raise

    def footprint_bytes(self) -> int:
        """An estimate of the memory this automaton holds and that grows as requests explore it: the byte DFA's
        transition table, the interned token rows (twice: numpy and the native row store), the known states'
        token transitions, and per known state the memos built over it (set_algebra.py), STATE_OVERHEAD_BYTES
        (calibrated against the process's resident memory over the warm calls of a 10,000-state schema). Read
        without the lock: a computation under way adds its bytes when it publishes."""
        return (self.dfa.T.nbytes + 2 * self.allp.nbytes + self._trans_bytes
                + STATE_OVERHEAD_BYTES * self.known_count)

    def memory_bytes(self) -> int:
        """`footprint_bytes` and the unions of interned rows (bounded by count): what a cache charges for it."""
        return self.footprint_bytes() + len(self._unions) * self.nbytes

    def _compute_trans(self, s: int) -> TokTrans:
        tt = TokTrans(s)
        if s == DEAD:
            return tt
        if self._cwalker is not None and self._cwalker.groups:
            return self._compute_trans_native(tt)
        idx, tg = self.walk_tokens(s)
        tt.n_allowed = int(idx.size)
        all_idx = idx
        if idx.size == 0:
            tt.all_sparse = idx
            return tt
        big: list[int] = []
        if idx.size > DENSE_MIN:
            counts = np.bincount(tg)
            big = np.flatnonzero(counts > DENSE_MIN).tolist()
            for u in big:
                bits = np.zeros(self.nbytes * 8, dtype=bool)
                bits[idx[tg == u]] = True
                tt.dense[u] = self._intern_row(np.packbits(bits, bitorder="little"))
            if big:
                rest = ~np.isin(tg, big) if len(big) > 1 else tg != big[0]
                idx, tg = idx[rest], tg[rest]
        if idx.size:
            order = np.argsort(tg, kind="stable")
            tg_s, idx_s = tg[order], idx[order]
            cuts = np.flatnonzero(np.diff(tg_s)) + 1
            starts = np.concatenate(([0], cuts)).tolist()
            ends = np.concatenate((cuts, [tg_s.size])).tolist()
            for a, b in zip(starts, ends):
                tt.sparse[int(tg_s[a])] = np.sort(idx_s[a:b])
        return self._finish_trans(tt, all_idx)

    def _compute_trans_native(self, tt: TokTrans) -> TokTrans:
        """`_compute_trans` with the walk and its grouping in native code (no pass over the vocabulary per group)."""
        walker = self._cwalker
        if self._split is not None and self._split.n_class_tokens:
            chain = self._split.chain(self.dfa, tt.state)
            if chain is not None:
                if any(chain):
                    return self._compute_trans_split(tt, chain)
                walker = self._rest_walker  # no class token is allowed: the other tokens are all there is
        n, groups, all_row, all_sorted = walker.walk_grouped(self.dfa, tt.state, self.nbytes, DENSE_MIN, SMALL)
        tt.n_allowed = n
        for u, packed, data in groups:
            if packed:
                tt.dense[u] = self._intern_row(np.frombuffer(data, dtype=np.uint8))
            else:
                tt.sparse[u] = np.frombuffer(data, dtype=np.int64)
        if all_sorted is not None:
            tt.all_sparse = np.frombuffer(all_sorted, dtype=np.int64)
        if n == 0:
            return tt
        self._finish_trans(tt, None)
        if all_row is not None:
            tt.all_row = self._intern_row(np.frombuffer(all_row, dtype=np.uint8))
        return tt

    def _compute_trans_split(self, tt: TokTrans, chain: list[int]) -> TokTrans:
        """`_compute_trans_native` for a state whose class tokens go by length along `chain` (class_split.py): the
        walk covers the other tokens only, and each target's group joins the class tokens of the lengths that reach
        it (packed when the group has more than DENSE_MIN tokens, sorted ids otherwise, as from the whole walk)."""
        sp = self._split
        n_rest, groups, rest_all_row, rest_all_sorted = self._rest_walker.walk_grouped(
            self.dfa, tt.state, self.nbytes, DENSE_MIN, SMALL)
        lengths: dict[int, list[int]] = {}
        for k, u in enumerate(chain, start=1):
            if u != DEAD and sp.ids_by_len[k].size:  # a target only through tokens that exist
                lengths.setdefault(u, []).append(k)
        runs = {u: sp.runs(ks) for u, ks in lengths.items()}
        rest = {u: (packed, data) for u, packed, data in groups}
        alive = sp.runs(sorted(k for ks in lengths.values() for k in ks))
        n = n_rest + sp.count_of(alive)
        tt.n_allowed = n
        for u in sorted(set(runs) | set(rest)):
            r = runs.get(u, [])
            packed, data = rest.get(u, (False, b""))
            n_u = sp.count_of(r) + (DENSE_MIN + 1 if packed else len(data) // 8)
            if n_u > DENSE_MIN:
                row = sp.row_of(r)
                if packed:
                    row |= np.frombuffer(data, dtype=np.uint8)
                else:
                    _set_bits(row, np.frombuffer(data, dtype=np.int64))
                tt.dense[u] = self._intern_row(row)
            else:
                tt.sparse[u] = np.sort(np.concatenate(sp.ids_of(r) + [np.frombuffer(data, dtype=np.int64)]))
        if n <= DENSE_MIN:
            tt.all_sparse = np.sort(np.concatenate(sp.ids_of(alive) + [np.frombuffer(rest_all_sorted, dtype=np.int64)]))
        if n == 0:
            return tt
        self._finish_trans(tt, None)
        if n > SMALL:
            row = sp.row_of(alive)
            if rest_all_row is not None:
                row |= np.frombuffer(rest_all_row, dtype=np.uint8)
            else:  # the walk found too few tokens for a row of them all: its groups have them
                for _, packed, data in groups:
                    if packed:
                        row |= np.frombuffer(data, dtype=np.uint8)
                    else:
                        _set_bits(row, np.frombuffer(data, dtype=np.int64))
            tt.all_row = self._intern_row(row)
        return tt

    def _finish_trans(self, tt: TokTrans, all_idx: np.ndarray | None) -> TokTrans:
        """Targets, successor bits and accepting states of a grouped `tt`; with `all_idx` (every allowed id, the
        numpy path) also the rows of every allowed token."""
        tt.targets = targets = tuple(sorted(list(tt.dense) + list(tt.sparse)))
        tt.succ = frozenset(targets)
        if targets:
            # one buffer per set: `b |= 1 << u` per target allocates two ints of max(u) bits each time, and a
            # state's targets are often numbered in the tens of thousands
            acc = self.dfa.accepting
            bits = bytearray((targets[-1] >> 3) + 1)
            accepted = []
            for u in targets:
                bits[u >> 3] |= 1 << (u & 7)
                if acc[u]:
                    accepted.append(u)
            tt.succ_bits = int.from_bytes(bits, "little")
            if accepted:
                self.acc_bits |= sum(1 << u for u in accepted)
        if all_idx is None:
            return tt
        # every allowed token: an interned packed row (unions over many states are then one OR-reduce
        # over distinct rows) and, for small sets, the sorted ids
        if all_idx.size <= DENSE_MIN:
            tt.all_sparse = np.sort(all_idx)
        if all_idx.size > SMALL:
            bits = np.zeros(self.nbytes * 8, dtype=bool)
            bits[all_idx] = True
            tt.all_row = self._intern_row(np.packbits(bits, bitorder="little"))
        return tt

    def _intern_row(self, row: np.ndarray) -> int:
        key = hash(row.tobytes())
        hit = self._row_ids.get(key)
        if hit is not None and np.array_equal(self.allp[hit], row):
            return hit
        k = self._add_allp(row)
        self._row_ids[key] = k
        return k

    def _add_allp(self, row: np.ndarray) -> int:
        """Append an interned row to `allp` and the row store, in step whatever interrupts the call: written to
        `allp` past n_allp, then to the store, then counted. A store one row ahead (an interrupted call stopped
        before counting) has that row adopted: `allp` holds the same bytes there."""
        k = self.n_allp
        store = self.row_store
        if store is not None and store.n_rows > k:
            if store.n_rows != k + 1:
                raise RuntimeError("the row store and the interned rows are out of step")
            k = self.n_allp = k + 1
        if k >= self.allp.shape[0]:
            grown = np.zeros((max(8, 2 * self.allp.shape[0]), self.nbytes), dtype=np.uint8)
            grown[:k] = self.allp[:k]
            self.allp = grown
        self.allp[k] = row
        if store is not None and store.add_row(row) != k:
            raise RuntimeError("the row store and the interned rows are out of step")
        self.n_allp = k + 1
        return k

    def longest_token_prefix(self, data: bytes) -> int:
        """Length of the longest token that spells a prefix of data (0: no token does)."""
        vocab = self.tok.byte_set()
        return next((j for j in range(min(len(data), self.max_token_len), 0, -1) if data[:j] in vocab), 0)

    def succ(self, s: int) -> frozenset[int]:
        return self.trans(s).succ

    # ------------------------------------------------------------------ masks
    def mask_row(self, full: list[int], partial: list[tuple[int, int]], eos: bool, out: np.ndarray,
                 members=None) -> None:
        """Write into `out` (bool [>= vocab_size], zeroed) the tokens of `packed_row` (same arguments)."""
        V = self.vocab_size
        out[:V] = np.unpackbits(self.packed_row(full, partial, eos, members), bitorder="little", count=V).view(bool)

    def packed_row(self, full: list[int], partial: list[tuple[int, int]], eos: bool, members=None) -> np.ndarray:
        """A new packed row (uint8 [nbytes], token t = bit t % 8 of byte t // 8) of the union of: every token
        allowed from the states in `full`, the tokens from each state q of `partial` = [(q, U)] into the targets U
        (a bitset; `members` lists a bitset's elements, memoised by the caller), and EOS if asked. Built packed
        throughout: the dense groups are ORed as packed rows and the sparse tokens set bit by bit, never a bool row
        of the vocabulary (which cost two passes over 128K entries per row)."""
        dense: set[int] = set()
        sparse: list[np.ndarray] = []
        known = self._trans
        trans = self.trans
        for q in full:
            tt = known.get(q) or trans(q)
            if tt.all_row >= 0:
                dense.add(tt.all_row)
            elif tt.all_sparse is not None and tt.all_sparse.size:
                sparse.append(tt.all_sparse)
        members = members or bits_of
        for q, targets in partial:
            tt = known.get(q) or trans(q)
            dget = tt.dense.get
            sget = tt.sparse.get
            for u in members(targets):
                d = dget(u)
                if d is not None:
                    dense.add(d)
                else:
                    sp = sget(u)
                    if sp is not None:
                        sparse.append(sp)
        row = self._union(dense).copy() if dense else np.zeros(self.nbytes, dtype=np.uint8)
        if sparse:
            idx = np.concatenate(sparse) if len(sparse) > 1 else sparse[0]
            if idx.size <= SCATTER_MAX:
                np.bitwise_or.at(row, idx >> 3, np.left_shift(1, idx & 7).astype(np.uint8))
            else:  # ufunc.at costs ~6 ns per index; a bool scatter and one packbits cost ~5 us for any size
                bits = np.zeros(8 * self.nbytes, dtype=bool)
                bits[idx] = True
                row |= np.packbits(bits, bitorder="little")
        if eos:
            row[self.eos_id >> 3] |= np.uint8(1 << (self.eos_id & 7))
        return row

    def set_row(self, Bi: int, Bn: int) -> tuple[np.ndarray, bool]:
        """`packed_row` of the step from state set Bi to Bn (bitsets as SetAlgebra keeps them, bit 0 = ENDED) built
        in C from the row store (one loop over Bi's members instead of SetAlgebra._split_step and packed_row in
        Python): (the row, read-only; whether some member's transitions are not known yet, which the row leaves out,
        so that it must not be cached). Needs `row_store`."""
        data, unknown = self.row_store.row(as_bytes(Bi), as_bytes(Bn), self.dfa.accepting, self.eos_id)
        return np.frombuffer(data, dtype=np.uint8), unknown

    def _union(self, ids: set[int]) -> np.ndarray:
        """OR of the interned packed rows `ids` (cached: the same unions recur across steps)."""
        if len(ids) == 1:
            return self.allp[next(iter(ids))]
        key = frozenset(ids)
        hit = self._unions.get(key)
        if hit is not None:
            self._unions.move_to_end(key)
            return hit
        allp = self.allp
        if len(ids) <= 16:
            acc = np.bitwise_or.reduce(allp[sorted(ids)], axis=0)
        else:
            w = allp.view(np.uint64) if self.nbytes % 8 == 0 else None
            if w is not None:
                it = iter(ids)
                acc64 = w[next(it)].copy()
                for i in it:
                    np.bitwise_or(acc64, w[i], out=acc64)
                acc = acc64.view(np.uint8)
            else:
                acc = np.bitwise_or.reduce(allp[sorted(ids)], axis=0)
        self._unions[key] = acc
        if len(self._unions) > 256:
            self._unions.popitem(last=False)
        return acc

    def count_allowed(self, full: list[int], partial: list[tuple[int, int]], members=None) -> tuple[int, int | None]:
        """(number of allowed text tokens capped at 2, the token if exactly one); `partial` as in mask_row."""
        sparse: list[np.ndarray] = []
        for q in full:
            tt = self.trans(q)
            if tt.all_sparse is None:
                return 2, None
            if tt.all_sparse.size:
                sparse.append(tt.all_sparse)
        members = members or bits_of
        for q, targets in partial:
            tt = self.trans(q)
            for u in members(targets):
                if u in tt.dense:
                    return 2, None
                sp = tt.sparse.get(u)
                if sp is not None:
                    sparse.append(sp)
        if not sparse:
            return 0, None
        u = np.unique(np.concatenate(sparse)) if len(sparse) > 1 else sparse[0]
        if u.size == 1:
            return 1, int(u[0])
        return 2, None


NO_IDS = np.zeros(0, dtype=np.int64)
SCATTER_MAX = 500  # sparse tokens set bit by bit up to this many; a bool row and packbits beyond (packed_row)


def _set_bits(row: np.ndarray, ids: np.ndarray) -> None:
    """Set the bits of token ids in a packed row (uint8; token t = bit t % 8 of byte t // 8), in place."""
    if ids.size:
        np.bitwise_or.at(row, ids >> 3, (1 << (ids & 7)).astype(np.uint8))


def _held_bytes(tt: TokTrans) -> int:
    """Bytes of a state's token transitions beyond its interned rows: the id arrays and the successor set."""
    n = sum(a.nbytes for a in tt.sparse.values()) + (tt.succ_bits.bit_length() >> 3)
    return n + (tt.all_sparse.nbytes if tt.all_sparse is not None else 0)


def as_bytes(x: int) -> bytes:
    """A state set as the row store reads it: little-endian bytes."""
    return x.to_bytes((x.bit_length() + 7) // 8, "little")


def bits_from(indices: np.ndarray) -> int:
    """The set (an int used as a bitset) of the given non-negative indices, in one numpy pack (the inverse of
    `bits_of`)."""
    if not indices.size:
        return 0
    flags = np.zeros(int(indices.max()) + 1, dtype=bool)
    flags[indices] = True
    return int.from_bytes(np.packbits(flags, bitorder="little").tobytes(), "little")


def bits_of(x: int) -> list[int]:
    """Indices of the set bits of x, ascending. Peeling the low bit costs O(size) per bit on a big int, so
    large sets go through one numpy unpack of the int's bytes instead (4-25x faster at thousands of states)."""
    if x.bit_count() > 32:
        raw = np.frombuffer(x.to_bytes((x.bit_length() + 7) // 8, "little"), dtype=np.uint8)
        return np.flatnonzero(np.unpackbits(raw, bitorder="little")).tolist()
    out = []
    while x:
        low = x & -x
        out.append(low.bit_length() - 1)
        x ^= low
    return out
