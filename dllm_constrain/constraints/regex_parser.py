r"""Parser for the regular-expression dialect of Python's `re` (the engine jsonschema uses to check
`pattern`), restricted to the regular subset: literals, classes, `.`, `\d \w \s` (and negations),
quantifiers (`* + ? {m} {m,} {,n} {m,n}`, lazy variants), alternation, groups, anchors `^ $ \A \Z`
anywhere (read exactly, see regex_anchors.py).

Refused with `InvalidRegexError`: backreferences, lookaround, word boundaries, inline flags, atomic
groups/possessive quantifiers, conditionals, a group with an anchor inside repeated more than
regex_anchors.MAX_ANCHORED_COPIES times.

Semantics of the shorthand classes (soundness): outside a negated class, `\d \w \s` use their ASCII
sets (a subset of Python's Unicode sets, so everything we produce matches); `\D \W \S` and negated
classes use exact Unicode complements computed from `str.isdecimal / isalnum / isspace` (what `re` uses),
so they never admit a character Python would not match.

Readings (`parse_regex(pattern, reading=...)`): "python" (the default), "all" (a subset of what both Python's
`re` and ECMA-262 match) and "any" (a superset of what either matches): docs/constraints.md, "Pattern readings".
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ..errors import InvalidRegexError
from . import regex_anchors as T
from . import regex_ast as A
from .byte_lru import byte_memo
from .regex_anchors import AnchorTable
from .regex_ast import Ranges, norm_ranges, ranges_complement, ranges_union

MAX_REPEAT = 100_000
PARSE_CACHE_BYTES = 16 * 2**20  # memory budget of parsed patterns (every schema may bring patterns of its own)


# ------------------------------------------------------------------------------- unicode classes
@functools.lru_cache(maxsize=None)
def _unicode_class(kind: str) -> Ranges:
    """Python's Unicode \\d \\w \\s as ranges (a 0.1-0.3 s scan, cached on disk per Python version)."""
    import json
    import os
    import sys
    import unicodedata

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "dllm_constrain", f"unicode_{kind}_{sys.version_info[0]}{sys.version_info[1]}_"
                                                f"{unicodedata.unidata_version}.json")
    try:
        with open(path) as f:
            return tuple(tuple(x) for x in json.load(f))
    except (OSError, ValueError):
        pass
    r = _scan_unicode_class(kind)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(r, f)
        os.replace(tmp, path)
    except OSError:
        pass
    return r


def _scan_unicode_class(kind: str) -> Ranges:
    test = {"d": str.isdecimal, "w": lambda c: c.isalnum() or c == "_", "s": str.isspace}[kind]
    out = []
    start = None
    for cp in range(A.MAX_CP + 1):
        if 0xD800 <= cp <= 0xDFFF:
            ok = False
        else:
            ok = test(chr(cp))
        if ok and start is None:
            start = cp
        elif not ok and start is not None:
            out.append((start, cp - 1))
            start = None
    if start is not None:
        out.append((start, A.MAX_CP))
    return norm_ranges(out)


_ASCII = {
    "d": ((0x30, 0x39),),
    "w": norm_ranges([(0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A), (0x5F, 0x5F)]),
    "s": norm_ranges([(0x09, 0x0D), (0x20, 0x20)]),
}


