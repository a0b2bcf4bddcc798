"""ConstraintCompiler.compile(schema= | regex= | grammar=) -> Compiled -> CanvasConstraint (one per request).

One entry: `ConstraintCompiler.compile` normalises the constraint once (`ConstraintKey`: the kind, the schema
as a dict / the pattern / the grammar text, and the options) and looks it up in ONE LRU per process, bounded by
bytes (`COMPILE_CACHE`, a `compile_cache.CompileCache`), keyed by the tokenizer's fingerprint and a hash of that
normalised constraint, so two compilers over the same tokenizer share results and compiling the same constraint
twice costs a dictionary lookup. Refusals are cached too (raised afresh each time); a compilation timeout is not (a
later try may have more time). `compile_regex`, `compile_json_schema` and `compile_grammar` are the same entry for one kind;
`ConstraintCompiler(info, cache=False)` compiles afresh every time (benchmarks, deadline tests).

Both compiled kinds (`CompiledConstraint`: regular languages; `cfg.CompiledGrammar`: Lark grammars) implement
`protocol.CompiledKind`; `protocol.Compiled` (what the engine needs) is re-exported here. `new_request_state(compiled,
canvas_len, timeout_s)` makes a request's canvas state (the engine passes the request's max_new_tokens).
"""
from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from ..errors import (
    ConstraintTooLongError,
    InvalidGrammarError,
    InvalidRegexError,
    InvalidRequestError,
    UnsatisfiableSchemaError,
)
from . import regex_ast as A
from .call_bounds import AUTO, DEFAULT_CALL_TIMEOUT_S
from .canvas import CanvasState, SetAlgebra
from .cfg import CompiledGrammar, load_spec
from .compile_cache import (  # noqa: F401  (the cache's names, re-exported: `compiler.COMPILE_CACHE` and kin)
    COMPILE_CACHE,
    DEFAULT_CACHE_BYTES,
    CompileCache,
    ConstraintKey,
    _build_or_refusal,
    clear_cache,
    entry_bytes,
)
from .deadline import CallDeadline, Deadline, activate
from .deriv import DEAD, START, DerivDFA
from .matcher import LeftToRightMatcher
from .protocol import CanvasConstraint, Compiled, CompiledKind, RowMaskConstraint, declares
from .bounds import INF
from .regex_parser import parse_regex
from .token_automaton import TokenAutomaton
from .tokenizer_info import TokenizerInfo

# A compilation's bounds: COMPILE_WORK deadline checks (deadline.Deadline: 8,000-15,600 a second on the shared 2-core
# machine this was measured on, so 13-25 s there; the largest of 168 jsonschemabench schemas took 12,318:
# benchmarks/bench_compile_work.py, docs/measurements.md),
# which decides whether a constraint compiles the same way on any machine; and DEFAULT_TIMEOUT_S seconds, the last
# resort (a machine loaded enough to need it ends the compilation with CompilationTimeoutError).
COMPILE_WORK = 200_000
DEFAULT_TIMEOUT_S = 60.0
# States min_tokens' breadth-first search may expand (counted whether or not their transitions were cached, a whole
# level at a time) before answering a lower bound: the same bound on any machine, cold or warm. Every request asks it;
# at 128K tokens a cold transition costs milliseconds.
MIN_TOKENS_STATES = 256
_COMPILER_DEFAULT: Any = object()  # compile_*(timeout_s=...) not given: the compiler's timeout_s


