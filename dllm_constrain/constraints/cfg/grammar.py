"""CompiledGrammar: a Lark grammar compiled against one tokenizer (shared, thread-safe enough to share
between requests: every table is a memo that only grows).

It steps exact configurations (configuration.py: LALR stack node, pending lexeme's lexer state, last type).
A configuration is *viable* when the stack is a viable prefix and the pending lexeme can still end as a
terminal the stack accepts.

`complete_bytes(cfg)` builds a concrete shortest-ish completion (the pending lexeme finished by the shortest
bytes, then the LR items' cheapest terminal sequence rendered with each terminal's shortest lexeme, separated
by the shortest ignored lexeme where two lexemes would merge) and checks it with the exact machinery; it is
what makes every witness, hence every final canvas, concrete.

Time: construction checks the compiler's `Deadline` between its phases and inside the lexeme search (raising
CompilationTimeoutError); at request time the successor and completion searches check the active call deadline
(deadline.py), and every memo is published only once complete, so a call interrupted there leaves this shared
grammar whole.
"""
from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterator

import numpy as np

from ...errors import InvalidGrammarError
from ..bounds import INF
from ..call_bounds import DEFAULT_CALL_TIMEOUT_S
from ..deadline import Deadline, check_active
from ..protocol import CompiledKind
from ..tokenizer_info import TokenizerInfo
from .approx import Approx
from .canvas import GrammarCanvasState
from .configuration import Config
from .emptiness import proves_empty
from .frontend import GrammarSpec
from .lexer import DEAD, START, Lexer
from .parser import ROOT, LRParser
from .vocab import vocab_for

# byte preference for generated fillers: readable first
_BYTE_ORDER = ([*range(ord("a"), ord("z") + 1)] + [*range(ord("0"), ord("9") + 1)] + [*range(ord("A"), ord("Z") + 1)]
               + [0x20] + [b for b in range(0x21, 0x7F) if not chr(b).isalnum()] + [0x0A, 0x09]
               + [b for b in range(256) if b < 0x20 and b not in (0x0A, 0x09)] + [0x7F] + [*range(0x80, 0x100)])


def _continuations(lx: Lexer, q: int) -> Iterator[tuple[int, int]]:
    """(byte, next state) for each byte that extends the pending lexeme of q without ending it, readable bytes
    first (the order of generated fillers)."""
    lx.expand(q)
    T, E = lx.T[q], lx.E[q]
    for b in _BYTE_ORDER:
        y = int(T[b])
        if y != DEAD and E[b] == -1:
            yield b, y


# bytes charged per memo entry of a compiled grammar (a configuration key, its answer, the dict slot)
MEMO_ENTRY_BYTES = 320

