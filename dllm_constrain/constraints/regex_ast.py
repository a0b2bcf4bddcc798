"""A small regular-expression AST over Unicode code points (and raw bytes where needed).

Every constraint (a user regex, a JSON Schema) is first lowered to this AST; `nfa.py` turns it into a
byte-level NFA (code points are encoded as UTF-8). Nodes are immutable; the smart constructors
(`seq`, `alt`, `rep`, `lit`, `chars`) simplify on the fly so the empty language (`NOTHING`) propagates.

Char sets are tuples of inclusive (lo, hi) code-point ranges, sorted and merged ("normal form").
Surrogates U+D800..U+DFFF can never be encoded as UTF-8 and are removed from every set.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

MAX_CP = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)

Ranges = tuple[tuple[int, int], ...]


# ----------------------------------------------------------------------------------------- char sets
def norm_ranges(rs: Iterable[tuple[int, int]]) -> Ranges:
    """Sort, merge and drop surrogates."""
    items = sorted((lo, hi) for lo, hi in rs if lo <= hi)
    out: list[list[int]] = []
    for lo, hi in items:
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1][1] = hi
        else:
            out.append([lo, hi])
    res: list[tuple[int, int]] = []
    for lo, hi in out:
        # cut the surrogate block out
        if hi < SURROGATES[0] or lo > SURROGATES[1]:
            res.append((lo, hi))
        else:
            if lo < SURROGATES[0]:
                res.append((lo, SURROGATES[0] - 1))
            if hi > SURROGATES[1]:
                res.append((SURROGATES[1] + 1, hi))
    return tuple(res)


def ranges_union(*sets: Ranges) -> Ranges:
    return norm_ranges(r for s in sets for r in s)


def ranges_complement(s: Ranges, universe_hi: int = MAX_CP) -> Ranges:
    out = []
    prev = 0
    for lo, hi in s:
        if lo > prev:
            out.append((prev, lo - 1))
        prev = hi + 1
    if prev <= universe_hi:
        out.append((prev, universe_hi))
    return norm_ranges(out)


def ranges_intersect(a: Ranges, b: Ranges) -> Ranges:
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def ranges_difference(a: Ranges, b: Ranges) -> Ranges:
    return ranges_intersect(a, ranges_complement(b))


def ranges_contains(s: Ranges, cp: int) -> bool:
    for lo, hi in s:
        if lo <= cp <= hi:
            return True
        if cp < lo:
            return False
    return False


def ranges_of_chars(chars: str) -> Ranges:
    return norm_ranges((ord(c), ord(c)) for c in chars)


ANY_CHAR: Ranges = norm_ranges([(0, MAX_CP)])
DIGIT: Ranges = ((0x30, 0x39),)


# ----------------------------------------------------------------------------------------- nodes
class Node:
    __slots__ = ("_hash",)

    def key(self) -> tuple:  # structural identity
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Node) and self.key() == other.key()

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            h = hash(self.key())
            object.__setattr__(self, "_hash", h)
            return h


class Chars(Node):
    """One code point from a set (encoded as UTF-8)."""

    __slots__ = ("ranges",)

    def __init__(self, ranges: Ranges):
        self.ranges = ranges

    def key(self) -> tuple:
        return ("C", self.ranges)

    def __repr__(self) -> str:
        return f"Chars({self.ranges!r})"


class Bytes(Node):
    """One raw byte from a set of byte ranges (0..255)."""

    __slots__ = ("ranges",)

    def __init__(self, ranges: Ranges):
        self.ranges = ranges

    def key(self) -> tuple:
        return ("B", self.ranges)

    def __repr__(self) -> str:
        return f"Bytes({self.ranges!r})"


class Lit(Node):
    """A literal byte string."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def key(self) -> tuple:
        return ("L", self.data)

    def __repr__(self) -> str:
        return f"Lit({self.data!r})"


class Seq(Node):
    __slots__ = ("items",)

    def __init__(self, items: tuple[Node, ...]):
        self.items = items

    def key(self) -> tuple:
        return ("S", self.items)

    def __repr__(self) -> str:
        return f"Seq{self.items!r}"


class Alt(Node):
    __slots__ = ("items",)

    def __init__(self, items: tuple[Node, ...]):
        self.items = items

    def key(self) -> tuple:
        return ("A", self.items)

    def __repr__(self) -> str:
        return f"Alt{self.items!r}"


class Rep(Node):
    """item{lo,hi}; hi None = unbounded."""

    __slots__ = ("item", "lo", "hi")

    def __init__(self, item: Node, lo: int, hi: int | None):
        self.item = item
        self.lo = lo
        self.hi = hi

    def key(self) -> tuple:
        return ("R", self.item, self.lo, self.hi)

    def __repr__(self) -> str:
        return f"Rep({self.item!r},{self.lo},{self.hi})"


