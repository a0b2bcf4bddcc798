"""Random sentences of a compiled grammar (for tests, property-based strategies and benchmarks).

A derivation is expanded top-down from the start rule with random rule choices; past `max_depth` the
cheapest rule is taken so the derivation ends. Terminals are rendered by a random walk over their byte DFA
(printable ASCII preferred), keywords by their value (random case when case-insensitive). Lexemes are joined
with the grammar's separator (its shortest ignored lexeme) when it has one. The result is checked with the
exact matcher and with Lark; `random_sentence` retries a few times and returns None if nothing passes.
"""
from __future__ import annotations

import random

from ..bounds import INF
from .grammar import CompiledGrammar

_PRINTABLE = list(range(0x20, 0x7F))


def _walk_terminal(dfa, rng: random.Random, stop: float = 0.35, max_len: int = 12) -> bytes | None:
    s = 1
    out = bytearray()
    for _ in range(64):
        if dfa.accepting[s] and (rng.random() < stop or len(out) >= max_len):
            return bytes(out)
        dfa.expand(s)
        row = dfa.T[s]
        live = [b for b in _PRINTABLE if row[b] != 0]
        if not live or rng.random() < 0.05:
            live = [b for b in range(256) if row[b] != 0]
        if not live:
            return bytes(out) if dfa.accepting[s] else None
        # prefer bytes from which the DFA can still accept soon
        b = rng.choice(live)
        out.append(b)
        s = int(row[b])
    return bytes(out) if dfa.accepting[s] else None


def random_types(cg: CompiledGrammar, rng: random.Random, max_depth: int = 8) -> list[int]:
    spec = cg.spec
    par = cg.parser
    by_lhs: dict[int, list[int]] = {}
    for r, (lhs, _rhs) in enumerate(spec.rules):
        by_lhs.setdefault(lhs, []).append(r)
    start = spec.nt_names.index(spec.start)
    out: list[int] = []

    def rule_cost(r: int) -> int:
        c = 0
        for is_t, x in spec.rules[r][1]:
            c += par.term_cost[x] if is_t else par.nt_cost[x]
        return c

    def expand(nt: int, depth: int) -> None:
        rules = [r for r in by_lhs.get(nt, []) if rule_cost(r) < INF]
        if not rules:
            return
        if depth >= max_depth:
            r = min(rules, key=rule_cost)
        else:
            r = rng.choice(rules)
        for is_t, x in spec.rules[r][1]:
            if is_t:
                out.append(x)
            else:
                expand(x, depth + 1)

    expand(start, 0)
    return out


def render_sentence(cg: CompiledGrammar, rng: random.Random, max_depth: int = 8) -> str | None:
    """One random derivation rendered as text, unchecked (None when a lexeme cannot be rendered)."""
    spec = cg.spec
    scan_by_type = {t.type_id: j for j, t in enumerate(spec.scan)}
    sep = cg.separator.decode("utf-8", "replace") if cg.separator else ""
    parts = []
    for t in random_types(cg, rng, max_depth):
        if t in spec.keywords:
            value, icase = spec.keywords[t]
            s = value.decode("utf-8")
            if icase:
                s = "".join(ch.upper() if rng.random() < 0.5 else ch.lower() for ch in s)
            parts.append(s)
            continue
        j = scan_by_type.get(t)
        if j is None:
            return None
        data = _walk_terminal(cg.lexer.dfas[j], rng)
        if data is None:
            return None
        try:
            parts.append(data.decode("utf-8"))
        except UnicodeDecodeError:
            return None
    return sep.join(parts)


def random_sentence(cg: CompiledGrammar, rng: random.Random, max_depth: int = 8, tries: int = 20) -> str | None:
    """A random sentence that both the exact matcher and Lark accept (None after `tries` failed renders)."""
    for _ in range(tries):
        text = render_sentence(cg, rng, max_depth)
        if text is not None and cg.accepts_text(text) and cg.lark_parses(text):
            return text
    return None