# ECMA-262 `\\s`: WhiteSpace and LineTerminator (Python's str.isspace differs: \\x1c-\\x1f, \\x85 but not \\ufeff)
_ECMA_SPACE = norm_ranges([(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                           (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000),
                           (0xFEFF, 0xFEFF)])
READINGS = ("python", "all", "any")


def _widest(low: str) -> Ranges:
    """The union of Python's (Unicode) and ECMA-262's (`u` flag) sets of \\d \\w \\s."""
    r = _unicode_class(low)
    return ranges_union(r, _ECMA_SPACE) if low == "s" else r


def shorthand(kind: str, *, over: bool, reading: str = "python") -> Ranges:
    """Char set of \\d \\w \\s (lower-case) or \\D \\W \\S (upper-case).

    over=False: a subset of what the reading's engines match (use where the set is taken positively);
    over=True: a superset (use inside a negated class, so the complement stays a subset)."""
    low = kind.lower()
    if reading == "any":
        over = not over  # "any" wants supersets outside negated classes
    if kind.islower():
        if not over:
            return _ASCII[low]  # ASCII \\d \\w \\s: in every reading's set
        return _widest(low) if reading != "python" else _unicode_class(low)
    # negated shorthand
    if over:
        return ranges_complement(_ASCII[low])
    return ranges_complement(_widest(low) if reading != "python" else _unicode_class(low))


# `.`: Python excludes \\n only; ECMA-262 also \\r, U+2028, U+2029
_DOT = {"python": ranges_complement(((10, 10),)), "any": ranges_complement(((10, 10),)),
        "all": ranges_complement(norm_ranges([(10, 10), (13, 13), (0x2028, 0x2029)]))}


# ------------------------------------------------------------------------------- parser
@dataclass(frozen=True)
class ParsedRegex:
    node: A.Node  # full-match language (every anchor holds at the ends of a full match)
    table: AnchorTable  # the languages by the anchors their matches need (search semantics: search_language)
    reading: str


class _Anchor:
    def __init__(self, kind: str):
        self.kind = kind  # "^" or "$"

    def table(self) -> AnchorTable:
        return T.START if self.kind == "^" else T.END


_SIMPLE_ESCAPES = {"a": 7, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11}


class _Parser:
    def __init__(self, pattern: str, reading: str = "python"):
        self.p = pattern
        self.i = 0
        self.reading = reading

    def error(self, msg: str) -> InvalidRegexError:
        return InvalidRegexError(f"{msg} at position {self.i} in regex {self.p!r}")

    def peek(self) -> str | None:
        return self.p[self.i] if self.i < len(self.p) else None

    def eat(self) -> str:
        c = self.p[self.i]
        self.i += 1
        return c

    # alternatives: list of sequences of items (nodes or anchors)
    def parse_alternation(self) -> list[list]:
        alts = [self.parse_concat()]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.parse_concat())
        return alts

    def parse_concat(self) -> list:
        items: list = []
        while True:
            c = self.peek()
            if c is None or c == "|" or c == ")":
                return items
            atom = self.parse_atom()
            if atom is None:
                continue
            if isinstance(atom, _Anchor):
                if self.peek() is not None and self.peek() in "*+?" or self._at_quantifier_brace():
                    raise self.error("quantified anchor is not supported")
                items.append(atom)
                continue
            atom = self.parse_quantifiers(atom)
            items.append(atom)

    def _at_quantifier_brace(self) -> bool:
        if self.peek() != "{":
            return False
        return re.match(r"\{(\d*)(,(\d*))?\}", self.p[self.i:]) is not None and self.p[self.i + 1:self.i + 2] != "}"

    def parse_quantifiers(self, atom: A.Node | AnchorTable) -> A.Node | AnchorTable:
        quantified = False
        while True:
            c = self.peek()
            lo: int
            hi: int | None
            if c == "*":
                lo, hi = 0, None
                self.i += 1
            elif c == "+":
                lo, hi = 1, None
                self.i += 1
            elif c == "?":
                lo, hi = 0, 1
                self.i += 1
            elif c == "{":
                m = re.match(r"\{(\d*)(,(\d*))?\}", self.p[self.i:])
                if not m or (m.group(1) == "" and m.group(2) is None):
                    return atom  # literal '{' handled by the atom parser next time
                lo = int(m.group(1)) if m.group(1) else 0
                if m.group(2) is None:
                    hi = lo
                else:
                    hi = int(m.group(3)) if m.group(3) else None
                if hi is not None and hi < lo:
                    raise self.error("min repeat greater than max repeat")
                if lo > MAX_REPEAT or (hi is not None and hi > MAX_REPEAT):
                    raise self.error("repeat count too large")
                self.i += m.end()
            else:
                return atom
            if quantified:
                raise self.error("multiple repeat")
            quantified = True
            # lazy / possessive suffix
            if self.peek() == "?":
                self.i += 1
            elif self.peek() == "+":
                raise self.error("possessive quantifiers are not supported")
            atom = T.repeat(atom, lo, hi, self.reading) if isinstance(atom, AnchorTable) else A.rep(atom, lo, hi)
            if self.peek() is not None and self.peek() in "*+?{":
                if self.peek() == "{" and not self._at_quantifier_brace():
                    return atom
                raise self.error("multiple repeat")

    def parse_atom(self):
        c = self.eat()
        if c == "(":
            return self.parse_group()
        if c == "[":
            return A.chars(self.parse_class())
        if c == ".":
            return A.chars(_DOT[self.reading])
        if c == "^":
            return _Anchor("^")
        if c == "$":
            return _Anchor("$")
        if c == "\\":
            return self.parse_escape()
        if c in "*+?":
            raise self.error("nothing to repeat")
        if c == "{" and self._at_quantifier_brace_prev():
            raise self.error("nothing to repeat")
        return A.lit(c)

    def _at_quantifier_brace_prev(self) -> bool:
        self.i -= 1
        r = self._at_quantifier_brace()
        self.i += 1
        return r

    def parse_group(self):
        if self.peek() == "?":
            self.i += 1
            c = self.peek()
            if c == ":":
                self.i += 1
            elif c == "P" and self.p[self.i + 1:self.i + 2] == "<":
                j = self.p.find(">", self.i)
                if j < 0:
                    raise self.error("unterminated group name")
                self.i = j + 1
            elif c == "#":
                j = self.p.find(")", self.i)
                if j < 0:
                    raise self.error("unterminated comment")
                self.i = j + 1
                return None
            elif c == "<" and self.p[self.i + 1:self.i + 2] not in ("=", "!"):
                j = self.p.find(">", self.i)
                if j < 0:
                    raise self.error("unterminated group name")
                self.i = j + 1
            else:
                raise self.error(f"unsupported group construct '(?{c}'")
        alts = self.parse_alternation()
        if self.peek() != ")":
            raise self.error("missing )")
        self.i += 1
        return _alts_to_value(alts, self.reading)

    def parse_escape(self) -> A.Node:
        if self.i >= len(self.p):
            raise self.error("trailing backslash")
        c = self.eat()
        if c in "dDwWsS":
            return A.chars(shorthand(c, over=False, reading=self.reading))
        if c in "AZ":
            return _Anchor("^" if c == "A" else "$")
        if c in "bB":
            raise self.error("word boundaries are not supported")
        cp = self._escape_codepoint(c, in_class=False)
        return A.lit(chr(cp))

    def _escape_codepoint(self, c: str, in_class: bool) -> int:
        if c in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[c]
        if c == "b" and in_class:
            return 8
        if c == "x":
            h = self.p[self.i:self.i + 2]
            if len(h) != 2 or not all(ch in "0123456789abcdefABCDEF" for ch in h):
                raise self.error("bad \\x escape")
            self.i += 2
            return int(h, 16)
        if c in "uU":
            n = 4 if c == "u" else 8
            h = self.p[self.i:self.i + n]
            if len(h) != n or not all(ch in "0123456789abcdefABCDEF" for ch in h):
                raise self.error(f"bad \\{c} escape")
            self.i += n
            v = int(h, 16)
            if v > A.MAX_CP or 0xD800 <= v <= 0xDFFF:
                raise self.error("escape outside the encodable code points")
            return v
        if c == "0":
            # octal \0, \0o, \0oo
            digits = ""
            while len(digits) < 2 and self.peek() is not None and self.peek() in "01234567":
                digits += self.eat()
            return int("0" + digits, 8)
        if c.isdigit():
            if in_class and c in "01234567":
                digits = c
                while len(digits) < 3 and self.peek() is not None and self.peek() in "01234567":
                    digits += self.eat()
                return int(digits, 8)
            raise self.error("backreferences are not supported")
        if c == "N":
            raise self.error("\\N{...} escapes are not supported")
        if c.isascii() and c.isalnum():
            raise self.error(f"bad escape \\{c}")
        return ord(c)

    def class_shorthand(self, kind: str, *, negated: bool) -> Ranges:
        """\\d \\w \\s (or negations) inside a class: a subset of Python's set, or a superset when the class
        is negated, so the class stays a subset of what Python matches."""
        return shorthand(kind, over=negated, reading=self.reading)

    def parse_class(self) -> Ranges:
        negated = False
        if self.peek() == "^":
            negated = True
            self.i += 1
        over = negated  # inside a negated class we need supersets
        parts: list[tuple[int, int]] = []
        first = True
        while True:
            if self.i >= len(self.p):
                raise self.error("unterminated character set")
            c = self.eat()
            if c == "]" and not first:
                break
            first = False
            lo: int | None
            if c == "\\":
                if self.i >= len(self.p):
                    raise self.error("trailing backslash")
                e = self.eat()
                if e in "dDwWsS":
                    parts.extend(self.class_shorthand(e, negated=over))
                    continue
                lo = self._escape_codepoint(e, in_class=True)
            elif c == "[" and self.peek() == ":":
                raise self.error("POSIX classes are not supported")
            else:
                lo = ord(c)
            # range?
            if self.peek() == "-" and self.p[self.i + 1:self.i + 2] not in ("]", ""):
                self.i += 1
                c2 = self.eat()
                if c2 == "\\":
                    e = self.eat()
                    if e in "dDwWsS":
                        raise self.error("bad character range")
                    hi = self._escape_codepoint(e, in_class=True)
                else:
                    hi = ord(c2)
                if hi < lo:
                    raise self.error("bad character range")
                parts.append((lo, hi))
            else:
                parts.append((lo, lo))
        rs = norm_ranges(parts)
        return ranges_complement(rs) if negated else rs


