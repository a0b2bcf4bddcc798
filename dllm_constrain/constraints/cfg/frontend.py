"""Lark grammar text -> GrammarSpec: terminals as byte-level regex ASTs in Lark's lexer order, the
keyword ("unless") table, the ignore set and Lark's own LALR(1) table with its LR(0) items.

The language we generate is the one `lark.Lark(text, parser="lalr", lexer="basic")` parses:
  * lexing is Lark's basic lexer: at each position the FIRST terminal in Lark's order (priority, max width,
    pattern length, name) that matches wins, with its own (greedy) match; a regex terminal whose match equals
    a string terminal's value is retyped to that string terminal (Lark's "unless" callback); %ignore'd
    lexemes are dropped. A regex terminal's match is Python's `re.match` (first match in the regex's priority
    order, not the longest: `a|ab` matches "a" in "abc"), modelled exactly by pike.py; we only accept texts
    whose lexing never needs to back up (see lexer.py).
  * parsing is Lark's LALR(1) table (shift/reduce conflicts resolved as shift, like Lark).
Everything we cannot honour is refused with InvalidGrammarError naming the feature.
"""
from __future__ import annotations

import functools
import logging
import re
import re._constants as sre_c  # type: ignore[import-not-found]
import re._parser as sre_p  # type: ignore[import-not-found]
from dataclasses import dataclass, field

import lark
from lark.exceptions import LarkError
from lark.lexer import PatternRE, PatternStr, _create_unless

from ...errors import InvalidGrammarError, InvalidRegexError
from .. import regex_ast as A
from ..regex_parser import _Anchor, _Parser, _unicode_class
from ..regex_ast import ranges_complement
from .pike import PikeNFA, Unsupported

END_NAME = "$END"


# ------------------------------------------------------------------------------------ regex front end
def _exact_shorthand(c: str):
    """Python's own (Unicode) sets for \\d \\w \\s and their negations: a lexer needs the exact set, since a
    character outside it ends a lexeme."""
    low = c.lower()
    s = _unicode_class(low)
    return s if c.islower() else ranges_complement(s)


class _ExactParser(_Parser):
    """The regex parser with exact Unicode shorthand classes (the constraint layer's parser uses ASCII
    subsets, which is sound for a whole-string match but not for a lexer)."""

    def parse_escape(self) -> A.Node:
        if self.i < len(self.p) and self.p[self.i] in "dDwWsS":
            c = self.eat()
            return A.chars(_exact_shorthand(c))
        return super().parse_escape()

    def class_shorthand(self, kind: str, *, negated: bool):
        return _exact_shorthand(kind)


def _sre_features(pattern: str) -> set[str]:
    """The refused features of a Python regex, from Python's own regex parser."""
    refused: set[str] = set()
    try:
        tree = sre_p.parse(pattern)
    except Exception as e:  # noqa: BLE001 - Lark already compiled it; be defensive
        raise InvalidGrammarError(f"regex {pattern!r} does not parse: {e}") from None

    def walk(items) -> None:
        for op, av in items:
            if op in (sre_c.ASSERT, sre_c.ASSERT_NOT):
                refused.add("lookaround")
            elif op in (sre_c.GROUPREF, sre_c.GROUPREF_EXISTS):
                refused.add("backreference" if op == sre_c.GROUPREF else "conditional group")
            elif op == sre_c.AT:
                refused.add("anchor or word boundary")
            elif op == getattr(sre_c, "ATOMIC_GROUP", None):
                refused.add("atomic group")
            elif op == getattr(sre_c, "POSSESSIVE_REPEAT", None):
                refused.add("possessive quantifier")
            if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, getattr(sre_c, "POSSESSIVE_REPEAT", object())):
                walk(av[2])
            elif op == sre_c.SUBPATTERN:
                walk(av[-1])
            elif op == sre_c.BRANCH:
                for b in av[1]:
                    walk(b)
            elif op == getattr(sre_c, "ATOMIC_GROUP", None):
                walk(av)
            elif op in (sre_c.ASSERT, sre_c.ASSERT_NOT):
                walk(av[1])
            elif op == sre_c.GROUPREF_EXISTS:
                walk(av[1])
                if av[2] is not None:
                    walk(av[2])

    walk(tree)
    return refused


