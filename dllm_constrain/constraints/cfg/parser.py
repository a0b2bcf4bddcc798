"""Incremental LALR(1) recognizer over Lark's table, with persistent (interned) stacks.

A stack is a node id in a pool of (parent node, LR state) pairs, interned, so a parser snapshot is an int:
copying a state is free and memo tables are keyed by ints. `feed(node, t)` runs the reductions and the shift
of terminal t (-1 when t is not acceptable: an LR parser never shifts a token that leaves the viable
prefixes, so "fed" means "this prefix extends to a sentence of the grammar").

`completion(node)` is the cheapest way (in bytes, each terminal costing its shortest lexeme) to finish the
parse from a stack: over the kernel items [A -> alpha . beta] of the top state, complete beta with the
cheapest expansions, reduce A (pop |alpha|, goto) and recurse on the shorter stack.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..bounds import INF
from .frontend import GrammarSpec

ROOT = 0  # the stack holding only the start state


class LRParser:
    def __init__(self, spec: GrammarSpec, term_cost: Sequence[int]):
        self.spec = spec
        self.action = spec.action
        self.goto = spec.goto
        self.rules = spec.rules
        self.END = spec.END
        self.end_state = spec.end_state
        # stack pool
        self.parent: list[int] = [-1]
        self.state: list[int] = [spec.start_state]
        self.depth: list[int] = [1]
        self._index: dict[tuple[int, int], int] = {}
        self._feed: dict[tuple[int, int], int] = {}
        self._seq: dict[tuple[int, int], int] = {}
        self._acc: dict[int, bool] = {}
        # costs
        self.term_cost = list(term_cost) + [0]  # END costs nothing
        self.nt_cost, self.nt_rule = self._nonterminal_costs()
        self._expansion: dict[int, tuple[int, ...]] = {}
        self._comp: dict[int, tuple[int, tuple[int, ...], int]] = {}

    # ------------------------------------------------------------------ stacks
    def push(self, node: int, s: int) -> int:
        k = (node, s)
        r = self._index.get(k)
        if r is None:
            r = len(self.state)
            self._index[k] = r
            self.parent.append(node)
            self.state.append(s)
            self.depth.append(self.depth[node] + 1)
        return r

    def pop(self, node: int, k: int) -> int:
        par = self.parent
        for _ in range(k):
            node = par[node]
        return node

    def states_of(self, node: int) -> list[int]:
        out = []
        while node >= 0:
            out.append(self.state[node])
            node = self.parent[node]
        out.reverse()
        return out

    # ------------------------------------------------------------------ parsing
    def feed(self, node: int, t: int) -> int:
        """Stack after shifting terminal t (reductions first); -1 if t is not acceptable."""
        k = (node, t)
        r = self._feed.get(k)
        if r is not None:
            return r
        r = self._feed_uncached(node, t)
        if len(self._feed) > 2_000_000:  # memo tables only grow: bound them (stacks stay interned)
            self._feed.clear()
            self._acc.clear()
            self._comp.clear()
        self._feed[k] = r
        return r

    def _feed_uncached(self, node: int, t: int) -> int:
        action, goto, rules, state = self.action, self.goto, self.rules, self.state
        cur = node
        for _ in range(100_000):
            a = action[state[cur]].get(t)
            if a is None:
                return -1
            if a >= 0:
                return self.push(cur, a)
            lhs, rhs = rules[-a - 1]
            cur = self.pop(cur, len(rhs))
            g = goto[state[cur]].get(lhs)
            if g is None:
                return -1
            cur = self.push(cur, g)
        return -1

    def accepts(self, node: int) -> bool:
        """The input so far is a complete sentence."""
        r = self._acc.get(node)
        if r is not None:
            return r
        action, goto, rules, state = self.action, self.goto, self.rules, self.state
        cur = node
        ok = False
        for _ in range(100_000):
            if state[cur] == self.end_state:
                ok = True
                break
            a = action[state[cur]].get(self.END)
            if a is None or a >= 0:
                break
            lhs, rhs = rules[-a - 1]
            cur = self.pop(cur, len(rhs))
            g = goto[state[cur]].get(lhs)
            if g is None:
                break
            cur = self.push(cur, g)
            if state[cur] == self.end_state:
                ok = True
                break
        self._acc[node] = ok
        return ok

    def feed_types(self, node: int, types: Sequence[int]) -> int:
        for t in types:
            node = self.feed(node, t)
            if node < 0:
                return -1
        return node

    def expected(self, node: int) -> list[int]:
        """Terminal types (END included) acceptable next."""
        return [t for t in self.action[self.state[node]] if (self.accepts(node) if t == self.END else self.feed(node, t) >= 0)]

    # ------------------------------------------------------------------ costs
    def _nonterminal_costs(self) -> tuple[list[int], list[int]]:
        n_nt = len(self.spec.nt_names)
        cost = [INF] * n_nt
        best = [-1] * n_nt
        changed = True
        while changed:
            changed = False
            for r, (lhs, rhs) in enumerate(self.rules):
                c = 0
                for is_t, x in rhs:
                    c += self.term_cost[x] if is_t else cost[x]
                    if c >= INF:
                        break
                if c < cost[lhs]:
                    cost[lhs] = c
                    best[lhs] = r
                    changed = True
        return cost, best

    def sym_cost(self, is_t: bool, x: int) -> int:
        return self.term_cost[x] if is_t else self.nt_cost[x]

    def expansion(self, nt: int) -> tuple[int, ...]:
        """Terminals of the cheapest derivation of nonterminal nt."""
        r = self._expansion.get(nt)
        if r is not None:
            return r
        self._expansion[nt] = ()  # cycle guard (cannot happen for a min-cost derivation)
        out: list[int] = []
        rule = self.nt_rule[nt]
        if rule >= 0:
            for is_t, x in self.rules[rule][1]:
                out.extend((x,) if is_t else self.expansion(x))
        r = tuple(out)
        self._expansion[nt] = r
        return r

    def completion_cost(self, node: int) -> int:
        return self._completion(node)[0]

    def completion_terms(self, node: int) -> list[int] | None:
        """Terminal types of the cheapest completion of the stack (END not included); None if none."""
        out: list[int] = []
        cur = node
        for _ in range(100_000):
            c, terms, nxt = self._completion(cur)
            if c >= INF:
                return None
            out.extend(terms)
            if nxt < 0:
                return out
            cur = nxt
        return None

    def _completion(self, node: int) -> tuple[int, tuple[int, ...], int]:
        """(cost, terminals to emit now, stack to continue from (-1: done))."""
        r = self._comp.get(node)
        if r is not None:
            return r
        self._comp[node] = (INF, (), -1)  # cycle guard
        s = self.state[node]
        best: tuple[int, tuple[int, ...], int] = (INF, (), -1)
        if s == self.end_state:
            best = (0, (), -1)
        else:
            for r_i, dot in self.spec.items[s]:
                lhs, rhs = self.rules[r_i]
                rest = rhs[dot:]
                c_rest = 0
                for is_t, x in rest:
                    c_rest += self.sym_cost(is_t, x)
                if c_rest >= INF:
                    continue
                if r_i == self.spec.root_rule:
                    if c_rest < best[0]:
                        best = (c_rest, self._render(rest), -1)
                    continue
                if dot > self.depth[node] - 1:
                    continue
                below = self.pop(node, dot)
                g = self.goto[self.state[below]].get(lhs)
                if g is None:
                    continue
                nxt = self.push(below, g)
                if c_rest >= best[0]:
                    continue
                c_next = self._completion(nxt)[0]
                if c_rest + c_next < best[0]:
                    best = (c_rest + c_next, self._render(rest), nxt)
        self._comp[node] = best
        return best

    def _render(self, syms) -> tuple[int, ...]:
        out: list[int] = []
        for is_t, x in syms:
            out.extend((x,) if is_t else self.expansion(x))
        return tuple(out)