class CompiledConstraint(CompiledKind):
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
        # the tokenizer's token set (longest-match tokenization in the can-finish search): built once per tokenizer,
        # here rather than inside the first request's call that needs it (about 0.15 s at 128K tokens)
        tok.byte_set()
        self.algebra = SetAlgebra(self.ta)
        self._min_tokens: int | None = None
        self._lock = threading.Lock()
        # (JSON pointer, keyword) of the schema keywords that were not enforced (outside the JSON Schema
        # vocabularies: `x-*`, `nullable`, typos); see the `unknown_keywords` option
        self.ignored_keywords: tuple[tuple[str, str], ...] = ()

    def __repr__(self) -> str:
        src = self.source if isinstance(self.source, str) else json.dumps(self.source)[:60]
        return f"CompiledConstraint({self.kind}, {src[:60]!r}, dfa_states_so_far={self.dfa.n_states})"

    def worn_out(self) -> bool:
        """Whether the automaton, shared by every request of this constraint and never shrinking, holds half its DFA
        state bound or twice its exploration allowance (set_algebra.EXPLORE_MAX_BYTES): past the allowance only the
        requests' own paths add states, but over enough requests they would reach the bound, after which every call
        that needs a new state fails. The compile cache then compiles the constraint afresh for the next request."""
        return (self.dfa.n_states >= self.dfa.max_states // 2
                or self.ta.footprint_bytes() >= 2 * self.algebra.explore_max_bytes)

    def memory_bytes(self) -> int:
        """An estimate of the memory this constraint holds (what the compile cache charges it): the automaton's
        footprint (`TokenAutomaton.memory_bytes`: token rows and transitions, per-state memos), its byte DFA's
        (`DerivDFA.memory_bytes`: tables, states, derivative terms) and the mask rows its set algebra keeps
        (`SetAlgebra.rows`, up to set_algebra.ROW_CACHE_BYTES). It grows as requests explore the automaton; read
        without the lock."""
        rows = len(self.algebra.rows) * self.ta.nbytes
        return self.ta.memory_bytes() - self.dfa.T.nbytes + self.dfa.memory_bytes() + rows

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
        positions fits it; longer canvases pad with EOS), or a lower bound when the search needs more than
        MIN_TOKENS_STATES states (so a request that fits is never refused): the same answer on any machine, memoised.
        timeout_s: the last-resort limit (None: unbounded): past it, ConstraintTimeoutError."""
        if self._min_tokens is not None:
            return self._min_tokens
        with self._lock:
            if self._min_tokens is None:
                with activate(CallDeadline(timeout_s, self.kind, "min_tokens")):
                    r, _exact = self._compute_min_tokens()
                self._min_tokens = r
        return self._min_tokens

    def _compute_min_tokens(self, budget: int | None = None) -> tuple[int, bool]:
        """Breadth-first search over token successors: (the answer, exact), exact when it finishes within `budget`
        expanded states, else a lower bound (a function of the constraint: the count does not depend on which
        transitions were cached)."""
        dfa, ta = self.dfa, self.ta
        if self.empty_language:
            return INF, True
        if dfa.accepting[START]:
            return 0, True
        bound = int(dfa.dist[START]) if ta.single_byte_complete else INF
        L = max(1, ta.max_token_len)
        return self._min_tokens_bfs(MIN_TOKENS_STATES if budget is None else budget, bound, L)

    def _min_tokens_bfs(self, budget: int, bound: int, L: int) -> tuple[int, bool]:
        """Breadth first over token successors, within `budget` expanded states, a whole level at a time (so which
        states a cut search expanded does not depend on the automaton's state numbering): (the answer, exact) where
        a search cut short answers a lower bound. A successor that cannot beat `bound` even with the longest tokens
        is not followed."""
        dfa, ta = self.dfa, self.ta
        frontier = {START}
        seen = {START}
        k = 0
        spent = 0
        while frontier and k + 1 < bound:
            k += 1
            nxt = set()
            spent += len(frontier)
            if spent > budget:
                # lower bound: k - 1 tokens so far, and no token is longer than L bytes
                lb = max(k, -(-int(min(dfa.dist[x] for x in frontier)) // L) + k - 1)
                return min(lb, bound), False
            for s in frontier:
                for u in ta.succ(s):
                    if u not in seen:
                        if dfa.accepting[u]:
                            return k, True
                        seen.add(u)
                        if k + max(1, -(-int(dfa.dist[u]) // L)) >= bound:
                            continue  # cannot finish in fewer tokens than the bound
                        nxt.add(u)
            frontier = nxt
        return (bound if bound < INF else INF), True

    def fits_by_bytes(self, canvas_len: int) -> bool:
        """True when the shortest accepted text has at most canvas_len bytes and the vocabulary spells every byte
        with a token of its own: that text then fits, one token per byte (no search). False: not decided here."""
        return (not self.empty_language and self.ta.single_byte_complete
                and int(self.dfa.dist[START]) <= int(canvas_len))

    def fits(self, canvas_len: int, timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S) -> bool:
        """False only when provably no accepted text fits in canvas_len tokens: by what the start state tells
        (set_algebra.finish_cheap), else by `min_tokens` (exact or a lower bound within MIN_TOKENS_STATES states: an
        undecided length is let in, and the first mask call's exact frontier refuses it when nothing fits). Work-
        bounded; timeout_s: the last-resort limit (past it, ConstraintTimeoutError)."""
        n = int(canvas_len)
        if self.empty_language:
            return False
        if self.fits_by_bytes(n):
            return True
        with activate(CallDeadline(timeout_s, self.kind, f"checking that an output fits {n} tokens")):
            r = self.algebra.finish_cheap(START, n)
        if r is None:
            return self.min_tokens(timeout_s) <= n
        return r

    # ------------------------------------------------------------------ requests
    def new_canvas_state(self, canvas_len: int, expand_budget: int | None = AUTO,
                         timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S) -> CanvasState:
        """Per-request CanvasConstraint for a canvas of `canvas_len` positions.
        Raises ConstraintTooLongError when even the shortest accepted text does not fit.
        expand_budget: new states per call in the request's explored set (None: unlimited, always exact; AUTO:
        call_bounds.EXPAND_WORK token-steps at this vocabulary size). timeout_s: the last-resort limit of every call
        of the state and of the fit check here (None: unbounded), see "Time bounds" in docs/constraints.md."""
        canvas_len = int(canvas_len)
        if canvas_len <= 0:
            raise InvalidRequestError(f"the canvas length must be a positive integer, got {canvas_len}")
        if not self.fits(canvas_len, timeout_s):
            raise ConstraintTooLongError(max(self.min_tokens(timeout_s), canvas_len + 1), canvas_len)
        return CanvasState(self.algebra, canvas_len, self.mask_id, self.vocab_size, expand_budget,
                           timeout_s=timeout_s, kind=self.kind)

    def matcher(self, max_tokens: int | None = None) -> LeftToRightMatcher:
        """A left-to-right (autoregressive) matcher: unbounded length by default (benchmarks, evals); with
        `max_tokens`, its rows allow only tokens after which a valid answer still fits (matcher.py)."""
        return LeftToRightMatcher(self, max_tokens)

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


# ---------------------------------------------------------------------------------- one compiled type
def new_request_state(compiled: Compiled, canvas_len: int,
                      timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S) -> CanvasConstraint | RowMaskConstraint:
    """A request's canvas constraint for `canvas_len` positions (the request's max_new_tokens), refused with
    ConstraintTooLongError when even the shortest accepted text does not fit: the fewest-token search decides what a
    kind's own fit check may leave undecided, so a request too long is refused here, not at its first mask call. For
    the package's kinds (protocol.CompiledKind) a shortest text that fits by its bytes needs no search (a
    breadth-first walk over token transitions, milliseconds per state at 128K tokens), and timeout_s bounds every
    call of the state; a substitute compiler's result is asked `Compiled`'s two calls only."""
    if not declares(compiled, CompiledKind):
        min_tokens = int(compiled.min_tokens())
        if min_tokens > canvas_len:
            raise ConstraintTooLongError(min_tokens, canvas_len)
        return compiled.new_canvas_state(canvas_len)
    if not compiled.fits_by_bytes(canvas_len):
        min_tokens = int(compiled.min_tokens(timeout_s))
        if min_tokens > canvas_len:
            raise ConstraintTooLongError(min_tokens, canvas_len)
    return compiled.new_canvas_state(canvas_len, timeout_s=timeout_s)


def compile_constraint(builder: Any, fingerprint: str, cache: CompileCache | None, *, schema: Any = None,
                       regex: str | None = None, grammar: str | None = None, start: str = "start",
                       name: str | None = None, timeout_s: Any = _COMPILER_DEFAULT, whitespace: str = "compact",
                       cached_only: bool = False, **schema_options: Any) -> Compiled | None:
    """`ConstraintCompiler.compile` over the tokenizer with `fingerprint`: the constraint normalised once
    (`ConstraintKey`), looked up in `cache` (None: never cached), built on a miss by `builder`: a
    ConstraintCompiler (entries shared by every one over the tokenizer), or a substitute compiler (anything
    with compile_regex / compile_json_schema / compile_grammar, asked through those; its entries are its own).
    `name` labels a grammar built by a ConstraintCompiler; it is not part of the key (a label, not a constraint).
    `cached_only`: check and normalise the input as always, but answer from `cache` alone: None when the
    constraint is not cached (nothing is compiled)."""
    if sum(x is not None for x in (schema, regex, grammar)) != 1:
        raise InvalidRequestError("compile takes exactly one of schema=, regex= and grammar=")
    limit = {} if timeout_s is _COMPILER_DEFAULT else {"timeout_s": timeout_s}
    ours = isinstance(builder, ConstraintCompiler)
    build: Callable[[], Any]
    if regex is not None:
        if not isinstance(regex, str):
            raise InvalidRegexError(f"regex must be a string, got {type(regex).__name__}")
        key = ConstraintKey("regex", regex)
        build = lambda: (builder._build_regex if ours else builder.compile_regex)(regex, **limit)  # noqa: E731
    elif grammar is not None:
        if not isinstance(grammar, str):
            raise InvalidGrammarError(f"grammar must be a string, got {type(grammar).__name__}")
        key = ConstraintKey("grammar", grammar, (start,))
        build = (lambda: builder._build_grammar(grammar, start, name, **limit)) if ours else (  # noqa: E731
            lambda: builder.compile_grammar(grammar, start))
    else:
        from .json_schema import SchemaOptions, normalize_schema

        normalized = normalize_schema(schema)  # the one reading of the schema (a NormalizedSchema is taken as is)
        sch = normalized.schema
        options = {"whitespace": whitespace, **schema_options}
        key = ConstraintKey("json_schema", normalized.text, SchemaOptions.from_options(**options).key())
        build = lambda: (builder._build_json_schema if ours  # noqa: E731
                         else builder.compile_json_schema)(sch, **options, **limit)
    scope = fingerprint if ours else (fingerprint, builder)
    cache_key = (scope, key)
    if cached_only:
        return cache.lookup(cache_key) if cache is not None else None
    if cache is None:
        result = _build_or_refusal(build)
        if isinstance(result, BaseException):
            raise result
        return result
    return cache.get_or_build(cache_key, build)


# ---------------------------------------------------------------------------------- compiler
class ConstraintCompiler:
    """Compiles regexes, JSON Schemas and Lark grammars against one tokenizer (xgrammar's GrammarCompiler role).

    `compile(schema= | regex= | grammar=)` is the entry (cached in `cache`: by default the process's
    COMPILE_CACHE; False: never cached)."""

    def __init__(self, tokenizer_info: TokenizerInfo, timeout_s: float | None = DEFAULT_TIMEOUT_S,
                 cache: bool | CompileCache = True):
        if not isinstance(tokenizer_info, TokenizerInfo):
            tokenizer_info = TokenizerInfo.from_tokenizer(tokenizer_info)
        self.tokenizer_info = tokenizer_info
        self.timeout_s = timeout_s
        self.cache: CompileCache | None = (COMPILE_CACHE if cache is True else cache) if cache is not False else None

    def compile(self, *, schema: Any = None, regex: str | None = None, grammar: str | None = None,
                start: str = "start", timeout_s: Any = _COMPILER_DEFAULT, whitespace: str = "compact",
                **schema_options: Any) -> Compiled:
        """The compiled constraint for exactly one of: a JSON Schema (dict, JSON string, Pydantic model class,
        outlines type, or a `json_schema.NormalizedSchema` from `normalize_schema`, taken as it is; `whitespace`
        and `schema_options` are `json_schema.SchemaOptions` fields), a full-match
        regex (Python `re` syntax, regular subset) or Lark grammar text (`start`: its start rule; load shipped
        names and .lark paths with dllm_constrain.grammars.load_grammar). timeout_s: this compilation's limit
        (default: the compiler's; a timeout is not cached, a later call with more time compiles again)."""
        return compile_constraint(self, self.tokenizer_info.fingerprint, self.cache, schema=schema, regex=regex,
                                  grammar=grammar, start=start, timeout_s=timeout_s, whitespace=whitespace,
                                  **schema_options)

    def _timeout(self, timeout_s: Any) -> float | None:
        return self.timeout_s if timeout_s is _COMPILER_DEFAULT else timeout_s

    def compile_regex(self, pattern: str, *, timeout_s: Any = _COMPILER_DEFAULT) -> CompiledConstraint:
        """`compile(regex=pattern)`: a full-match regex (Python `re` syntax, regular subset)."""
        return self.compile(regex=pattern, timeout_s=timeout_s)  # type: ignore[return-value]

    def compile_json_schema(self, schema: Any, whitespace: str = "compact", *, timeout_s: Any = _COMPILER_DEFAULT,
                            **options: Any) -> CompiledConstraint:
        """`compile(schema=schema, ...)`: a JSON Schema (dict, JSON string, pydantic model class, outlines type);
        options: see `json_schema.SchemaOptions`."""
        return self.compile(schema=schema, whitespace=whitespace, timeout_s=timeout_s,  # type: ignore[return-value]
                            **options)

    def compile_grammar(self, grammar: str, start: str = "start", name: str | None = None, *,
                        timeout_s: Any = _COMPILER_DEFAULT) -> Compiled:
        """`compile(grammar=grammar, start=start)`: Lark grammar text; `name` labels the compiled grammar (its
        repr) when this call is the one that compiles it; timeout_s: this compilation's limit (default: the
        compiler's)."""
        return compile_constraint(self, self.tokenizer_info.fingerprint, self.cache, grammar=grammar, start=start,
                                  name=name, timeout_s=timeout_s)

    # ------------------------------------------------------------------ per-kind builders (uncached)
    def _build_regex(self, pattern: str, *, timeout_s: Any = _COMPILER_DEFAULT) -> CompiledConstraint:
        deadline = Deadline(self._timeout(timeout_s), work=COMPILE_WORK)
        node = parse_regex(pattern).node
        cc = CompiledConstraint("regex", pattern, node, self.tokenizer_info, deadline)
        if cc.empty_language:
            raise InvalidRegexError(f"regex {pattern!r} matches no string")
        return cc

    def _build_json_schema(self, sch: dict, *, timeout_s: Any = _COMPILER_DEFAULT,
                           **options: Any) -> CompiledConstraint:
        from .json_schema import SchemaOptions, schema_to_regex_ast

        opts = SchemaOptions.from_options(**options)
        deadline = Deadline(self._timeout(timeout_s), work=COMPILE_WORK)
        ignored: list = []
        node = schema_to_regex_ast(sch, opts, deadline, ignored=ignored)
        cc = CompiledConstraint("json_schema", sch, node, self.tokenizer_info, deadline)
        cc.ignored_keywords = tuple(ignored)
        if cc.empty_language:
            raise UnsatisfiableSchemaError("no JSON value satisfies the schema (within the supported bounds)")
        return cc

    def _build_grammar(self, grammar: str, start: str = "start", name: str | None = None, *,
                       timeout_s: Any = _COMPILER_DEFAULT) -> Compiled:
        label = name or grammar.strip()[:40] or "grammar"
        deadline = Deadline(self._timeout(timeout_s), "compiling the grammar", work=COMPILE_WORK)
        spec = load_spec(grammar, start)  # Lark's own LALR construction: checked once it returns
        deadline.check()
        return CompiledGrammar(spec, self.tokenizer_info, label, deadline)

    def compile_ast(self, node: A.Node, name: str = "ast") -> CompiledConstraint:
        """Compile a regex AST directly (no caching)."""
        return CompiledConstraint("ast", name, node, self.tokenizer_info, Deadline(self.timeout_s, work=COMPILE_WORK))


class GrammarCompiler:
    """The grammar-only door onto `ConstraintCompiler`: Lark grammars compiled against one tokenizer, results (and
    refusals) cached per (tokenizer, grammar, start) in the process's one compile cache, shared with
    `ConstraintCompiler.compile(grammar=...)`, so a grammar compiled through either is compiled once."""

    def __init__(self, tokenizer_info: TokenizerInfo):
        self._compiler = ConstraintCompiler(tokenizer_info)
        self.tokenizer_info = self._compiler.tokenizer_info

    def compile(self, grammar: str, start: str = "start", name: str | None = None) -> CompiledGrammar:
        """`grammar` is Lark grammar text (use dllm_constrain.grammars.load_grammar for names and paths); `name`
        labels the compiled grammar (its repr) when this call is the one that compiles it."""
        if not isinstance(grammar, str):  # None too: a grammar error, not compile()'s "exactly one of" refusal
            raise InvalidGrammarError(f"grammar must be a string, got {type(grammar).__name__}")
        return self._compiler.compile_grammar(grammar, start, name=name)  # type: ignore[return-value]


def compile_grammar(grammar: str, tokenizer_info: TokenizerInfo, start: str = "start") -> CompiledGrammar:
    """`GrammarCompiler(tokenizer_info).compile(grammar, start)`."""
    return GrammarCompiler(tokenizer_info).compile(grammar, start)
