"""Can a state reach acceptance within m more open positions: the length questions of `SetAlgebra`, a mixin.

  finish_cheap          decided by what the state's distances tell, no search (None: undecided)
  finish_bounded        a breadth-first search within an allowance of states (the left frontier's questions)
  finish3               exact, memoised per state as two thresholds (largest m known too few, smallest known enough)
  greedy_tokens_to_accept, succ_canonical   a completion's length by greedy steps; successors in a canonical order

Answers are functions of the constraint (never of which transitions other requests had computed): see
docs/constraints.md, "Reproducibility".
"""
from __future__ import annotations

from array import array
from itertools import repeat

import numpy as np

from .bounds import INF
from .deadline import check_active
from .deriv import DEAD
from .token_automaton import bits_of

ENDED = 0  # bit 0 of a state set: "an EOS has been emitted"
_NO_TRUE = (1 << 31) - 1  # can-finish threshold: no m known to suffice


class FinishQuestions:
    """The can-finish questions over the token automaton `self.ta` / byte DFA `self.dfa`, with the memos
    `SetAlgebra.__init__` makes (_fin_cheap, _fin_bounded, _fin_false, _fin_true, _succ_sorted, _succ_canonical,
    _greedy, _greedy_step)."""

    def finish_cheap(self, q: int, m: int) -> bool | None:
        """Can-finish from what the state alone tells, without searching token transitions: True when q accepts,
        when every byte is a token and q is at most m bytes from acceptance, or when the tokenization of its
        shortest continuation fits m; False when even the longest tokens cannot reach acceptance in m; None
        otherwise. A function of (q, m) only (no memo learnt from searches enters it), so a budgeted call's sets do
        not depend on what other calls decided before."""
        if q == ENDED or self.dfa.accepting[q]:
            return True
        if m <= 0:
            return False
        d = int(self.dfa.dist[q])
        if self.ta.single_byte_complete and d <= m:
            return True
        if -(-d // max(1, self.ta.max_token_len)) > m:
            return False
        return True if self.greedy_tokens_to_accept(q) <= m else None

    def finish_bounded(self, q: int, m: int, states: int) -> bool | None:
        """Can-finish within m positions by a breadth-first search over token successors that expands at most
        `states` states, a whole level at a time: True / False when it decides (proofs), None when it would need
        more. A function of (q, m, states): no fact learnt by other searches enters it (only `finish_cheap`, a
        function of the state), and whole levels make it independent of the order of the states, hence of the
        automaton's numbering, which follows the order in which requests discovered them. Memoised per argument."""
        return self.finish_bounded_spent(q, m, states)[0]

    def finish_bounded_spent(self, q: int, m: int, states: int) -> tuple[bool | None, int]:
        """`finish_bounded` and the states its search expands (a function of the arguments too, memo or not: a caller
        that counts it in its own allowance stays independent of what was cached)."""
        key = (q, m, states)
        r = self._fin_bounded.get(key)
        if r is None:
            r = self._finish_levels(q, m, states)
            if len(self._fin_bounded) > 200_000:
                self._fin_bounded.clear()
            self._fin_bounded[key] = r
        return r

    def _finish_levels(self, q: int, m: int, states: int) -> tuple[bool | None, int]:
        first = self.finish_cheap(q, m)
        if first is not None:
            return first, 0
        frontier = [q]
        seen = {q}
        spent = 0
        k = 0
        while frontier and k < m:
            if spent + len(frontier) > states:
                return None, spent
            spent += len(frontier)
            k += 1
            nxt = []
            for s in frontier:
                check_active(s, "deciding whether it can finish")
                for u in self.ta.succ(s):
                    if u in seen:
                        continue  # met before at a level no later: with at least as many positions left
                    seen.add(u)
                    f = self.finish_cheap(u, m - k)
                    if f is True:
                        return True, spent
                    if f is None:
                        nxt.append(u)
            frontier = nxt
        return False, spent

    def finish3(self, q: int, m: int) -> bool:
        """Exact can-finish: d(q) <= m  with  d(q) = 0 for accepting q, else 1 + min over token successors u of d(u);
        decided depth-first (successors closest to acceptance first) with per-state thresholds memoised: the
        smallest m known to suffice and the largest m known not to (facts, the same whoever learnt them)."""
        if q == ENDED or self.dfa.accepting[q]:
            return True
        if m <= 0:
            return False
        if self.ta.single_byte_complete and int(self.dfa.dist[q]) <= m:
            return True  # spell the shortest byte path with single-byte tokens
        ft, ff = self._fin_true, self._fin_false
        if q < len(ft) and ft[q] <= m:
            return True
        if q < len(ff) and ff[q] >= m:
            return False
        g = self.greedy_tokens_to_accept(q)
        if g <= m:
            self._note_true(q, g)  # an upper bound on the tokens q needs: every m >= g suffices
            return True
        check_active(q, "deciding whether it can finish")
        L = max(1, self.ta.max_token_len)
        if -(-int(self.dfa.dist[q]) // L) > m:  # not even with the longest tokens
            self._note_false(q, m)
            return False
        for u in self._succ_by_dist(q):
            if self.finish3(u, m - 1):
                self._note_true(q, m)
                return True
        self._note_false(q, m)
        return False

    def _note_true(self, q: int, m: int) -> None:
        """q can finish within m positions (so within any more)."""
        ft = self._fin_true
        _cover(ft, q, _NO_TRUE)
        if m < ft[q]:
            ft[q] = m

    def _note_false(self, q: int, m: int) -> None:
        """q cannot finish within m positions (nor within fewer)."""
        ff = self._fin_false
        _cover(ff, q, -1)
        if m > ff[q]:
            ff[q] = min(m, _NO_TRUE)

    def greedy_tokens_to_accept(self, q: int) -> int:
        """An upper bound on the tokens q needs: a shortest byte continuation (each step's byte from
        `_greedy_next`), tokenized by longest match. Needs DFA rows only, no token transitions.

        The continuation is a function of the state (path(q) = b + path(next)), so after the longest token
        t that prefixes path(q) the rest is path(state after t): greedy(q) = 1 + greedy(that state), memoised
        per state (each state looks at most max_token_len bytes ahead instead of tokenizing its whole path): a
        function of the state, whatever was memoised before."""
        memo = self._greedy
        r = memo.get(q)
        if r is not None:
            return r
        dfa = self.dfa
        L = max(1, self.ta.max_token_len)
        is_prefix = self.ta.tok.is_token_prefix
        chain: list[int] = []
        s = q
        while True:
            r = memo.get(s)
            if r is not None:
                break
            if not len(chain) & 63:
                check_active(s, "tokenizing its shortest continuation")
            if dfa.accepting[s]:
                r = memo[s] = 0
                break
            # the path's bytes while some token still starts with them: the longest token prefixing the path is
            # found within them (every prefix of that token is a token prefix), and a path of structural JSON leaves
            # the token trie after a few bytes instead of the vocabulary's longest token
            head = bytearray()
            states = [s]
            u = s
            while len(head) < L and not dfa.accepting[u]:
                b, u = self._greedy_next(u)
                if b < 0:
                    break
                head.append(b)
                states.append(u)
                if not is_prefix(bytes(head)):
                    break
            k = self.ta.longest_token_prefix(bytes(head))
            if k == 0:  # a dead end on the path, or a byte no token spells
                r = memo[s] = INF
                break
            chain.append(s)
            s = states[k]
            if len(chain) > 100_000:
                r = INF
                break
        for x in reversed(chain):
            r = INF if r >= INF else r + 1
            memo[x] = r
        return memo[q]

    def _greedy_next(self, s: int) -> tuple[int, int]:
        """(a byte taking s one byte closer to acceptance, the state it leads to), or (-1, DEAD): the first byte of
        a shortest member of s's term, read off the terms, and one derivative (a derivative DFA); otherwise, or if
        that byte does not get closer, the lowest such byte of s's row (expanded: a derivative per byte class, which
        along a long continuation is most of the walk's cost)."""
        st = self._greedy_step.get(s)
        if st is None:
            dfa = self.dfa
            terms = getattr(dfa, "terms", None)
            if terms is not None and not dfa.expanded[s]:
                t = dfa.term_of[s]
                b = terms.shortest_first_byte(t)
                if b is not None and b >= 0:
                    u = dfa.state_for(terms.deriv(t, b))
                    if u != DEAD and int(dfa.dist[u]) == int(dfa.dist[s]) - 1:
                        self._greedy_step[s] = st = (b, u)
                        return st
            dfa.expand(s)
            row = dfa.T[s]
            d = int(dfa.dist[s])
            st = (-1, DEAD)
            for b in np.flatnonzero(row).tolist():
                if int(dfa.dist[row[b]]) == d - 1:
                    st = (b, int(row[b]))
                    break
            self._greedy_step[s] = st
        return st

    def _succ_by_dist(self, q: int) -> list[int]:
        r = self._succ_sorted.get(q)
        if r is None:
            sb = self.ta.trans(q).succ_bits
            dist = self.dfa.dist
            r = sorted(bits_of(sb), key=lambda u: int(dist[u]))
            self._succ_sorted[q] = r
        return r

    def succ_canonical(self, q: int) -> list[int]:
        """q's token successors ordered by (byte distance to acceptance, the smallest token id leading there): an
        order that is a function of the state's language and of the vocabulary, not of the automaton's state
        numbering (which follows the order in which requests discovered the states), so a search that stops after
        a bounded number of states in this order gives the same answer with a cold or a warm automaton."""
        r = self._succ_canonical.get(q)
        if r is None:
            tt = self.ta.trans(q)
            dist = self.dfa.dist
            allp = self.ta.allp
            keys = []
            for u, ids in tt.sparse.items():
                keys.append((int(dist[u]), int(ids[0]), u))
            for u, row in tt.dense.items():
                packed = allp[row]
                i = int(np.flatnonzero(packed)[0])
                b = int(packed[i])
                keys.append((int(dist[u]), i * 8 + (b & -b).bit_length() - 1, u))
            keys.sort()
            r = [u for _, _, u in keys]
            if len(self._succ_canonical) > 200_000:
                self._succ_canonical.clear()
            self._succ_canonical[q] = r
        return r


def _cover(arr: array, q: int, fill: int) -> None:
    """Extend arr (at least doubling) so that index q exists, the new entries set to fill."""
    n = len(arr)
    if q >= n:
        arr.extend(repeat(fill, max(n, q + 1 - n, 64)))
