"""The witness search of a grammar canvas: a full assignment of the open positions whose text parses.

A `GrammarCanvasState` reports a canvas completable only with a witness in hand; this module finds one, depth
first over token groups from the frontier (the exact parser steps each token, the approximate backward sets prune),
committed tokens stepped exactly, the tail closed by the grammar's concrete completion or a bounded token-level
search. A node budget bounds each search (`SearchBudgetExhausted` inside; the result is then None with
`exhaustive` False, which proves nothing). The active call deadline is checked at every node: a search that
outlives its call raises ConstraintTimeoutError (deadline.py), which, unlike the budget, is not caught here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..deadline import check_active
from .canvas_sets import Analysis, in_backward
from .configuration import Config

if TYPE_CHECKING:  # annotations only: grammar.py imports the canvas state, which imports this module
    from .grammar import CompiledGrammar


class SearchBudgetExhausted(Exception):
    """Raised inside a witness search when its node budget is spent."""


class WitnessSearch:
    """Depth-first witness search over one canvas: token groups at open positions (exact parser, pruned by the
    B sets), committed tokens stepped exactly, the tail closed by the concrete completion or a token-level
    breadth-first search. `exhaustive` stays True unless a budget cut the search short (then a None result
    proves nothing)."""

    def __init__(self, cg: CompiledGrammar, c: tuple, an: Analysis, budget: int, *, n: int, eos: int,
                 prefer: list[int] | None, stats: dict[str, int]):
        """`prefer`: the current witness (its token groups are tried first; None before the first one);
        `stats`: the state's counters (search_nodes counted here)."""
        self.cg = cg
        self.c = c
        self.an = an
        self.n = n
        self.eos = eos
        self.budget = budget
        self.failed: set = set()
        self.exhaustive = True
        self.prefer = prefer
        self.stats = stats

    def run(self, i: int, cfg: Config) -> list[int] | None:
        try:
            return self.fill(i, cfg)
        except (SearchBudgetExhausted, RecursionError):
            self.exhaustive = False
            return None

    def candidates(self, cfg: Config, i: int):
        """[(key, token, next config)] for open position i: the witness's token group first, then the others by
        completion estimate; pruned by B[i+1]."""
        cg = self.cg
        ranked = cg.ranked_successors(cfg)  # [(estimate, group, token, next config, approx id)], cached
        B = self.an.B
        b = B[i + 1] if i + 1 < len(B) else None
        prefer = self.prefer[i] if self.prefer is not None else None
        first = []
        if prefer is not None and prefer != self.eos:
            lt = cg.lexer.trans(cfg[1])
            pos = np.flatnonzero(lt.tokens == prefer)
            if pos.size:
                pg = int(lt.group_of[pos[0]])
                for est, g, _tok, nxt, a in ranked:
                    if g == pg:
                        if b is None or a in b:
                            first.append((-1, prefer, nxt))
                        break
        if b is None:
            rest = [(est, tok, nxt) for est, g, tok, nxt, a in ranked]
        else:
            rest = [(est, tok, nxt) for est, g, tok, nxt, a in ranked if a in b]
        if first:
            rest = [x for x in rest if x[2] != first[0][2]]
        return first + rest

    def fill(self, i: int, cfg: Config) -> list[int] | None:
        an, c, n = self.an, self.c, self.n
        if i > an.last_text:
            cap = an.e_star - i
            toks = self.cg.complete_tokens(cfg)
            if toks is not None and len(toks) <= cap:
                return toks + [self.eos] * (n - i - len(toks))
            if cap <= 0:
                return None
            key = ("t", i, cfg)
            if key in self.failed:
                return None
            allow = max(0, min(self.budget, 1500))
            toks, exhaustive, used = self.cg.token_completion(cfg, cap, budget=allow)
            self.budget -= 1 + used // 8
            if toks is not None:
                return toks + [self.eos] * (n - i - len(toks))
            if not exhaustive:
                self.exhaustive = False
            else:
                self.failed.add(key)
            return None
        ci = c[i]
        if ci is not None:
            nxt = self.cg.step(cfg, ci)
            if nxt is None or not in_backward(an.B, i + 1, self.cg.approx_id(nxt)):
                return None
            rest = self.fill(i + 1, nxt)
            return None if rest is None else [ci] + rest
        key = (i, cfg)
        if key in self.failed:
            return None
        nxt_c = c[i + 1] if i + 1 < n else None
        step = self.cg.step
        for _k, tok, nxt in self.candidates(cfg, i):
            if nxt_c is not None and nxt_c != self.eos and i + 1 <= an.last_text:
                # the next position is committed: refute cheaply before spending budget on this candidate
                nn = step(nxt, nxt_c)
                if nn is None or not in_backward(an.B, i + 2, self.cg.approx_id(nn)):
                    continue
            check_active(None, "searching a completion of the canvas at position %d", i)
            self.budget -= 1
            self.stats["search_nodes"] += 1
            if self.budget < 0:
                raise SearchBudgetExhausted
            rest = self.fill(i + 1, nxt)
            if rest is not None:
                return [tok] + rest
        self.failed.add(key)
        return None
