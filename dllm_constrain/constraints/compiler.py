"""ConstraintCompiler -> CompiledConstraint -> CanvasState (one per request).

Compilation is cached per (constraint, options, tokenizer): a module-level LRU keyed by the tokenizer's
fingerprint, so two compilers over the same tokenizer share results, and compiling the same constraint
twice costs a dictionary lookup. Errors are cached too (re-raised as-is).
"""
from __future__ import annotations

import gc
import json
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from ..errors import ConstraintTimeoutError, ConstraintTooLongError, InvalidRegexError, UnsatisfiableSchemaError
from . import regex_ast as A
from .canvas import DEFAULT_CALL_TIMEOUT_S, CanvasState, SetAlgebra
from .deadline import CallDeadline, Deadline, activate
from .deriv import DEAD, START, DerivDFA
from .bounds import INF
from .regex_parser import parse_regex
from .token_automaton import TokenAutomaton
from .tokenizer_info import TokenizerInfo

DEFAULT_TIMEOUT_S = 10.0
_COMPILER_DEFAULT: Any = object()  # compile_*(timeout_s=...) not given: the compiler's timeout_s


class CompiledConstraint:
    """A regular constraint compiled against one tokenizer. Thread-safe to share between requests."""

    def __init__(self, kind: str, source: Any, node: A.Node, tok: TokenizerInfo, deadline: Deadline,
                 max_dfa_states: int = 500_000):
        self.kind = kind
        self.source = source
        self.tokenizer_info = tok
        self.node = node
        self.dfa = DerivDFA(node, deadline, max_states=max_dfa_states)
        self.dfa.expand(START)
        # lazy expansion after compilation is bounded by max_states only
        self.dfa.deadline = None
        self.dfa.terms.deadline = None
        self.ta = TokenAutomaton(self.dfa, tok)
        self.algebra = SetAlgebra(self.ta)
        self._min_tokens: int | None = None
        self._lock = threading.Lock()
        # (JSON pointer, keyword) of the schema keywords that were not enforced (outside the JSON Schema
        # vocabularies: `x-*`, `nullable`, typos); see the `unknown_keywords` option
        self.ignored_keywords: tuple[tuple[str, str], ...] = ()

    def __repr__(self) -> str:
        src = self.source if isinstance(self.source, str) else json.dumps(self.source)[:60]
        return f"CompiledConstraint({self.kind}, {src[:60]!r}, dfa_states_so_far={self.dfa.n_states})"

    @property
    def vocab_size(self) -> int:
        return self.tokenizer_info.vocab_size

    @property
    def eos_id(self) -> int:
        return self.tokenizer_info.eos_id

    @property
    def mask_id(self) -> int | None:
        return self.tokenizer_info.mask_id

    @property
    def empty_language(self) -> bool:
        return self.dfa.empty_language

    # ------------------------------------------------------------------ lengths
    def min_bytes(self) -> int:
        """Length in bytes of the shortest accepted text."""
        return int(self.dfa.dist[START])

    def min_tokens(self, timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S) -> int:
        """Fewest tokens spelling an accepted text (EOS not counted: a canvas of exactly this many
        positions fits it; longer canvases pad with EOS). Within timeout_s (None: unbounded); when the search
        runs out of time the answer is a lower bound (not memoised), so a request that fits is never refused."""
        if self._min_tokens is not None:
            return self._min_tokens
        with self._lock:
            if self._min_tokens is None:
                with activate(CallDeadline(timeout_s, self.kind, "min_tokens")):
                    r, exact = self._compute_min_tokens()
                if not exact:
                    return r
                self._min_tokens = r
        return self._min_tokens

    def _compute_min_tokens(self, budget: int = 256) -> tuple[int, bool]:
        """Breadth-first search over token successors. Exact when it finishes within `budget` token-
        transition computations (memoised); otherwise a lower bound (so that a request that fits is never
        refused). A call deadline firing gives the lower bound reached so far (not memoised: (bound, False))."""
        dfa, ta = self.dfa, self.ta
        if self.empty_language:
            return INF, True
        if dfa.accepting[START]:
            return 0, True
        bound = int(dfa.dist[START]) if ta.single_byte_complete else INF
        L = max(1, ta.max_token_len)
        seen_k = [0, {START}]
        try:
            return self._min_tokens_bfs(budget, bound, L, seen_k), True
        except ConstraintTimeoutError:
            k, frontier = seen_k
            lb = max(k, -(-int(min(dfa.dist[x] for x in frontier)) // L) + k - 1) if frontier else k
            return max(1, min(lb, bound)), False

    def _min_tokens_bfs(self, budget: int, bound: int, L: int, seen_k: list) -> int:
        dfa, ta = self.dfa, self.ta
        frontier = {START}
        seen = {START}
        k = 0
        spent = 0
        while frontier and k < bound:
            seen_k[0], seen_k[1] = k, frontier
            k += 1
            nxt = set()
            for s in frontier:
                if s not in ta.succ_bits:
                    spent += 1
                    if spent > budget:
                        # lower bound: k tokens so far, and no token is longer than L bytes
                        lb = max(k, -(-int(min(dfa.dist[x] for x in frontier)) // L) + k - 1)
                        return min(lb, bound)
                for u in ta.succ(s):
                    if u not in seen:
                        if dfa.accepting[u]:
                            return k
                        seen.add(u)
                        nxt.add(u)
            frontier = nxt
        return bound if bound < INF else INF

    def fits(self, canvas_len: int, timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S) -> bool:
        """False only when provably no accepted text fits in canvas_len tokens (undecided within timeout_s:
        True, the request is not refused)."""
        n = int(canvas_len)
        if self.empty_language:
            return False
        if self.ta.single_byte_complete and int(self.dfa.dist[START]) <= n:
            return True
        from .canvas import Budget

        limit = 2.0 if timeout_s is None else min(2.0, timeout_s)
        try:
            with activate(CallDeadline(timeout_s, self.kind, f"checking that an output fits {n} tokens")):
                r = self.algebra.finish3(START, n, Budget(4000, 0.5 * limit))
        except ConstraintTimeoutError:
            return True
        return r is None or bool(r)

    # ------------------------------------------------------------------ requests
    def new_canvas_state(self, canvas_len: int, expand_budget: int | None = 128,
                         expand_time_s: float | None = None,
                         timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S) -> CanvasState:
        """Per-request CanvasConstraint for a canvas of `canvas_len` positions.
        Raises ConstraintTooLongError when even the shortest accepted text does not fit.
        expand_budget / expand_time_s: new token-transition computations / seconds spent on them per
        call (both None: unlimited, always exact; see canvas.py). timeout_s: the hard limit of every call of
        the state (and of the fit check here; None: unbounded), see "Time bounds" in docs/constraints.md."""
        canvas_len = int(canvas_len)
        if canvas_len <= 0:
            raise ValueError("canvas_len must be positive")
        if not self.fits(canvas_len, timeout_s):
            raise ConstraintTooLongError(max(self.min_tokens(timeout_s), canvas_len + 1), canvas_len)
        return CanvasState(self.algebra, canvas_len, self.mask_id, self.vocab_size, expand_budget, expand_time_s,
                           timeout_s=timeout_s, kind=self.kind)

    def matcher(self) -> "LeftToRightMatcher":
        """Autoregressive (left-to-right, unbounded length) matcher, for benchmarks and debugging."""
        return LeftToRightMatcher(self)

    def accepts_text(self, text: str | bytes) -> bool:
        data = text.encode("utf-8") if isinstance(text, str) else text
        return self.dfa.matches(data)

    def accepts_tokens(self, ids) -> bool:
        s = START
        for t in ids:
            if t == self.eos_id:
                break
            s = self.ta.delta(s, int(t))
            if s == DEAD:
                return False
        return bool(self.dfa.accepting[s])


class LeftToRightMatcher:
    def __init__(self, cc: CompiledConstraint):
        self.cc = cc
        self.state = START
        self.ended = False
        self._mask: np.ndarray | None = None

    def fill_mask(self) -> np.ndarray:
        cc = self.cc
        row = np.zeros(cc.vocab_size, dtype=bool)
        if not self.ended and self.state != DEAD:
            cc.ta.mask_row([self.state], [], bool(cc.dfa.accepting[self.state]), row)
        self._mask = row
        return row

    def is_allowed(self, tid: int) -> bool:
        return bool(self._mask[tid])

    def advance(self, tid: int) -> bool:
        if self.ended or self.state == DEAD:
            return False
        if tid == self.cc.eos_id:
            if self.cc.dfa.accepting[self.state]:
                self.ended = True
                return True
            return False
        nxt = self.cc.ta.delta(self.state, int(tid))
        if nxt == DEAD:
            return False
        self.state = nxt
        return True

    def is_accepting(self) -> bool:
        return self.ended or bool(self.cc.dfa.accepting[self.state])


# ---------------------------------------------------------------------------------- compiler
_CACHE: OrderedDict = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_MAX = 64  # compiled constraints hold their automata (up to tens of MB for huge schemas)


def clear_cache() -> None:
    with _CACHE_LOCK:
        _CACHE.clear()


class ConstraintCompiler:
    """Compiles regexes and JSON Schemas against one tokenizer (xgrammar's GrammarCompiler role)."""

    def __init__(self, tokenizer_info: TokenizerInfo, timeout_s: float | None = DEFAULT_TIMEOUT_S,
                 cache: bool = True):
        if not isinstance(tokenizer_info, TokenizerInfo):
            tokenizer_info = TokenizerInfo.from_tokenizer(tokenizer_info)
        self.tokenizer_info = tokenizer_info
        self.timeout_s = timeout_s
        self.cache = cache

    def _cached(self, key: tuple, build):
        full_key = (self.tokenizer_info.fingerprint,) + key
        if self.cache:
            with _CACHE_LOCK:
                hit = _CACHE.get(full_key)
                if hit is not None:
                    _CACHE.move_to_end(full_key)
            if hit is not None:
                if isinstance(hit, BaseException):
                    raise hit
                return hit
        gc_was_enabled = gc.isenabled()
        gc.disable()  # compilation allocates many small acyclic objects: skip the cyclic collector
        try:
            res = build()
        except (InvalidRegexError, UnsatisfiableSchemaError) as e:
            res = e
        except Exception as e:
            from ..errors import ConstraintError

            if isinstance(e, ConstraintError) and not type(e).__name__ == "CompilationTimeoutError":
                res = e
            else:
                raise
        finally:
            if gc_was_enabled:
                gc.enable()
        if self.cache:
            with _CACHE_LOCK:
                _CACHE[full_key] = res
                if len(_CACHE) > _CACHE_MAX:
                    _CACHE.popitem(last=False)
        if isinstance(res, BaseException):
            raise res
        return res

    def _timeout(self, timeout_s: Any) -> float | None:
        return self.timeout_s if timeout_s is _COMPILER_DEFAULT else timeout_s

    def compile_regex(self, pattern: str, *, timeout_s: Any = _COMPILER_DEFAULT) -> CompiledConstraint:
        """Full-match regex (Python `re` syntax, regular subset). timeout_s: this compilation's limit (default:
        the compiler's; a timeout is not cached, a later call with more time compiles again)."""
        if not isinstance(pattern, str):
            raise InvalidRegexError(f"regex must be a string, got {type(pattern).__name__}")

        limit = self._timeout(timeout_s)

        def build():
            deadline = Deadline(limit)
            node = parse_regex(pattern).node
            cc = CompiledConstraint("regex", pattern, node, self.tokenizer_info, deadline)
            if cc.empty_language:
                raise InvalidRegexError(f"regex {pattern!r} matches no string")
            return cc

        return self._cached(("regex", pattern), build)

    def compile_json_schema(self, schema, whitespace: str = "compact", *, timeout_s: Any = _COMPILER_DEFAULT,
                            **options) -> CompiledConstraint:
        """JSON Schema (dict, JSON string, pydantic model class, outlines type) -> CompiledConstraint.
        Options: see `json_schema.SchemaOptions`. timeout_s: as in compile_regex."""
        from .json_schema import SchemaOptions, normalize_schema_input, schema_to_regex_ast

        sch = normalize_schema_input(schema)
        opts = SchemaOptions.from_options(whitespace=whitespace, **options)
        key_src = json.dumps(sch, sort_keys=False, separators=(",", ":"), ensure_ascii=False, default=str)

        limit = self._timeout(timeout_s)

        def build():
            deadline = Deadline(limit)
            ignored: list = []
            node = schema_to_regex_ast(sch, opts, deadline, ignored=ignored)
            cc = CompiledConstraint("json_schema", sch, node, self.tokenizer_info, deadline)
            cc.ignored_keywords = tuple(ignored)
            if cc.empty_language:
                raise UnsatisfiableSchemaError("no JSON value satisfies the schema (within the supported bounds)")
            return cc

        return self._cached(("json_schema", key_src, opts.key()), build)

    def compile_ast(self, node: A.Node, name: str = "ast") -> CompiledConstraint:
        """Compile a regex AST directly (no caching)."""
        return CompiledConstraint("ast", name, node, self.tokenizer_info, Deadline(self.timeout_s))