class Graph(Node):
    """An explicit automaton whose edges are labelled with sub-expressions (None = epsilon).

    Lets a constraint share sub-automata without the quadratic blow-up of writing them as a tree
    (e.g. a JSON object's optional properties: linear instead of quadratic)."""

    __slots__ = ("n", "start", "finals", "edges")

    def __init__(self, n: int, start: int, finals: tuple[int, ...], edges: tuple[tuple[int, Node | None, int], ...]):
        self.n = n
        self.start = start
        self.finals = finals
        self.edges = edges

    def key(self) -> tuple:
        return ("G", self.n, self.start, self.finals, self.edges)

    def __repr__(self) -> str:
        return f"Graph(n={self.n}, edges={len(self.edges)})"


class Members(Node):
    """A JSON object's members: `entries` at most once each in any order, `extras` any number of times
    (among the entries when `interleave`, else after them), separated by `sep`; complete when every `required` entry is present and the member count is in
    [lo, hi] (hi None = unbounded; see object_members.py for how additional members count).

    Written out eagerly this is an automaton over subsets of the entries (2^n states); the derivative
    engine (`deriv.py`) materialises only the subsets a walk visits. Build it with
    `object_members.object_members`, which checks satisfiability."""

    __slots__ = ("entries", "required", "extras", "sep", "lo", "hi", "interleave")

    def __init__(self, entries: tuple[Node, ...], required: tuple[bool, ...], extras: tuple[Node, ...], sep: Node,
                 lo: int, hi: int | None, interleave: bool = True):
        self.entries = entries
        self.required = required
        self.extras = extras
        self.sep = sep
        self.lo = lo
        self.hi = hi
        self.interleave = interleave  # extras may come before / between entries (else after all of them)

    def key(self) -> tuple:
        return ("M", self.entries, self.required, self.extras, self.sep, self.lo, self.hi, self.interleave)

    def __repr__(self) -> str:
        return f"Members(entries={len(self.entries)}, extras={len(self.extras)}, lo={self.lo}, hi={self.hi})"


EMPTY = Seq(())  # matches the empty string
NOTHING = Alt(())  # matches nothing


def is_nothing(n: Node) -> bool:
    return isinstance(n, Alt) and not n.items


def is_empty(n: Node) -> bool:
    return isinstance(n, Seq) and not n.items


def chars(ranges: Iterable[tuple[int, int]]) -> Node:
    r = norm_ranges(ranges)
    return Chars(r) if r else NOTHING


def char(c: str) -> Node:
    return lit(c)


def lit(s: str | bytes) -> Node:
    data = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return Lit(data) if data else EMPTY


def seq(*items: Node) -> Node:
    out: list[Node] = []
    for it in items:
        if is_nothing(it):
            return NOTHING
        if isinstance(it, Seq):
            out.extend(it.items)
        else:
            out.append(it)
    # merge adjacent literals
    merged: list[Node] = []
    for it in out:
        if isinstance(it, Lit) and merged and isinstance(merged[-1], Lit):
            merged[-1] = Lit(merged[-1].data + it.data)
        else:
            merged.append(it)
    if len(merged) == 1:
        return merged[0]
    return Seq(tuple(merged))


def alt(*items: Node) -> Node:
    out: list[Node] = []
    seen: set[Node] = set()
    char_ranges: list[tuple[int, int]] = []
    n_chars = 0
    for it in items:
        sub = it.items if isinstance(it, Alt) else (it,)
        for s in sub:
            if isinstance(s, Chars):
                char_ranges.extend(s.ranges)
                n_chars += 1
                continue
            if s not in seen:
                seen.add(s)
                out.append(s)
    if n_chars:
        out.insert(0, Chars(norm_ranges(char_ranges)))
    if len(out) == 1:
        return out[0]
    return Alt(tuple(out))


def rep(item: Node, lo: int, hi: int | None) -> Node:
    if hi is not None and hi < lo:
        return NOTHING
    if is_nothing(item):
        return EMPTY if lo == 0 else NOTHING
    if is_empty(item):
        return EMPTY
    if hi == 0:
        return EMPTY
    if lo == 1 and hi == 1:
        return item
    return Rep(item, lo, hi)


def opt(item: Node) -> Node:
    return rep(item, 0, 1)


def star(item: Node) -> Node:
    return rep(item, 0, None)


def plus(item: Node) -> Node:
    return rep(item, 1, None)


def alt_literals(strings: Sequence[str | bytes]) -> Node:
    """Alternation of literal strings as a prefix trie (keeps the NFA small for big enums)."""
    datas = sorted({s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in strings})
    if not datas:
        return NOTHING
    return _trie_node(datas, 0)


def _trie_node(datas: list[bytes], depth: int) -> Node:
    # datas sorted, all share datas[*][:depth]
    branches: list[Node] = []
    has_end = False
    i = 0
    while i < len(datas):
        d = datas[i]
        if len(d) == depth:
            has_end = True
            i += 1
            continue
        b = d[depth]
        j = i
        while j < len(datas) and len(datas[j]) > depth and datas[j][depth] == b:
            j += 1
        group = datas[i:j]
        # extend the common prefix of the group as far as possible
        k = depth + 1
        first, last = group[0], group[-1]
        while k < len(first) and k < len(last) and first[k] == last[k] and all(len(g) > k for g in group):
            k += 1
        rest = _trie_node(group, k)
        branches.append(seq(Lit(first[depth:k]), rest))
        i = j
    if has_end:
        branches.append(EMPTY)
    return alt(*branches)