def _items_table(items: list, reading: str) -> AnchorTable:
    """A sequence of nodes, anchors and anchored groups as an AnchorTable (runs of plain nodes kept whole)."""
    tables: list[AnchorTable] = []
    run: list[A.Node] = []
    for it in items:
        if isinstance(it, A.Node):
            run.append(it)
            continue
        if run:
            tables.append(T.table_of(A.seq(*run)))
            run = []
        tables.append(it.table() if isinstance(it, _Anchor) else it)
    if run or not tables:
        tables.append(T.table_of(A.seq(*run)))
    return T.sequence(tables, reading)


def _alts_to_value(alts: list[list], reading: str) -> A.Node | AnchorTable:
    """A group's alternatives: a plain node when no anchor stands inside, else an AnchorTable."""
    if all(isinstance(it, A.Node) for a in alts for it in a):
        return A.alt(*[A.seq(*a) for a in alts])
    return T.union([_items_table(a, reading) for a in alts])


@byte_memo(PARSE_CACHE_BYTES, name="regex parse cache")
def parse_regex(pattern: str, reading: str = "python") -> ParsedRegex:
    """Parse a Python-`re` pattern. Raises InvalidRegexError. `reading`: see the module docstring."""
    if reading not in READINGS:
        raise ValueError(f"reading must be one of {READINGS}")
    if not isinstance(pattern, str):
        raise InvalidRegexError(f"regex must be a string, got {type(pattern).__name__}")
    try:
        re.compile(pattern)
    except re.error as e:
        raise InvalidRegexError(f"invalid regex {pattern!r}: {e}") from None
    except (OverflowError, RecursionError) as e:
        raise InvalidRegexError(f"invalid regex {pattern!r}: {e}") from None
    p = _Parser(pattern, reading)
    try:
        alts = p.parse_alternation()
    except RecursionError:
        raise InvalidRegexError(f"regex {pattern!r} is nested too deeply") from None
    if p.i != len(pattern):
        raise p.error("unbalanced parenthesis")
    table = T.union([_items_table(a, reading) for a in alts])
    return ParsedRegex(T.full_match(table), table, reading)


def search_language(parsed: ParsedRegex) -> A.Node:
    """The language of strings s with re.search(pattern, s) (JSON Schema `pattern` semantics).

    Matches that need no start get an arbitrary-string prefix, those that need no end a suffix. A `$` is
    taken as the very end (Python also allows one trailing newline there: excluding it only narrows the
    language; the "any" reading includes it)."""
    return T.search(parsed.table, parsed.reading)


__all__ = ["parse_regex", "search_language", "ParsedRegex", "shorthand", "ranges_union"]