class CompiledGrammar(CompiledKind):
    """A Lark grammar compiled against one tokenizer (protocol.CompiledKind). Thread-safe to share between requests."""

    kind = "grammar"

    def __init__(self, spec: GrammarSpec, tok: TokenizerInfo, name: str = "grammar",
                 deadline: Deadline | None = None):
        """deadline: the compilation's time limit (None: unbounded), checked between the construction phases
        and inside the lexeme search."""
        check = (lambda: None) if deadline is None else deadline.check
        self.spec = spec
        self.name = name
        self.tokenizer_info = tok
        check()
        self.lexer = Lexer(spec, tok)
        check()
        self.vocab = vocab_for(tok)
        check()
        self.shortest, self.separator = self._shortest_lexemes(check)
        check()
        missing = [spec.type_names[t] for t in range(len(spec.type_names))
                   if t not in self.shortest and not spec.type_names[t] in spec.ignore]
        cost = [len(self.shortest[t]) if t in self.shortest else INF for t in range(len(spec.type_names))]
        self.parser = LRParser(spec, cost)
        check()
        self.approx = Approx(spec, self.lexer)
        check()
        self.eos_id = tok.eos_id
        self.mask_id = tok.mask_id
        self.vocab_size = tok.vocab_size
        self.BOS = self.approx.BOS
        self.P = self.approx.P
        self.initial: Config = (ROOT, START, self.BOS)
        self._lock = threading.RLock()
        self._seqfeed: dict[tuple[int, int], int] = {}
        self._viable: dict[tuple[int, int], bool] = {}
        self._finish: dict[int, list[tuple[int, bytes, int]]] = {}
        self._complete: dict[Config, bytes | None] = {}
        self._ctoks: dict[Config, list[int] | None] = {}
        self._succ: OrderedDict = OrderedDict()
        self._ranked: OrderedDict = OrderedDict()
        self._bits: OrderedDict = OrderedDict()
        self._accv: dict[int, np.ndarray] = {}
        self._est: dict[Config, int] = {}
        self._min_tokens: int | None = None
        self._base_bytes: int | None = None  # memory_bytes of the tables as built (measured on first use)
        text_row = np.zeros(self.vocab_size, dtype=bool)
        for i, b in enumerate(tok.token_bytes):
            if b:
                text_row[i] = True
        self.text_row = text_row
        if self.parser.nt_cost[spec.nt_names.index(spec.start)] >= INF if spec.start in spec.nt_names else True:
            raise InvalidGrammarError(f"the grammar accepts no text: its start rule {spec.start!r} derives no string"
                                      + (f" (terminals without a lexeme: {missing})" if missing else ""))
        check()
        if self.complete_bytes(self.initial) is None and proves_empty(spec, self.lexer):
            raise InvalidGrammarError("the grammar accepts no text: no sequence of its terminals that the start "
                                      f"rule {spec.start!r} derives can be lexed by Lark's lexer (adjacent lexemes "
                                      "would merge, or a terminal's match never ends where the next one starts)")

    def memory_bytes(self) -> int:
        """An estimate of the memory this grammar holds (what the compile cache charges it): its tables as built
        (measured once, `byte_lru.deep_size`), the lexers' DFA tables, and its memos by entry count (packed token
        rows for `_bits`, MEMO_ENTRY_BYTES for the others); it grows as requests explore the grammar. Read without
        the lock."""
        if self._base_bytes is None:
            from ..byte_lru import deep_size

            self._base_bytes = deep_size(self.spec) + self.text_row.nbytes
        lexers = sum(d.T.nbytes for d in self.lexer.dfas)
        memos = sum(len(m) for m in (self._seqfeed, self._viable, self._finish, self._complete, self._ctoks,
                                     self._succ, self._ranked, self._accv, self._est))
        return self._base_bytes + lexers + MEMO_ENTRY_BYTES * memos + len(self._bits) * (self.vocab_size // 8 + 96)

    def __repr__(self) -> str:
        return f"CompiledGrammar({self.name!r}, lexer_states={self.lexer.n_states}, lr_states={self.spec.n_states})"

    def can_follow(self, q: int) -> bool:
        """Some byte ends the pending lexeme of q and starts another one (else the text must end here)."""
        self.lexer.expand(q)
        return bool((self.lexer.E[q] != -1).any())

    # ------------------------------------------------------------------ lexeme strings
    def _shortest_lexemes(self, check=lambda: None) -> tuple[dict[int, bytes], bytes | None]:
        """Shortest byte string lexed as exactly one lexeme of each type, and the shortest ignored lexeme (the
        separator). With a vocabulary that spells every byte, a BFS over the lexer by bytes; otherwise a BFS
        by whole tokens (so the strings are spellable)."""
        lx = self.lexer
        out: dict[int, bytes] = {}
        sep: bytes | None = None
        seen = {START: b""}
        dq = deque([START])
        n_types = len(self.spec.type_names)
        by_tokens = not self.vocab.single_bytes
        if by_tokens:
            edges = sorted(self.vocab.by_bytes.items(), key=lambda kv: (len(kv[0]), kv[0]))
        while dq and len(seen) < 50_000:
            check()
            x = dq.popleft()
            path = seen[x]
            et = lx.lexeme_type(x)
            if x != START:
                if et >= 0 and et not in out:
                    out[et] = path
                elif et == -1 and sep is None:
                    sep = path
            if len(out) == n_types and sep is not None:
                break
            if by_tokens:
                for data, _t in edges:
                    y = x
                    for b in data:
                        y2, e = lx.step(y, b)
                        if e != -1:
                            y2 = DEAD
                        y = y2
                        if y == DEAD:
                            break
                    if y != DEAD and y not in seen:
                        seen[y] = path + data
                        dq.append(y)
                continue
            for b, y in _continuations(lx, x):
                if y not in seen:
                    seen[y] = path + bytes([b])
                    dq.append(y)
        return out, sep

    def finish_options(self, q: int) -> list[tuple[int, bytes, int]]:
        """(type or -1, shortest bytes, end state) for each type the pending lexeme of q can end as."""
        r = self._finish.get(q)
        if r is not None:
            return r
        lx = self.lexer
        out: dict[int, tuple[bytes, int]] = {}
        seen = {q: b""}
        dq = deque([q])
        while dq and len(seen) < 20_000:
            x = dq.popleft()
            path = seen[x]
            et = lx.lexeme_type(x)
            if et >= -1 and et not in out and x != START:
                out[et] = (path, x)
            for b, y in _continuations(lx, x):
                if y not in seen:
                    seen[y] = path + bytes([b])
                    dq.append(y)
        r = sorted(((t, p, s) for t, (p, s) in out.items()), key=lambda x: len(x[1]))
        self._finish[q] = r
        return r

    # ------------------------------------------------------------------ exact configurations
    def feed_seq(self, node: int, s: int) -> int:
        if s == 0 or node < 0:
            return node
        k = (node, s)
        r = self._seqfeed.get(k)
        if r is not None:
            return r
        lx = self.lexer
        base = self.feed_seq(node, lx.seq_parent[s])
        r = -1 if base < 0 else self.parser.feed(base, lx.seq_type[s])
        if len(self._seqfeed) > 1_000_000:
            self._seqfeed.clear()
        self._seqfeed[k] = r
        return r

    def viable(self, node: int, q: int) -> bool:
        """The pending lexeme of q can end as a type the stack accepts (or as an ignored lexeme)."""
        if q == START:
            return True
        k = (node, q)
        r = self._viable.get(k)
        if r is not None:
            return r
        r = False
        for t in self.approx.possible_types(q):
            if t == -1 or self.parser.feed(node, t) >= 0:
                r = True
                break
        if len(self._viable) > 1_000_000:
            self._viable.clear()
        self._viable[k] = r
        return r

    def step_seq(self, cfg: Config, s: int, q2: int) -> Config | None:
        node, _q, p = cfg
        if q2 == DEAD:
            return None
        node2 = self.feed_seq(node, s)
        if node2 < 0:
            return None
        p2 = self.approx.seq_p(p, s) if s else p
        if p2 < 0:
            # the bigram relation over-approximates the grammar, so an accepted sequence always passes it
            p2 = self.lexer.seq_type[s]
        if not self.viable(node2, q2):
            return None
        return (node2, q2, p2)

    def step(self, cfg: Config, t: int) -> Config | None:
        """Exact configuration after text token t (None if the prefix stops being viable)."""
        q2, s = self.lexer.delta(cfg[1], t)
        return self.step_seq(cfg, s, q2)

    def step_bytes(self, cfg: Config, data: bytes) -> Config | None:
        q2, s = self.lexer.walk_bytes(cfg[1], data)
        return self.step_seq(cfg, s, q2)

    def accepts_end(self, cfg: Config) -> bool:
        node, q, _p = cfg
        if q == START:
            return self.parser.accepts(node)
        t = self.lexer.lexeme_type(q)
        if t == -2:
            return False
        if t == -1:
            return self.parser.accepts(node)
        n2 = self.parser.feed(node, t)
        return n2 >= 0 and self.parser.accepts(n2)

    def approx_id(self, cfg: Config) -> int:
        return cfg[1] * self.P + cfg[2]

    # ------------------------------------------------------------------ completions
    def _append(self, q: int, s: bytes, t: int) -> int:
        """Lexer state after appending s (one lexeme of type t, -1 ignored) to a text whose pending lexeme is q;
        DEAD unless the pending lexeme ends right there and s lexes as exactly one lexeme of type t."""
        lx = self.lexer
        pending = lx.lexeme_type(q) if q != START else None
        if pending == -2:
            return DEAD
        q2, seq = lx.walk_bytes(q, s)
        if q2 == DEAD or lx.lexeme_type(q2) != t:
            return DEAD
        want = 1 if (pending is not None and pending >= 0) else 0
        if lx.seq_len[seq] != want:
            return DEAD
        if want and lx.seq_type[seq] != pending:
            return DEAD
        if pending == -1 or (pending is not None and pending >= 0):
            # the first byte of s must end the pending lexeme (no merge)
            q1, e1 = lx.step(q, s[0])
            if e1 == -1:
                return DEAD
        return q2

    def complete_bytes(self, cfg: Config) -> bytes | None:
        """Concrete bytes that complete the text from cfg (checked exactly), or None."""
        r = self._complete.get(cfg, False)
        if r is not False:
            return r  # type: ignore[return-value]
        r = self._complete_bytes(cfg)
        if len(self._complete) > 200_000:
            self._complete.clear()
        self._complete[cfg] = r
        return r

    def _complete_bytes(self, cfg: Config) -> bytes | None:
        node, q, p = cfg
        par = self.parser
        options: list[tuple[int, bytes, int, int]] = []  # (cost, u, end state, node after)
        if q == START:
            options.append((par.completion_cost(node), b"", START, node))
        else:
            for t, u, x in self.finish_options(q):
                n2 = node if t == -1 else par.feed(node, t)
                if n2 < 0:
                    continue
                c = par.completion_cost(n2)
                if c >= INF:
                    continue
                options.append((len(u) + c, u, x, n2))
        options.sort(key=lambda o: o[0])
        for _c, u, x, n2 in options[:4]:
            terms = par.completion_terms(n2)
            if terms is None:
                continue
            out = bytearray(u)
            cur = x
            ok = True
            for t in terms:
                s = self.shortest.get(t)
                if s is None:
                    ok = False
                    break
                nxt = self._append(cur, s, t)
                if nxt == DEAD and self.separator is not None:
                    mid = self._append(cur, self.separator, -1)
                    if mid != DEAD:
                        nxt = self._append(mid, s, t)
                        if nxt != DEAD:
                            out += self.separator
                if nxt == DEAD:
                    ok = False
                    break
                out += s
                cur = nxt
            if not ok:
                continue
            data = bytes(out)
            end = self.step_bytes(cfg, data) if data else cfg
            if end is not None and self.accepts_end(end):
                return data
        return None

    def complete_tokens(self, cfg: Config) -> list[int] | None:
        """Fewest tokens spelling the concrete completion of cfg (EOS not included)."""
        r = self._ctoks.get(cfg, False)
        if r is not False:
            return r  # type: ignore[return-value]
        data = self.complete_bytes(cfg)
        r = None if data is None else ([] if not data else self.vocab.segment_min(data))
        if r is None:  # the rendered bytes are not spellable with this vocabulary: search by tokens
            r, _e, _u = self.token_completion(cfg, 48, budget=3000)
        if len(self._ctoks) > 200_000:
            self._ctoks.clear()
        self._ctoks[cfg] = r
        return r

    def group_bits(self, q: int, lt, sel: np.ndarray) -> np.ndarray:
        """Packed vocabulary bitset of the tokens of the selected groups of lexer state q (LRU-cached by the
        selection: positions deep in a gap ask for the same few selections again and again)."""
        key = (q, sel.tobytes())
        r = self._bits.get(key)
        if r is not None:
            self._bits.move_to_end(key)
            return r
        row = np.zeros(self.vocab_size, dtype=bool)
        row[lt.tokens[sel[lt.group_of]]] = True
        r = np.packbits(row, bitorder="little")
        self._bits[key] = r
        if len(self._bits) > 512:
            self._bits.popitem(last=False)
        return r

    def acc_vec(self, node: int) -> np.ndarray:
        """bool [types + 1]: terminal types the stack accepts next (last column, ignored lexemes: always)."""
        r = self._accv.get(node)
        if r is None:
            nt = self.approx.NT
            r = np.zeros(nt + 1, dtype=bool)
            r[nt] = True
            par = self.parser
            for t in par.action[par.state[node]]:
                if t < nt and par.feed(node, t) >= 0:
                    r[t] = True
            if len(self._accv) > 200_000:
                self._accv.clear()
            self._accv[node] = r
        return r

    def successors(self, cfg: Config):
        """(LexTrans of cfg's lexer state, [(group, next config)]) over the token groups acceptable from cfg:
        the parser accepts what the group emits and its pending lexeme can still end as an acceptable type."""
        r = self._succ.get(cfg)
        if r is not None:
            self._succ.move_to_end(cfg)
            return r
        lt = self.lexer.trans(cfg[1])
        out = []
        node, _q, p = cfg
        if lt.n_groups:
            ept = self.approx.end_ptypes(lt)
            ends = lt.g_end
            ap = self.approx
            lx = self.lexer
            for k, sq in enumerate(lt.useq):
                check_active(None, "expanding the parser's successor configurations")
                n2 = self.feed_seq(node, sq)
                if n2 < 0:
                    continue
                gs = lt.useq_groups[k]
                ok = gs[(ept[gs] & self.acc_vec(n2)).any(axis=1)]
                if ok.size == 0:
                    continue
                p2 = ap.seq_p(p, sq) if sq else p
                if p2 < 0:
                    p2 = lx.seq_type[sq]
                for g, e in zip(ok.tolist(), ends[ok].tolist()):
                    out.append((g, (n2, e, p2)))
        r = (lt, out)
        self._succ[cfg] = r
        if len(self._succ) > 4096:
            self._succ.popitem(last=False)
        return r

    def ranked_successors(self, cfg: Config) -> list:
        """successors() as [(completion estimate, group, representative token, next config, approx id)], by
        estimate (cached)."""
        r = self._ranked.get(cfg)
        if r is not None:
            self._ranked.move_to_end(cfg)
            return r
        lt, succ = self.successors(cfg)
        P = self.P
        r = sorted(((self.completion_estimate(nxt), g, int(lt.tokens[lt.offsets[g]]), nxt, nxt[1] * P + nxt[2])
                    for g, nxt in succ), key=lambda x: x[0])
        self._ranked[cfg] = r
        if len(self._ranked) > 4096:
            self._ranked.popitem(last=False)
        return r

    def token_completion(self, cfg: Config, max_tokens: int, budget: int = 2000) -> tuple[list[int] | None, bool, int]:
        """Fewest-token completion of cfg within max_tokens by breadth-first search over exact configurations
        (token groups as edges). Returns (tokens or None, exhaustive, work): exhaustive=False when the budget
        (in successor edges) ran out before the search space did (then None proves nothing)."""
        if self.accepts_end(cfg):
            return [], True, 0
        layer = {cfg: []}
        seen = {cfg}
        used = 0
        for _depth in range(max_tokens):
            nxt_layer: dict = {}
            for c, path in layer.items():
                check_active(None, "searching a token completion of the parse")
                if used > budget:
                    return None, False, used
                lt, succ = self.successors(c)
                used += len(succ) + 1
                for g, nxt in succ:
                    if nxt in seen:
                        continue
                    seen.add(nxt)
                    p2 = path + [int(lt.tokens[lt.offsets[g]])]
                    if self.accepts_end(nxt):
                        return p2, True, used
                    nxt_layer[nxt] = p2
            if not nxt_layer:
                return None, True, used
            layer = nxt_layer
        return None, True, used

    def completion_estimate(self, cfg: Config) -> int:
        """Cheap byte estimate of the completion length (for ordering and quick length checks)."""
        r = self._est.get(cfg)
        if r is None:
            r = self._completion_estimate(cfg)
            if len(self._est) > 200_000:
                self._est.clear()
            self._est[cfg] = r
        return r

    def _completion_estimate(self, cfg: Config) -> int:
        node, q, _p = cfg
        par = self.parser
        if q == START:
            return par.completion_cost(node)
        best = INF
        for t, u, x in self.finish_options(q):
            n2 = node if t == -1 else par.feed(node, t)
            if n2 < 0:
                continue
            c = par.completion_cost(n2)
            if c > 0 and not self.can_follow(x):
                continue  # more lexemes are needed, but no byte can end this one (e.g. a comment to end of line)
            best = min(best, len(u) + c)
        return best

    def min_tokens(self, timeout_s: float | None = None) -> int:
        """Tokens of the shortest concrete output (an upper bound of the true minimum; EOS not counted). Bounded by
        its own search budget (3,000 configurations), so `timeout_s` (protocol.CompiledKind) has nothing to bound."""
        if self._min_tokens is None:
            toks = self.complete_tokens(self.initial)
            m = INF if toks is None else len(toks)
            if 1 < m < INF:  # a shorter token spelling may exist: a bounded breadth-first look
                shorter, _exh, _used = self.token_completion(self.initial, m - 1, budget=3000)
                if shorter is not None:
                    m = len(shorter)
            self._min_tokens = m
        return self._min_tokens

    # ------------------------------------------------------------------ whole texts
    def accepts_bytes(self, data: bytes) -> bool:
        end = self.step_bytes(self.initial, data) if data else self.initial
        return end is not None and self.accepts_end(end)

    def accepts_text(self, text: str) -> bool:
        return self.accepts_bytes(text.encode("utf-8"))

    def accepts_tokens(self, ids) -> bool:
        cfg: Config | None = self.initial
        for t in ids:
            t = int(t)
            if t == self.eos_id:
                break
            cfg = self.step(cfg, t)
            if cfg is None:
                return False
        return self.accepts_end(cfg)

    def lark_parses(self, text: str) -> bool:
        try:
            self.spec.lark.parse(text)
            return True
        except Exception:  # noqa: BLE001 - any Lark failure means "does not parse"
            return False

    def fits_by_bytes(self, canvas_len: int) -> bool:
        """False: not decided without a search (protocol.CompiledKind); `min_tokens` decides."""
        return False

    def worn_out(self) -> bool:
        """False: the compile cache keeps a grammar until it is evicted (its memos grow with the requests' work, and
        the cache charges them through `memory_bytes`)."""
        return False

    def new_canvas_state(self, canvas_len: int, *, timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S,
                         **options) -> GrammarCanvasState:
        """A request's canvas state for `canvas_len` positions; ConstraintTooLongError when no output found fits.
        timeout_s bounds every call of the state; `options`: GrammarCanvasState's."""
        return GrammarCanvasState(self, int(canvas_len), timeout_s=timeout_s, **options)
