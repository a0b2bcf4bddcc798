"""Anchors (`^`, `$`) anywhere in a pattern, read exactly: a sub-pattern is split by the anchor requirements
its matches carry.

A match of a sub-pattern spans input[i:j]. A `^` inside it asserts that the position it stands at is 0; a `$`
that it is the input's end. So a match carries two flags: it needs i == 0 ("start"), it needs j == len(input)
("end"). `AnchorTable` holds, per pair of flags, the language of the matches carrying exactly those flags and
whether that language holds the empty string. Concatenation X.Y is exact with two rules: a `^` inside Y
(Y needs its own start at 0) leaves X nothing but the empty string, a `$` inside X leaves Y nothing but the
empty string. A branch that breaks them (`a^b`) is empty -- a valid reading, not a refusal. Repetitions
of a sub-pattern with anchors are expanded copy by copy (`X*` in closed form), up to MAX_ANCHORED_COPIES.

JSON Schema's `pattern` (re.search) then admits, for each flag pair, an arbitrary prefix where no start is
needed and an arbitrary suffix where no end is needed; a full match (`regex=`) admits the union of the
languages. Readings (see regex_parser): Python's `$` also matches before a final newline. The "python" and
"all" readings take `$` as the very end (fewer matches: a subset, as they promise); "any" (a superset) lets
a match needing the end stop before a final newline, and lets a `$` be followed by more text.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidRegexError
from . import regex_ast as A

MAX_ANCHORED_COPIES = 32  # a repetition of a group with an anchor inside is expanded up to this many copies

Flags = tuple[bool, bool]  # (needs start, needs end)
FLAGS: tuple[Flags, ...] = ((False, False), (True, False), (False, True), (True, True))


def nullable(node: A.Node) -> bool:
    """Whether a parsed pattern node matches the empty string."""
    if isinstance(node, A.Lit):
        return not node.data
    if isinstance(node, (A.Chars, A.Bytes)):
        return False
    if isinstance(node, A.Seq):
        return all(nullable(x) for x in node.items)
    if isinstance(node, A.Alt):
        return any(nullable(x) for x in node.items)
    if isinstance(node, A.Rep):
        return node.lo == 0 or nullable(node.item)
    raise TypeError(f"not a parsed pattern node: {node!r}")


@dataclass(frozen=True)
class AnchorTable:
    """Per flag pair: the language of the matches carrying exactly those flags, and whether it holds ""."""
    parts: tuple[tuple[Flags, A.Node, bool], ...]

    def get(self, flags: Flags) -> tuple[A.Node, bool]:
        for f, node, eps in self.parts:
            if f == flags:
                return node, eps
        return A.NOTHING, False


def table_of(node: A.Node) -> AnchorTable:
    """A plain (anchor-free) node: every match needs nothing."""
    return AnchorTable((((False, False), node, nullable(node)),))


START = AnchorTable((((True, False), A.EMPTY, True),))  # `^`
END = AnchorTable((((False, True), A.EMPTY, True),))  # `$`


def _build(entries: list[tuple[Flags, A.Node]]) -> AnchorTable:
    by: dict[Flags, list[A.Node]] = {}
    for f, node in entries:
        if not A.is_nothing(node):
            by.setdefault(f, []).append(node)
    out = []
    for f in FLAGS:
        if f in by:
            node = A.alt(*by[f])
            out.append((f, node, nullable(node)))
    return AnchorTable(tuple(out))


def concat(x: AnchorTable, y: AnchorTable, reading: str) -> AnchorTable:
    out: list[tuple[Flags, A.Node, bool]] = []
    for (sx, ex), lx, nx in x.parts:
        for (sy, ey), ly, ny in y.parts:
            flags = (sx or sy, ex or ey)
            if sy and ex:  # both sides must be empty
                if nx and ny:
                    out.append((flags, A.EMPTY))
            elif sy:  # a start inside y: nothing before it
                if nx:
                    out.append((flags, ly))
            elif ex:  # an end inside x: nothing after it
                if ny:
                    out.append((flags, lx))
                if reading == "any":  # Python's `$` before a final newline, then more pattern (a superset)
                    out.append(((sx, ey), A.seq(lx, ly)))
            else:
                out.append((flags, A.seq(lx, ly)))
    return _build(out)


def union(tables: list[AnchorTable]) -> AnchorTable:
    return _build([(f, node) for t in tables for f, node, _ in t.parts])


def sequence(tables: list[AnchorTable], reading: str) -> AnchorTable:
    out = table_of(A.EMPTY)
    for t in tables:
        out = concat(out, t, reading)
    return out


def _star(x: AnchorTable, reading: str) -> AnchorTable:
    """X* up to copies matching "" (dropping one only drops requirements): the first copy may need the
    start, the last the end, those between need nothing."""
    if reading == "any":  # a `$` may be followed by more copies (a superset)
        x = _build([((s, False), n) for (s, _), n, _ in x.parts] + [(f, n) for f, n, _ in x.parts])
    u = A.star(x.get((False, False))[0])
    s, e, b = x.get((True, False))[0], x.get((False, True))[0], x.get((True, True))[0]
    return _build([((False, False), u), ((True, False), A.seq(s, u)), ((False, True), A.seq(u, e)),
                   ((True, True), A.alt(A.seq(s, u, e), b))])


def repeat(x: AnchorTable, lo: int, hi: int | None, reading: str) -> AnchorTable:
    """X{lo,hi} = X^lo (X|"")^(hi-lo), or X^lo X* when unbounded."""
    if len(x.parts) == 1 and x.parts[0][0] == (False, False):
        node = A.rep(x.parts[0][1], lo, hi)
        return table_of(node)
    if lo > MAX_ANCHORED_COPIES or (hi is not None and hi > MAX_ANCHORED_COPIES):
        raise InvalidRegexError(f"a group with an anchor inside repeated more than {MAX_ANCHORED_COPIES} "
                                f"times is not supported")
    optional = union([x, table_of(A.EMPTY)])
    tail = [_star(x, reading)] if hi is None else [optional] * (hi - lo)
    return sequence([x] * lo + tail, reading)


def full_match(t: AnchorTable) -> A.Node:
    """The strings the whole pattern matches from start to end (every requirement holds there)."""
    return A.alt(*[node for _, node, _ in t.parts])


def search(t: AnchorTable, reading: str) -> A.Node:
    """The strings containing a match (re.search): free text before a match that needs no start, after
    one that needs no end ("any": a final newline after one that does)."""
    anything = A.star(A.chars(A.ANY_CHAR))
    end = A.opt(A.lit("\n")) if reading == "any" else A.EMPTY
    return A.alt(*[A.seq(A.EMPTY if s else anything, node, end if e else anything)
                   for (s, e), node, _ in t.parts])
