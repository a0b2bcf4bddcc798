"""GrammarCanvasState: the CanvasConstraint of a Lark grammar on one fixed-length canvas.

  frontier f      the first open position; the committed prefix is parsed exactly (LALR stack + pending lexeme),
                  cached position by position (`_prefix`)
  masks           exact at f; right of f from forward/backward sets of approx.py's regular over-approximation
                  (sound; sets larger than `set_cap` become TOP): canvas_sets.py, canvas_rows.py
  completability  decided by a witness, a full assignment whose text parses, searched depth first within a node
                  budget (canvas_search.py); a canvas is reported completable only with a witness in hand
  termination     when a step's proposals are all refused, the next frontier mask is narrowed to the witness's token
  time            every public call runs under the request's deadline, the last resort: answers are bounded by
                  work (set_cap, node budgets, `cold_walks`), and a call that reaches it raises
                  ConstraintTimeoutError (no answer is loosened by the clock)

docs/grammars.md, "How it works", has the whole argument.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from dllm_constrain.kernels.bitmask import bitmask_bytes, row_tokens, set_token, write_row

from ...errors import ConstraintTimeoutError, ConstraintTooLongError, InvalidRequestError
from ..call_bounds import DEFAULT_CALL_TIMEOUT_S
from ..deadline import CallDeadline, activate
from ..protocol import CanvasConstraint
from .canvas_rows import GrammarRows
from .canvas_search import WitnessSearch
from .canvas_sets import ENDED, Analysis, GrammarSets  # noqa: F401  (ENDED, Analysis: re-exported)
from .configuration import Config

if TYPE_CHECKING:  # annotations only: grammar.py imports this module to build canvas states
    from .grammar import CompiledGrammar


class GrammarCanvasState(GrammarSets, GrammarRows, CanvasConstraint):
    """CanvasConstraint of a compiled Lark grammar for one canvas length (see the module docstring): the exact
    prefix parse, the witness and the protocol here; the approximate sets in canvas_sets.py, the mask rows in
    canvas_rows.py, the witness search in canvas_search.py."""

    def __init__(self, cg: CompiledGrammar, canvas_len: int, *, set_cap: int = 600, search_budget: int = 3000,
                 refine_groups: int = 32, refine_budget: int = 150, cold_walks: int = 2,
                 verify_with_lark: bool = True, timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S):
        if canvas_len <= 0:
            raise InvalidRequestError(f"the canvas length must be a positive integer, got {canvas_len}")
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
        self._warmed: set[int] = set()  # lexer states this request walked (canvas_sets._warm): its own, not the cache's
        self.verify_with_lark = verify_with_lark
        # per call: a hard time limit (None = unbounded), see "Time bounds" in docs/constraints.md
        self.timeout_s = timeout_s
        self.kind = "grammar"
        self.stats = {"searches": 0, "search_nodes": 0, "search_failures": 0, "witness_forced": 0,
                      "lark_rejections": 0, "deadline_hits": 0}
        self._prefix_c: tuple = ()
        self._prefix_cfgs: list[Config | None] = [cg.initial]
        self._an: Analysis | None = None
        self._stall = False
        self._rows: OrderedDict = OrderedDict()
        self._open_memo: dict = {}
        self._back_memo: dict = {}
        self._tok_memo: dict = {}
        self._fin_true: dict[int, int] = {}
        self._fin_false: dict[int, int] = {}
        self.witness: list[int] | None = None  # none until the first search below finds one
        w = self._search(tuple([None] * self.n))
        if w is None:
            raise ConstraintTooLongError(int(cg.min_tokens()), self.n)
        self.witness = w

    # ------------------------------------------------------------------ time bounds
    def _deadline(self, operation: str, c: tuple) -> _CallScope:
        """The scope of one public call: its deadline active for this thread, a timeout counted in stats."""
        return _CallScope(self, CallDeadline(self.timeout_s, self.kind, operation, lambda: self._where(c)))

    def _where(self, c: tuple) -> str:
        """The request-level location for a timeout message: the canvas frontier and the text committed before it
        (its last characters), where the grammar's parse stood."""
        frontier = next((i for i, x in enumerate(c) if x is None), None)
        if frontier is None:
            return f"a full canvas of {self.n} positions"
        tb = self.cg.tokenizer_info.token_bytes
        data = b"".join(tb[t] or b"" for t in c[:frontier]
                        if t is not None and t != self.eos and 0 <= t < len(tb))
        tail = data[-24:].decode("utf-8", "replace")
        return f"canvas frontier at position {frontier} of {self.n}, after the text ...{tail!r}"

    # ------------------------------------------------------------------ canvas helpers
    def _norm(self, canvas: Sequence[int]) -> tuple:
        if isinstance(canvas, torch.Tensor):
            canvas = canvas.tolist()
        if len(canvas) != self.n:
            raise InvalidRequestError(f"the canvas has {len(canvas)} positions, but this constraint state was "
                                      f"made for a canvas of {self.n} positions")
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
        srch = self._witness_search(c, an, self.search_budget)
        rest = srch.run(f, cfg)
        if rest is None:
            self.stats["search_failures"] += 1
            return None
        w = list(c[:f]) + rest
        if not self._lark_ok(w):
            return None
        return w

    def _witness_search(self, c: tuple, an: Analysis, budget: int) -> WitnessSearch:
        """A witness search over canvas c within `budget` nodes, the current witness's tokens tried first."""
        return WitnessSearch(self.cg, c, an, budget, n=self.n, eos=self.eos, prefer=self.witness, stats=self.stats)

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
    # ------------------------------------------------------------------ CanvasConstraint (protocol.py)
    @property
    def canvas_len(self) -> int:
        return self.n

    offers_prefix_hint = False  # its prefix parse costs a mask row's work: the engine probes the frontier instead

    def shared_state(self) -> CompiledGrammar:
        """The compiled grammar (its lexer, parser and memo tables), shared by its requests."""
        return self.cg

    def prefix_hint(self, canvas: Sequence[int], position: int) -> int | None:
        """None: no cheap prefix hint (`offers_prefix_hint` is False)."""
        return None

    def is_completable(self, canvas: Sequence[int]) -> bool:
        c = self._norm(canvas)
        self._cold_left = self.cold_walks
        with self._deadline("is_completable", c):
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
        with self._deadline("select_commits", tuple(c)):
            self._select(c, proposals, order, kept)
        if proposals and not kept:
            self._stall = True
        return kept

    def _select(self, c: list, proposals: Sequence[tuple[int, int, float]], order: list[int],
                kept: list[tuple[int, int]]) -> None:
        """Greedy in `order`: keep each proposal whose commit leaves the canvas completable (appends to kept)."""
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

    def forced_tokens(self, canvas: Sequence[int]) -> dict[int, int]:
        c = self._norm(canvas)
        self._cold_left = self.cold_walks
        with self._deadline("forced_tokens", c):
            return self._forced(c)

    def _forced(self, c: tuple) -> dict[int, int]:
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
        idx = row_tokens(self._frontier_row(c, an), self.vocab_size)
        if idx.size == 1 and int(idx[0]) == self.witness[f]:
            return {f: int(idx[0])}
        return {}

    def fill_token_bitmask(self, canvas: Sequence[int], positions: Sequence[int], out: torch.Tensor) -> None:
        """The masks as rows 0..len(positions)-1 of the token bitmask `out` (protocol.CanvasConstraint)."""
        positions = [int(p) for p in positions]
        o = bitmask_bytes(out[:len(positions)])
        o[:] = 0
        c = self._norm(canvas)
        with self._deadline("fill_token_bitmask", c):
            self._masks_into(c, positions, o)

    def allowed_tokens(self, canvas: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Bool [len(positions), vocab_size]: the rows `fill_token_bitmask` writes, unpacked."""
        positions = [int(p) for p in positions]
        out = torch.zeros((len(positions), self.vocab_size), dtype=torch.bool)
        c = self._norm(canvas)
        o = out.numpy()
        with self._deadline("allowed_tokens", c):
            self._masks_into(c, positions, o)
        return out

    def _masks_into(self, c: tuple, positions: list[int], o: np.ndarray) -> None:
        """The masks into the zeroed mask rows `o` (bool [n, V] or bitmask bytes [n, 4 W]): committed positions
        their own token, the frontier its exact row, positions right of it their approximate row."""
        self._cold_left = self.cold_walks
        if not positions:
            return
        an = self._analyze(c, max(positions) + 1)
        if not an.valid:
            return
        for j, p in enumerate(positions):
            if not 0 <= p < self.n:
                raise IndexError(f"position {p} outside the canvas of length {self.n}")
            if c[p] is not None:
                set_token(o[j], c[p])
                continue
            if p < an.f:
                continue
            if p == an.f:
                if self._stall and self._consistent(c) and self.witness[p] != self.mask_id:
                    # the previous step's proposals were all refused: narrow the frontier to the witness's
                    # token, which the engine then commits as forced (progress at least every other step)
                    self._stall = False
                    self.stats["witness_forced"] += 1
                    set_token(o[j], self.witness[p])
                    continue
                write_row(o[j], self._frontier_row(c, an))
            else:
                write_row(o[j], self._approx_row(an, p))

    # ------------------------------------------------------------------ extras
    def allowed_sets(self, canvas: Sequence[int]) -> list[set[int] | None]:
        """Debug/test helper: allowed token ids per position (None for committed positions)."""
        c = self._norm(canvas)
        rows = self.allowed_tokens(list(canvas), list(range(self.n)))
        return [None if c[i] is not None else set(np.flatnonzero(rows[i].numpy()).tolist()) for i in range(self.n)]



class _CallScope:
    """`with state._deadline(operation, c):` activates the call's deadline for this thread and counts a timeout
    in the state's stats (the error itself propagates to the public call, which answers soundly or re-raises)."""

    __slots__ = ("st", "scope")

    def __init__(self, st: GrammarCanvasState, d: CallDeadline):
        self.st = st
        self.scope = activate(d)

    def __enter__(self) -> CallDeadline | None:
        return self.scope.__enter__()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.scope.__exit__(exc_type, exc, tb)
        if exc_type is not None and issubclass(exc_type, ConstraintTimeoutError):
            self.st.stats["deadline_hits"] += 1