@functools.lru_cache(maxsize=1)
def _known_equivalents() -> dict[str, str]:
    """Lark's common.lark terminals whose regexes use lookarounds, mapped to lookaround-free equivalents with the
    same Python match on every input (same first-match length)."""
    out = {}
    g = lark.Lark("start: ESCAPED_STRING\n%import common.ESCAPED_STRING", parser="lalr", lexer="basic")
    for t in g.terminals:
        if t.name == "ESCAPED_STRING":
            # the first unescaped quote ends the string; '.' excludes the newline
            out[t.pattern.to_regexp()] = r'"(?:[^"\\\n]|\\[^\n])*"'
    return out


def terminal_ast(name: str, pattern) -> A.Node:
    """The regex AST over code points of a Lark TerminalDef's pattern; refuses what we cannot honour."""
    if isinstance(pattern, PatternStr):
        value = pattern.value
        flags = set(pattern.flags)
        if flags - {"i"}:
            raise InvalidGrammarError(f"terminal {name}: string flags {sorted(flags - {'i'})} are not supported")
        if "i" in flags:
            if not value.isascii():
                raise InvalidGrammarError(f"terminal {name}: the case-insensitive flag 'i' is supported on ASCII "
                                          "strings only")
            items = []
            for ch in value:
                if ch.lower() != ch.upper():
                    items.append(A.chars([(ord(ch.lower()),) * 2, (ord(ch.upper()),) * 2]))
                else:
                    items.append(A.lit(ch))
            return A.seq(*items)
        return A.lit(value)
    if not isinstance(pattern, PatternRE):
        raise InvalidGrammarError(f"terminal {name}: unsupported pattern type {type(pattern).__name__}")
    if pattern.flags:
        raise InvalidGrammarError(f"terminal {name}: regex flags {sorted(pattern.flags)} are not supported "
                                  "(write the case variants or the characters out)")
    regexp = pattern.value
    regexp = _known_equivalents().get(pattern.to_regexp(), regexp)
    refused = _sre_features(regexp)
    if refused:
        raise InvalidGrammarError(f"terminal {name}: regex /{regexp}/ uses {', '.join(sorted(refused))}, which a "
                                  "token-level lexer cannot honour")
    p = _ExactParser(regexp)
    try:
        alts = p.parse_alternation()
        if p.i != len(regexp):
            raise p.error("unbalanced parenthesis")
        nodes = []
        for items in alts:
            if any(isinstance(x, _Anchor) for x in items):
                raise InvalidGrammarError(f"terminal {name}: anchors are not supported in terminal regexes")
            nodes.append(A.seq(*items))
    except InvalidRegexError as e:
        raise InvalidGrammarError(f"terminal {name}: {e}") from None
    except RecursionError:
        raise InvalidGrammarError(f"terminal {name}: regex nested too deeply") from None
    return A.alt(*nodes)


def terminal_matcher(name: str, pattern) -> PikeNFA | None:
    """Python's match semantics for a regex terminal (None for a string terminal, whose only match is its
    value); refuses what the matcher cannot model, naming the terminal."""
    if not isinstance(pattern, PatternRE):
        return None
    regexp = _known_equivalents().get(pattern.to_regexp(), pattern.value)
    try:
        return PikeNFA(regexp)
    except Unsupported as e:
        raise InvalidGrammarError(f"terminal {name}: regex /{regexp}/ uses {e}, for which Python's first-match "
                                  "semantics (what Lark's lexer uses) is not modelled") from None


# ------------------------------------------------------------------------------------ the spec
@dataclass
class ScanTerm:
    name: str
    type_id: int
    ast: A.Node  # the lexer's automaton for a string terminal (a regex terminal's is `matcher`)
    unless: tuple[int, ...] = ()  # keyword type ids, in Lark's order (first full match wins)
    ignored: bool = False
    matcher: PikeNFA | None = None  # regex terminals: Python's (first-match) semantics, see pike.py


@dataclass
class GrammarSpec:
    text: str
    start: str
    lark: lark.Lark
    type_names: list[str]  # terminal types (ids) the parser sees; END = len(type_names)
    type_id: dict[str, int]
    scan: list[ScanTerm]  # Lark's scanner order
    keywords: dict[int, tuple[bytes, bool]]  # keyword type id -> (value, case-insensitive)
    ignore: frozenset[str]
    # LALR(1) table
    n_states: int
    start_state: int
    end_state: int
    action: list[dict[int, int]]  # state -> {type id or END: shift s (>= 0) | reduce r (-(r+1))}
    goto: list[dict[int, int]]  # state -> {nonterminal id: state}
    nt_names: list[str]
    rules: list[tuple[int, tuple[tuple[bool, int], ...]]]  # (lhs nt, rhs: ((is_terminal, id), ...))
    items: list[list[tuple[int, int]]]  # state -> kernel items (rule, dot) (dot >= 1, or the root item)
    root_rule: int
    lalr_conflicts_resolved_as_shift: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def END(self) -> int:
        return len(self.type_names)

    def terminal_name(self, tid: int) -> str:
        return END_NAME if tid == self.END else self.type_names[tid]


