"""GrammarCanvasState: the CanvasConstraint of a Lark grammar on one fixed-length canvas.

Canvas c[0..n-1] (open positions = None). Valid: the tokens before the first EOS spell a sentence of the
grammar, everything after it is EOS.

* Frontier f = first open position. The committed prefix c[0..f-1] is parsed exactly (LALR stack + pending
  lexeme, so tokens that split a lexeme are handled) and cached position by position.
* Right of f, positions are tracked with the regular over-approximation of approx.py: forward sets F[i] of
  approximate states from the frontier's state, backward sets B[i] of the states from which the rest of the
  canvas (its committed tokens, its length, the EOS tail) is still reachable. Sets larger than `set_cap`
  become TOP (everything): masks there are sound but loose.
* Mask at f (exact): token t is allowed iff the exact parser accepts what t emits, its pending lexeme can
  still end as an acceptable terminal, its approximate state is in B[f+1], and, when nothing but the EOS tail
  follows, a concrete completion fits in the positions left. Masks right of f: approximate (sound).
* Completability is decided by a *witness*: a full assignment of the open positions whose text parses
  (built concretely, checked with the exact machinery, and optionally with Lark itself). `is_completable`
  keeps the current witness when it agrees with the canvas, else searches a new one (depth-first over token
  groups from the frontier, pruned by the exact parser and the B sets, bounded by a node budget). A canvas is
  only ever reported completable with a witness in hand, so a committed canvas can always be finished, and
  the final canvas is the witness itself: it parses. When the search gives up (budget) the answer is False
  (conservative): the engine then re-masks or backtracks the step.
* Termination: when a step's proposals are all refused, the next mask at the frontier is narrowed to the
  witness's token (counted in `stats["witness_forced"]`), which the engine commits as a forced token (and
  `forced_tokens` reports it too), so the frontier advances at least every other step.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

from ...errors import ConstraintTooLongError
from ..bounds import INF
from .grammar import CompiledGrammar, Config
from .lexer import START

ENDED = -1


class _Budget(Exception):
    pass


class _Analysis:
    __slots__ = ("c", "f", "cfg", "e_star", "last_text", "F", "B", "H", "valid")

    def __init__(self):
        self.valid = True


class GrammarCanvasState:
    def __init__(self, cg: CompiledGrammar, canvas_len: int, *, set_cap: int = 600, search_budget: int = 3000,
                 refine_groups: int = 32, refine_budget: int = 150, cold_walks: int = 2,
                 verify_with_lark: bool = True):
        if canvas_len <= 0:
            raise ValueError("canvas_len must be positive")
        self.cg = cg
        self.n = int(canvas_len)
        self.mask_id = cg.mask_id
        self.eos = cg.eos_id
        self.vocab_size = cg.vocab_size
        self.approx = cg.approx
        self.set_cap = set_cap
        self.search_budget = search_budget
        self.refine_groups = refine_groups
        self.refine_budget = refine_budget
        self.cold_walks = cold_walks
        self._cold_left = cold_walks
        self.verify_with_lark = verify_with_lark
        self.stats = {"searches": 0, "search_nodes": 0, "search_failures": 0, "witness_forced": 0,
                      "lark_rejections": 0}
        self._prefix_c: tuple = ()
        self._prefix_cfgs: list[Config | None] = [cg.initial]
        self._an: _Analysis | None = None
        self._stall = False
        self._rows: OrderedDict = OrderedDict()
        self._open_memo: dict = {}
        self._back_memo: dict = {}
        self._tok_memo: dict = {}
        self._fin_true: dict[int, int] = {}
        self._fin_false: dict[int, int] = {}
        w = self._search(tuple([None] * self.n))
        if w is None:
            raise ConstraintTooLongError(int(cg.min_tokens()), self.n)
        self.witness: list[int] = w

    # ------------------------------------------------------------------ canvas helpers
    def _norm(self, canvas: Sequence[int]) -> tuple:
        if isinstance(canvas, torch.Tensor):
            canvas = canvas.tolist()
        if len(canvas) != self.n:
            raise ValueError(f"canvas has length {len(canvas)}, this constraint state was made for {self.n}")
        m = self.mask_id
        return tuple(None if c == m else int(c) for c in canvas)

    def _prefix(self, c: tuple) -> tuple[int, Config | None]:
        """(f, exact config after c[0..f-1]) where f is the first open or EOS position (or the first position
        at which the prefix stops being viable; then the config is None)."""
        prev = self._prefix_c
        cfgs = self._prefix_cfgs
        k = 0
        lim = min(len(prev), len(cfgs) - 1)
        while k < lim and prev[k] == c[k]:
            k += 1
        cfgs = cfgs[:k + 1]
        i = k
        cg = self.cg
        while i < self.n and c[i] is not None and c[i] != self.eos and cfgs[i] is not None:
            cfgs.append(cg.step(cfgs[i], c[i]))
            i += 1
        self._prefix_c = c[:i]
        self._prefix_cfgs = cfgs
        if cfgs[i] is None:
            return i, None
        return i, cfgs[i]

    def _structure(self, c: tuple) -> tuple[bool, int, int]:
        """(valid, e_star = first committed EOS or n, last committed text position before e_star or -1)."""
        e_star = self.n
        for i, x in enumerate(c):
            if x == self.eos:
                e_star = i
                break
        for i in range(e_star + 1, self.n):
            if c[i] is not None and c[i] != self.eos:
                return False, e_star, -1
        last = -1
        for i in range(e_star - 1, -1, -1):
            if c[i] is not None:
                last = i
                break
        return True, e_star, last

    # ------------------------------------------------------------------ approximate sets
    def _step_open(self, F):
        if F is None:
            return None
        r = self._open_memo.get(F)
        if r is not None or F in self._open_memo:
            return r
        ap = self.approx
        out: set[int] = set()
        ended = False
        for a in F:
            if a == ENDED:
                ended = True
                continue
            if not self._warm(a // ap.P):
                return None  # not worth a cold vocabulary walk now: TOP (sound); not memoised
            out |= ap.succ(a)
            if not ended and ap.accepting(a):
                ended = True
            if len(out) > self.set_cap:
                self._open_memo[F] = None
                return None
        if ended:
            out.add(ENDED)
        r = frozenset(out)
        self._open_memo[F] = r
        return r

    def _step_tok(self, F, t: int):
        if F is not None:
            k = (F, t)
            r = self._tok_memo.get(k)
            if r is None:
                r = self._step_tok_uncached(F, t)
                if len(self._tok_memo) > 8192:
                    self._tok_memo.clear()
                self._tok_memo[k] = r
            return r
        return self._step_tok_uncached(F, t)

    def _step_tok_uncached(self, F, t: int):
        ap = self.approx
        if t == self.eos:
            if F is None:
                return frozenset({ENDED})
            return frozenset({ENDED}) if any(a == ENDED or ap.accepting(a) for a in F) else frozenset()
        if F is None:
            return None
        out = set()
        for a in F:
            if a == ENDED:
                continue
            b = ap.delta(a, t)
            if b >= 0:
                out.add(b)
        return frozenset(out)

    def can_finish(self, a: int, m: int) -> bool:
        """Approximate state a can reach the end within m tokens (a sound 'True' for large m)."""
        ap = self.approx
        if a == ENDED or ap.accepting(a):
            return True
        if m <= 0:
            return False
        if m >= 8:
            return True
        t = self._fin_true.get(a)
        if t is not None and t <= m:
            return True
        f = self._fin_false.get(a)
        if f is not None and f >= m:
            return False
        frontier = {a}
        seen = {a}
        ok = False
        lx = self.cg.lexer
        for _k in range(m):
            nxt = set()
            for s in frontier:
                if not lx.has_trans(s // ap.P) and not self._warm(s // ap.P):
                    return True  # undecided without a cold vocabulary walk: sound answer
                for u in ap.succ(s):
                    if u in seen:
                        continue
                    if ap.accepting(u):
                        ok = True
                        break
                    seen.add(u)
                    nxt.add(u)
                if ok:
                    break
            if ok or not nxt or len(seen) > 20000:
                ok = ok or len(seen) > 20000
                break
            frontier = nxt
        if ok:
            self._fin_true[a] = min(m, self._fin_true.get(a, INF))
        else:
            self._fin_false[a] = max(m, self._fin_false.get(a, -1))
        return ok

    def _analyze(self, c: tuple, horizon: int = 0) -> _Analysis:
        an = self._an
        if an is not None and an.c == c and an.H >= min(self.n, horizon):
            return an
        an = _Analysis()
        an.c = c
        ok, e_star, last = self._structure(c)
        an.e_star, an.last_text = e_star, last
        f, cfg = self._prefix(c)
        an.f, an.cfg = f, cfg
        if not ok or cfg is None:
            an.valid = False
            an.F = an.B = []
            an.H = self.n
            self._an = an
            return an
        n = self.n
        H = min(n, max(last + 1, horizon, f))
        for i in range(H, n):  # committed EOS after the horizon bound the tail: include it
            if c[i] is not None:
                H = max(H, i + 1)
        F: list = [None] * (H + 1)
        F[f] = frozenset({self.cg.approx_id(cfg)})
        for i in range(f, H):
            F[i + 1] = self._step_open(F[i]) if c[i] is None else self._step_tok(F[i], c[i])
        B: list = [frozenset()] * (H + 1)
        rem = n - H
        if F[H] is None:
            B[H] = None
        else:
            B[H] = frozenset(a for a in F[H] if self.can_finish(a, rem))
        ap = self.approx
        for i in range(H - 1, f - 1, -1):
            nb = B[i + 1]
            Fi = F[i]
            if nb is None:
                B[i] = Fi
                continue
            if not nb:
                for j in range(f, i + 1):
                    B[j] = frozenset()
                break
            if Fi is None:
                B[i] = None
                continue
            ci = c[i]
            ended_ok = ENDED in nb
            if ci is None:
                bk = (Fi, nb)
                r = self._back_memo.get(bk)
                if r is None:
                    r = frozenset(a for a in Fi if (a == ENDED and ended_ok) or (
                        a != ENDED and ((ended_ok and ap.accepting(a)) or not ap.succ(a).isdisjoint(nb))))
                    if len(self._back_memo) > 4096:
                        self._back_memo.clear()
                    self._back_memo[bk] = r
                B[i] = r
            elif ci == self.eos:
                B[i] = frozenset(a for a in Fi if a == ENDED or ap.accepting(a)) if ended_ok else frozenset()
            else:
                B[i] = frozenset(a for a in Fi if a != ENDED and ap.delta(a, ci) in nb)
        an.F, an.B, an.H = F, B, H
        self._an = an
        return an

    def _warm(self, q: int) -> bool:
        """True if lexer state q's vocabulary walk is cached or may be computed now (a few per call)."""
        if self.cg.lexer.has_trans(q):
            return True
        if self._cold_left > 0:
            self._cold_left -= 1
            return True
        return False

    @staticmethod
    def _inB(B, i: int, a: int) -> bool:
        if i >= len(B):
            return True
        b = B[i]
        return b is None or a in b

    # ------------------------------------------------------------------ witness search
    def _search(self, c: tuple) -> list[int] | None:
        self.stats["searches"] += 1
        an = self._analyze(c, 0)
        if not an.valid:
            return None
        f, cfg = an.f, an.cfg
        n = self.n
        if f < n and c[f] == self.eos:
            # the text is fixed: it ends at f
            if not self.cg.accepts_end(cfg):
                return None
            w = [x for x in c[:f]] + [self.eos] * (n - f)
            return w if self._lark_ok(w) else None
        srch = _Search(self, c, an, self.search_budget)
        rest = srch.run(f, cfg)
        if rest is None:
            self.stats["search_failures"] += 1
            return None
        w = list(c[:f]) + rest
        if not self._lark_ok(w):
            return None
        return w

    def _lark_ok(self, w: list[int]) -> bool:
        if not self.verify_with_lark:
            return True
        ids = []
        for t in w:
            if t == self.eos:
                break
            ids.append(t)
        tb = self.cg.tokenizer_info.token_bytes
        try:
            text = b"".join(tb[t] for t in ids).decode("utf-8")
        except (UnicodeDecodeError, TypeError):
            self.stats["lark_rejections"] += 1
            return False
        ok = self.cg.lark_parses(text)
        if not ok:
            self.stats["lark_rejections"] += 1
        return ok

    def _consistent(self, c: tuple) -> bool:
        w = self.witness
        return all(x is None or x == y for x, y in zip(c, w))

    # ------------------------------------------------------------------ protocol
    def is_completable(self, canvas: Sequence[int]) -> bool:
        c = self._norm(canvas)
        self._cold_left = self.cold_walks
        ok = self._completable(c)
        if not ok:
            self._stall = True
        return ok

    def _completable(self, c: tuple) -> bool:
        if self._consistent(c):
            return True
        w = self._search(c)
        if w is None:
            return False
        self.witness = w
        return True

    def select_commits(self, canvas: Sequence[int], proposals: Sequence[tuple[int, int, float]]) -> list[tuple[int, int]]:
        c = list(self._norm(canvas))
        self._cold_left = self.cold_walks
        order = sorted(range(len(proposals)), key=lambda k: -float(proposals[k][2]))
        kept: list[tuple[int, int]] = []
        for k in order:
            p, t, _ = proposals[k]
            p, t = int(p), int(t)
            if not 0 <= p < self.n or c[p] is not None or t == self.mask_id or t < 0:
                continue
            c[p] = t
            if self._completable(tuple(c)):
                kept.append((p, t))
            else:
                c[p] = None
        if proposals and not kept:
            self._stall = True
        return kept

    def forced_tokens(self, canvas: Sequence[int]) -> dict[int, int]:
        c = self._norm(canvas)
        self._cold_left = self.cold_walks
        an = self._analyze(c, 0)
        if not an.valid or an.f >= self.n or c[an.f] is not None:
            return {}
        f = an.f
        if not self._consistent(c):
            if not self._completable(c):
                return {}
        if self._stall:
            self._stall = False
            self.stats["witness_forced"] += 1
            return {f: self.witness[f]}
        row = self._frontier_row(c, an)
        idx = np.flatnonzero(row)
        if idx.size == 1 and int(idx[0]) == self.witness[f]:
            return {f: int(idx[0])}
        return {}

    def allowed_tokens(self, canvas: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        c = self._norm(canvas)
        self._cold_left = self.cold_walks
        positions = [int(p) for p in positions]
        out = torch.zeros((len(positions), self.vocab_size), dtype=torch.bool)
        if not positions:
            return out
        an = self._analyze(c, max(positions) + 1)
        o = out.numpy()
        if not an.valid:
            return out
        for j, p in enumerate(positions):
            if not 0 <= p < self.n:
                raise IndexError(f"position {p} outside the canvas of length {self.n}")
            if c[p] is not None:
                o[j, c[p]] = True
                continue
            if p < an.f:
                continue
            if p == an.f:
                if self._stall and self._consistent(c) and self.witness[p] != self.mask_id:
                    # the previous step's proposals were all refused: narrow the frontier to the witness's
                    # token, which the engine then commits as forced (progress at least every other step)
                    self._stall = False
                    self.stats["witness_forced"] += 1
                    o[j, self.witness[p]] = True
                    continue
                o[j] = self._frontier_row(c, an)
            else:
                o[j] = self._approx_row(an, p)
        return out

    # ------------------------------------------------------------------ rows
    def _frontier_row(self, c: tuple, an: _Analysis) -> np.ndarray:
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
            if tail_only and not self._fits(nxt, cap):
                continue
            passing.append((g, nxt))
        if not tail_only and len(passing) <= self.refine_groups:
            # right of f the B sets are approximate: decide each group by a witness search from f+1
            srch = _Search(self, c, an, self.refine_budget)
            kept = []
            total = 4 * self.refine_budget
            for g, nxt in passing:
                if total <= 0:  # out of refinement budget: keep the rest (sound)
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

    def _approx_row(self, an: _Analysis, p: int) -> np.ndarray:
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
            row = self.cg.text_row.copy()
            # EOS: allowed unless committed text follows
            if an.last_text < p:
                row[self.eos] = True
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
            cold = [q for q in by_q if not self.cg.lexer.has_trans(q)]
            if cold and not all(self._warm(q) for q in cold):
                row = self.cg.text_row.copy()  # TOP rather than many cold vocabulary walks (sound; not cached)
                if an.last_text < p:
                    row[self.eos] = True
                return row
            for q, aa in by_q.items():
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
            if packed is None:
                row = np.zeros(self.vocab_size, dtype=bool)
            else:
                row = np.unpackbits(packed, bitorder="little", count=self.vocab_size).view(bool)
            if eos_ok and an.last_text < p:
                row[self.eos] = True
        self._rows[key] = row
        if len(self._rows) > 64:
            self._rows.popitem(last=False)
        return row

    # ------------------------------------------------------------------ extras
    def allowed_sets(self, canvas: Sequence[int]) -> list[set[int] | None]:
        """Debug/test helper: allowed token ids per position (None for committed positions)."""
        c = self._norm(canvas)
        rows = self.allowed_tokens(list(canvas), list(range(self.n)))
        return [None if c[i] is not None else set(np.flatnonzero(rows[i].numpy()).tolist()) for i in range(self.n)]


class _Search:
    """Depth-first witness search over one canvas: token groups at open positions (exact parser, pruned by the
    B sets), committed tokens stepped exactly, the tail closed by the concrete completion or a token-level
    breadth-first search. `exhaustive` stays True unless a budget cut the search short (then a None result
    proves nothing)."""

    def __init__(self, st: GrammarCanvasState, c: tuple, an: _Analysis, budget: int):
        self.st = st
        self.cg = st.cg
        self.c = c
        self.an = an
        self.n = st.n
        self.eos = st.eos
        self.budget = budget
        self.failed: set = set()
        self.exhaustive = True
        w = getattr(st, "witness", None)
        self.prefer = w

    def run(self, i: int, cfg: Config) -> list[int] | None:
        try:
            return self.fill(i, cfg)
        except (_Budget, RecursionError):
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
            if nxt is None or not GrammarCanvasState._inB(an.B, i + 1, self.cg.approx_id(nxt)):
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
                if nn is None or not GrammarCanvasState._inB(an.B, i + 2, self.cg.approx_id(nn)):
                    continue
            self.budget -= 1
            self.st.stats["search_nodes"] += 1
            if self.budget < 0:
                raise _Budget
            rest = self.fill(i + 1, nxt)
            if rest is not None:
                return [tok] + rest
        self.failed.add(key)
        return None
