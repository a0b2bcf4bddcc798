"""The mask rows of a grammar canvas: exact at the frontier, approximate (sound) right of it.

Rows are packed token-bitmask bytes (`dllm_constrain.kernels.bitmask`: token t = bit t % 8 of byte t // 8), the
form the grammar already keeps its per-group token sets in (`CompiledGrammar.group_bits`), so a row is the OR of
cached group bits and goes into the engine's bitmask without unpacking. `GrammarRows` is the part of
`GrammarCanvasState` that builds them, LRU-cached per state by what they depend on. Time (deadline.py): the frontier row's length checks and refinement
searches that outlive the call's deadline count as inconclusive (the token group is kept: sound, as when their
budgets run out) and the row so loosened is not cached; the approximate rows check the deadline and an
interrupted row is simply not kept.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dllm_constrain.kernels.bitmask import set_token


from ..bounds import INF
from ..deadline import check_active
from .canvas_sets import ENDED, Analysis

if TYPE_CHECKING:
    from .configuration import Config


class GrammarRows:
    """The mask-row half of `GrammarCanvasState` (it provides cg, approx, vocab_size, eos, the refinement budgets,
    the row cache `_rows` and `_warm` / `_inB`)."""

    _text_packed: np.ndarray | None = None

    def _text_bits(self) -> np.ndarray:
        """TOP as packed bytes: every token that spells text (the grammar's text_row), packed once per state."""
        if self._text_packed is None:
            self._text_packed = np.packbits(self.cg.text_row, bitorder="little")
        return self._text_packed

    def _frontier_row(self, c: tuple, an: Analysis) -> np.ndarray:
        """The exact mask row at the frontier (packed bytes): the exact parser's successors whose approximate state
        is in B[f+1], that fit the positions left when only the tail follows, and, when at most `refine_groups`
        remain, that a bounded witness search from f+1 does not refute; EOS where the text may end."""
        key = ("f", c[:an.f], an.B[an.f + 1] if an.f + 1 < len(an.B) else None, an.e_star, an.last_text)
        row = self._rows.get(key)
        if row is not None:
            self._rows.move_to_end(key)
            return row
        cg = self.cg
        cfg, f = an.cfg, an.f
        row = np.zeros(self.vocab_size, dtype=bool)
        lt = cg.lexer.trans(cfg[1])
        tail_only = an.last_text < f  # nothing but open positions / EOS after f
        cap = an.e_star - (f + 1)  # positions left for text after f when tail_only
        sel = np.zeros(lt.n_groups, dtype=bool)
        _lt, succ = cg.successors(cfg)
        passing = []
        for g, nxt in succ:
            if not self._inB(an.B, f + 1, cg.approx_id(nxt)):
                continue
            if tail_only:
                # a deadline firing here ends the call (ConstraintTimeoutError): the row is exact or not answered
                if not self._fits(nxt, cap):
                    continue
            passing.append((g, nxt))
        if not tail_only and len(passing) <= self.refine_groups:
            # right of f the B sets are approximate: decide each group by a witness search from f+1
            srch = self._witness_search(c, an, self.refine_budget)
            kept = []
            total = 4 * self.refine_budget
            for g, nxt in passing:
                if total <= 0:  # out of refinement budget (or time): keep the rest (sound)
                    kept.append((g, nxt))
                    continue
                srch.exhaustive = True
                allot = min(self.refine_budget, total)
                srch.budget = allot
                found = srch.run(f + 1, nxt) is not None
                total -= allot - max(srch.budget, 0) + 1
                if found or not srch.exhaustive:
                    kept.append((g, nxt))
            passing = kept
        for g, _nxt in passing:
            sel[g] = True
        if sel.any():
            row[lt.tokens[sel[lt.group_of]]] = True
        # EOS at f: the text ends here
        if (an.last_text < f) and cg.accepts_end(cfg):
            row[self.eos] = True
        row = np.packbits(row, bitorder="little")
        self._rows[key] = row
        if len(self._rows) > 64:
            self._rows.popitem(last=False)
        return row

    def _fits(self, cfg: Config, cap: int) -> bool:
        """A completion of cfg fits in cap more tokens (exact up to the concrete completion's optimality)."""
        cg = self.cg
        if cg.accepts_end(cfg):
            return True
        if cap <= 0:
            return False
        est = cg.completion_estimate(cfg)
        if est >= INF:
            return False
        if cg.vocab.single_bytes:
            # every byte is a token: the concrete (exactly checked) completion spells in as many tokens as bytes
            data = cg.complete_bytes(cfg)
            if data is not None and len(data) <= cap:
                return True
        toks = cg.complete_tokens(cfg)
        if toks is not None and len(toks) <= cap:
            return True
        toks, exhaustive, _used = cg.token_completion(cfg, cap, budget=self.refine_budget)
        return toks is not None or not exhaustive  # inconclusive: keep it (sound)

    def _approx_row(self, an: Analysis, p: int) -> np.ndarray:
        """The approximate mask row right of the frontier (packed bytes): tokens from (F[p] & B[p]) into B[p+1],
        TOP (every text token) where a set is TOP or would need cold vocabulary walks."""
        F, B = an.F, an.B
        Fi = F[p] if p < len(F) else None
        Bi = B[p] if p < len(B) else None
        Bn = B[p + 1] if p + 1 < len(B) else None
        if Fi is not None and Bi is not None:
            S = Fi & Bi
        elif Fi is not None:
            S = Fi
        else:
            S = Bi
        key = ("a", S, Bn)
        row = self._rows.get(key)
        if row is not None:
            self._rows.move_to_end(key)
            return row
        ap = self.approx
        if S is None:
            row = self._text_bits().copy()
            # EOS: allowed unless committed text follows
            if an.last_text < p:
                set_token(row, self.eos)
        else:
            packed = None
            by_q: dict[int, list[int]] = {}
            eos_ok = False
            ended_next = Bn is None or ENDED in Bn
            for a in S:
                if a == ENDED:
                    eos_ok = eos_ok or ended_next
                    continue
                if ended_next and ap.accepting(a):
                    eos_ok = True
                by_q.setdefault(a // ap.P, []).append(a)
            cold = [q for q in by_q if q not in self._warmed]
            if cold and not all(self._warm(q) for q in cold):
                row = self._text_bits().copy()  # TOP rather than many cold vocabulary walks (sound; not cached)
                if an.last_text < p:
                    set_token(row, self.eos)
                return row
            for q, aa in by_q.items():
                check_active(None, "computing the mask at position %d", p)
                lt = self.cg.lexer.trans(q)
                if lt.n_groups == 0:
                    continue
                sel = np.zeros(lt.n_groups, dtype=bool)
                for a in aa:
                    sel |= ap.trans(a).select(Bn)
                if sel.any():
                    bits = self.cg.group_bits(q, lt, sel)
                    if packed is None:
                        packed = bits.copy()
                    else:
                        np.bitwise_or(packed, bits, out=packed)
            row = np.zeros((self.vocab_size + 7) // 8, dtype=np.uint8) if packed is None else packed
            if eos_ok and an.last_text < p:
                set_token(row, self.eos)
        self._rows[key] = row
        if len(self._rows) > 64:
            self._rows.popitem(last=False)
        return row