def _confined_import(base_path: object, grammar_path: str) -> tuple[object, str]:
    """Lark's `%import` loader for every grammar: Lark's own library (common.lark, unicode.lark, ...) and the
    shipped grammars folder (`%import json.value`), nothing else. Lark would otherwise read `<name>.lark` relative
    to the importing script or the working directory; a grammar is data, often from a request, and may not read
    files. Not finding the module raises (rather than OSError, on which Lark would go on to its file-system
    lookups), and the message does not say whether such a file exists anywhere."""
    from lark.load_grammar import stdlib_loader

    try:
        return stdlib_loader(None, grammar_path)
    except OSError:
        pass
    from dllm_constrain.grammars import shipped_file_text

    text = shipped_file_text(grammar_path) if "/" not in grammar_path and "\\" not in grammar_path else None
    if text is not None:
        return f"<dllm_constrain.grammars>/{grammar_path}", text
    module = grammar_path[:-len(".lark")].replace("/", ".") if grammar_path.endswith(".lark") else grammar_path
    raise InvalidGrammarError(f"%import {module}: no such grammar module; a grammar may import from Lark's own "
                              "library (common, unicode, ...) and the shipped grammars only")


def load_spec(text: str, start: str = "start") -> GrammarSpec:
    if not isinstance(text, str) or not text.strip():
        raise InvalidGrammarError("the grammar is empty")
    lg = logging.getLogger("lark")
    old = lg.level
    lg.setLevel(logging.ERROR)
    try:
        try:
            lk = lark.Lark(text, parser="lalr", lexer="basic", start=start, import_paths=[_confined_import])
        except InvalidGrammarError:
            raise
        except LarkError as e:
            msg = str(e).strip().splitlines()
            head = msg[0] if msg else type(e).__name__
            if "Reduce/Reduce" in str(e):
                head = "the grammar is not LALR(1) (reduce/reduce conflict); " + head
            raise InvalidGrammarError(f"grammar refused by Lark: {head}") from None
        except (ValueError, TypeError, AssertionError, KeyError) as e:
            raise InvalidGrammarError(f"grammar refused by Lark: {type(e).__name__}: {e}") from None
        except RecursionError:
            raise InvalidGrammarError("grammar refused by Lark: the grammar is nested too deeply") from None
        return _build_spec(text, start, lk)
    finally:
        lg.setLevel(old)


def _build_spec(text: str, start: str, lk: lark.Lark) -> GrammarSpec:
    _check_supported(lk)
    terms = list(lk.parser.lexer.terminals)  # Lark's sorted order
    types = _Interner()
    for t in terms:
        types.id(t.name)
    ignore = frozenset(lk.ignore_tokens)
    scan, keywords = _scan_terms(lk, terms, types, ignore)
    lalr = _lalr_table(lk.parser.parser_conf, start, types)
    return GrammarSpec(text=text, start=start, lark=lk, type_names=types.names, type_id=types.ids, scan=scan,
                       keywords=keywords, ignore=ignore, n_states=len(lalr.action), start_state=lalr.start_state,
                       end_state=lalr.end_state, action=lalr.action, goto=lalr.goto, nt_names=lalr.nt_names,
                       rules=lalr.rules, items=lalr.items, root_rule=lalr.root_rule)


class _Interner:
    """Dense ids for names in first-seen order (terminal types, nonterminals)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.ids: dict[str, int] = {}

    def id(self, name: str) -> int:
        i = self.ids.get(name)
        if i is None:
            i = self.ids[name] = len(self.names)
            self.names.append(name)
        return i


def _check_supported(lk: lark.Lark) -> None:
    """Refuse what the exact lexer cannot model: a postlexer, terminals without a pattern (%declare)."""
    if lk.options.postlex is not None:
        raise InvalidGrammarError("grammars with a postlexer are not supported")
    used_terms = {sym.name for r in lk.parser.parser_conf.rules for sym in r.expansion if sym.is_term}
    declared = sorted(used_terms - {t.name for t in lk.parser.lexer.terminals})
    if declared:
        raise InvalidGrammarError(f"terminals {declared} have no pattern (%declare): a postlexer would be needed, "
                                  "which is not supported")


def _scan_terms(lk: lark.Lark, terms: list, types: _Interner, ignore: frozenset[str]
                ) -> tuple[list[ScanTerm], dict[int, tuple[bytes, bool]]]:
    """Lark's scanner terminals (string terminals that a regex terminal also matches folded into it as
    keywords, as Lark's basic lexer does) and the keywords: type id -> (value, case-insensitive)."""
    lexer = lk.parser.lexer
    scan_terms, callbacks = _create_unless(terms, lexer.g_regex_flags, re, False)
    by_name = {t.name: t for t in terms}
    keywords: dict[int, tuple[bytes, bool]] = {}
    scan: list[ScanTerm] = []
    for t in scan_terms:
        ast = terminal_ast(t.name, t.pattern)
        if A.is_nothing(ast):
            raise InvalidGrammarError(f"terminal {t.name} matches nothing")
        unless: tuple[int, ...] = ()
        cb = callbacks.get(t.name)
        if cb is not None:
            ids = []
            for s in cb.scanner.terminals:
                st = by_name[s.name]
                icase = "i" in st.pattern.flags
                if icase and not st.pattern.value.isascii():
                    raise InvalidGrammarError(f"terminal {s.name}: the case-insensitive flag 'i' is supported on "
                                              "ASCII strings only")
                keywords[types.id(s.name)] = (st.pattern.value.encode("utf-8"), icase)
                ids.append(types.id(s.name))
            unless = tuple(ids)
        scan.append(ScanTerm(t.name, types.id(t.name), ast, unless, t.name in ignore,
                             terminal_matcher(t.name, t.pattern)))
    return scan, keywords


@dataclass(frozen=True)
class _LalrTable:
    """Lark's LALR(1) table with kernel items, over dense ids (see GrammarSpec's fields of the same names)."""

    start_state: int
    end_state: int
    action: list[dict[int, int]]
    goto: list[dict[int, int]]
    nt_names: list[str]
    rules: list[tuple[int, tuple[tuple[bool, int], ...]]]
    items: list[list[tuple[int, int]]]
    root_rule: int


def _lalr_table(parser_conf, start: str, types: _Interner) -> _LalrTable:
    """Lark's LALR(1) analysis (with its conflict resolution) renumbered: states in Lark's order, rules in
    first-seen order, terminals by type id (END after the last type)."""
    from lark.parsers.lalr_analysis import LALR_Analyzer, Shift

    analyzer = LALR_Analyzer(parser_conf, debug=True, strict=False)
    analyzer.compute_lalr()
    table = analyzer.parse_table
    sidx = {s: i for i, s in enumerate(table.states)}
    nts = _Interner()
    rule_index: dict = {}
    rules: list[tuple[int, tuple[tuple[bool, int], ...]]] = []

    def rid(rule) -> int:
        r = rule_index.get(rule)
        if r is None:
            rhs = tuple((sym.is_term, types.id(sym.name) if sym.is_term else nts.id(sym.name))
                        for sym in rule.expansion)
            rule_index[rule] = r = len(rules)
            rules.append((nts.id(rule.origin.name), rhs))
        return r

    for r in parser_conf.rules:
        rid(r)
    n = len(sidx)
    action_raw: list[dict[str, int]] = [dict() for _ in range(n)]
    goto: list[dict[int, int]] = [dict() for _ in range(n)]
    items: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    root_rule = -1
    for s, acts in table.states.items():
        i = sidx[s]
        for sym, (act, arg) in acts.items():
            if act is not Shift:
                action_raw[i][sym] = -(rid(arg) + 1)
            elif sym in types.ids or sym == END_NAME:
                action_raw[i][sym] = sidx[arg]
            else:
                goto[i][nts.id(sym)] = sidx[arg]
        for rp in s:
            if rp.index > 0 or rp.rule.origin.name.startswith("$root_"):
                r = rid(rp.rule)
                items[i].append((r, rp.index))
                if rp.rule.origin.name == "$root_" + start:
                    root_rule = r
    end = len(types.names)
    action = [{(end if k == END_NAME else types.ids[k]): v for k, v in row.items()} for row in action_raw]
    return _LalrTable(start_state=sidx[table.start_states[start]], end_state=sidx[table.end_states[start]],
                      action=action, goto=goto, nt_names=nts.names, rules=rules, items=items, root_rule=root_rule)
