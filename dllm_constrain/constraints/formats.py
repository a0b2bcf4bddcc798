"""String `format`s as regular languages (over characters, before JSON string encoding).

Each language is a subset of what the format's standard allows and of what jsonschema's FormatChecker
accepts (so every generated value passes validation); e.g. dates are exact including leap years,
date-time uses an upper-case `T`/`Z`, seconds 00-59.

Standard formats that are not regular or not implemented (idn-hostname) are refused. Formats outside the
JSON Schema specification (e.g. "int32", "phone") carry no validation semantics and are ignored.
"""
from __future__ import annotations

import functools

from . import regex_ast as A
from .regex_parser import parse_regex

_YEAR = r"(?:000[1-9]|00[1-9]\d|0[1-9]\d\d|[1-9]\d{3})"
_MD = r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2[0-8]))"
_LEAP_YEAR = r"(?:\d\d(?:[02468][48]|[13579][26]|[2468]0)|(?:[02468][48]|[13579][26]|[2468]0)00)"
DATE = rf"(?:{_YEAR}-{_MD}|{_LEAP_YEAR}-02-29)"
TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
DATE_TIME = rf"{DATE}T{TIME}"
EMAIL = r"[A-Za-z0-9](?:[A-Za-z0-9._%+-]{0,62}[A-Za-z0-9])?@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+"
UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_OCT = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
IPV4 = rf"{_OCT}(?:\.{_OCT}){{3}}"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,60}[A-Za-z0-9])?"
HOSTNAME = rf"{_LABEL}(?:\.{_LABEL}){{0,3}}"

# RFC 3986 pieces
_UNRES = r"A-Za-z0-9._~\-"
_SUB = r"!$&'()*+,;="
_PCT = r"%[0-9A-Fa-f]{2}"
_PCHAR = rf"(?:[{_UNRES}{_SUB}:@]|{_PCT})"
_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]*"
_AUTH = rf"(?:(?:[{_UNRES}{_SUB}:]|{_PCT})*@)?(?:[{_UNRES}{_SUB}]|{_PCT})*(?::\d*)?"
_PATH_ABEMPTY = rf"(?:/{_PCHAR}*)*"
_PATH_ABS = rf"/(?:{_PCHAR}+(?:/{_PCHAR}*)*)?"
_PATH_ROOTLESS = rf"{_PCHAR}+(?:/{_PCHAR}*)*"
_SEG_NZ_NC = rf"(?:[{_UNRES}{_SUB}@]|{_PCT})+"
_PATH_NOSCHEME = rf"{_SEG_NZ_NC}(?:/{_PCHAR}*)*"
_QUERY = rf"(?:\?(?:{_PCHAR}|[/?])*)?"
_FRAG = rf"(?:#(?:{_PCHAR}|[/?])*)?"
URI = rf"{_SCHEME}:(?://{_AUTH}{_PATH_ABEMPTY}|{_PATH_ABS}|{_PATH_ROOTLESS})?{_QUERY}{_FRAG}"
_RELATIVE = rf"(?://{_AUTH}{_PATH_ABEMPTY}|{_PATH_ABS}|{_PATH_NOSCHEME})?{_QUERY}{_FRAG}"
URI_REFERENCE = rf"(?:{URI}|{_RELATIVE})"
JSON_POINTER = r"(?:/(?:[^/~]|~[01])*)*"
RELATIVE_JSON_POINTER = rf"(?:0|[1-9]\d*)(?:#|{JSON_POINTER})"
_DUR_TIME = r"T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S)"
DURATION = rf"P(?:(?:\d+D|\d+M(?:\d+D)?|\d+Y(?:\d+M(?:\d+D)?)?)(?:{_DUR_TIME})?|{_DUR_TIME}|\d+W)"
REGEX = r"[A-Za-z0-9 _]*"  # a sound subset: every such string is a valid regex


def _ipv6() -> str:
    h = r"[0-9A-Fa-f]{1,4}"
    ls32 = rf"(?:{h}:{h}|{IPV4})"
    forms = [
        rf"(?:{h}:){{6}}{ls32}",
        rf"::(?:{h}:){{5}}{ls32}",
        rf"(?:{h})?::(?:{h}:){{4}}{ls32}",
        rf"(?:(?:{h}:){{0,1}}{h})?::(?:{h}:){{3}}{ls32}",
        rf"(?:(?:{h}:){{0,2}}{h})?::(?:{h}:){{2}}{ls32}",
        rf"(?:(?:{h}:){{0,3}}{h})?::{h}:{ls32}",
        rf"(?:(?:{h}:){{0,4}}{h})?::{ls32}",
        rf"(?:(?:{h}:){{0,5}}{h})?::{h}",
        rf"(?:(?:{h}:){{0,6}}{h})?::",
    ]
    return "(?:" + "|".join(forms) + ")"


IPV6 = _ipv6()

FORMATS: dict[str, str] = {
    "date": DATE,
    "time": TIME,
    "date-time": DATE_TIME,
    "email": EMAIL,
    "idn-email": EMAIL,
    "uuid": UUID,
    "uri": URI,
    "iri": URI,
    "uri-reference": URI_REFERENCE,
    "iri-reference": URI_REFERENCE,
    "uri-template": URI,  # a URI without braces is a valid template
    "hostname": HOSTNAME,
    "ipv4": IPV4,
    "ipv6": IPV6,
    "json-pointer": JSON_POINTER,
    "relative-json-pointer": RELATIVE_JSON_POINTER,
    "duration": DURATION,
    "regex": REGEX,
}

# formats defined by the JSON Schema specification (2020-12 and earlier drafts)
STANDARD_FORMATS = frozenset({
    "date", "time", "date-time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4", "ipv6",
    "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer",
    "relative-json-pointer", "regex",
})


@functools.lru_cache(maxsize=None)
def format_node(name: str) -> A.Node | None:
    """Char-level language for a supported format, or None if the format is not supported."""
    pat = FORMATS.get(name)
    if pat is None:
        return None
    return parse_regex(pat).node


# ------------------------------------------------------------------------------------------ length bounds
# A format with minLength/maxLength: the generic product (dfa_ops) of the format's byte DFA with a
# code-point counter spends ~0.1 ms of numpy per product state, and a format with its own counters (the
# email's {0,62} local part, a hostname's labels) times maxLength 64..253 reaches thousands of states
# (seconds, or over the intersection limit). Here: (1) bounds the format implies are dropped and
# repetitions that the maximum length cannot reach are unbounded (the same intersection, a far smaller
# format DFA); (2) the product with the counter is built directly from the format DFA's grouped rows; (3) if
# even that would exceed `limit` states, the format is narrowed to a sub-language no longer than the maximum
# (repetitions capped), a sound subset that needs no counter.


def _cp_len(data: bytes) -> int:
    return len(data.decode("utf-8", "surrogatepass"))


def length_range(node: A.Node) -> tuple[int, int | None]:
    """(minimum, maximum or None) length in code points of the strings of a char-level AST (Graph/Members
    nodes: (0, None), a safe over-approximation)."""
    if isinstance(node, (A.Chars,)):
        return 1, 1
    if isinstance(node, A.Bytes):  # a raw byte: part of one code point at most
        return 0, 1
    if isinstance(node, A.Lit):
        n = _cp_len(node.data)
        return n, n
    if isinstance(node, A.Seq):
        lo, hi = 0, 0
        for it in node.items:
            a, b = length_range(it)
            lo += a
            hi = None if hi is None or b is None else hi + b
        return lo, hi
    if isinstance(node, A.Alt):
        if not node.items:
            return 0, 0
        rs = [length_range(it) for it in node.items]
        return min(a for a, _ in rs), (None if any(b is None for _, b in rs) else max(b for _, b in rs))
    if isinstance(node, A.Rep):
        a, b = length_range(node.item)
        hi = None if node.hi is None or b is None else b * node.hi
        if node.hi is not None and b == 0:
            hi = 0
        return a * node.lo, hi
    return 0, None


def unbind_unreachable_counts(node: A.Node, budget: int) -> A.Node:
    """The same language once intersected with "at most `budget` code points": a repetition whose upper
    bound no string within the budget can reach (each copy needs >= 1 code point) becomes unbounded, so the
    DFA no longer counts it. `budget` is the room left for `node` by the rest of its context."""
    if isinstance(node, A.Seq):
        mins = [length_range(it)[0] for it in node.items]
        total = sum(mins)
        return A.seq(*[unbind_unreachable_counts(it, budget - (total - m)) for it, m in zip(node.items, mins)])
    if isinstance(node, A.Alt):
        return A.alt(*[unbind_unreachable_counts(it, budget) for it in node.items])
    if isinstance(node, A.Rep):
        m = length_range(node.item)[0]
        item_budget = budget - max(node.lo - 1, 0) * m
        item = unbind_unreachable_counts(node.item, item_budget)
        hi = node.hi
        if hi is not None and m >= 1 and hi >= budget // m:
            hi = None
        return A.rep(item, node.lo, hi)
    return node


def cap_to_length(node: A.Node, mx: int) -> A.Node | None:
    """A sub-language of `node` whose strings have at most `mx` code points (every repetition capped at the
    largest common count that fits), or None when even the shortest shape is too long."""
    def capped(n: A.Node, c: int) -> A.Node:
        if isinstance(n, A.Seq):
            return A.seq(*[capped(it, c) for it in n.items])
        if isinstance(n, A.Alt):
            return A.alt(*[capped(it, c) for it in n.items])
        if isinstance(n, A.Rep):
            hi = max(n.lo, c) if n.hi is None else min(n.hi, max(n.lo, c))
            return A.rep(capped(n.item, c), n.lo, hi)
        return n

    lo, hi = 0, mx
    best = None
    while lo <= hi:  # the largest cap c whose language fits
        c = (lo + hi) // 2
        cand = capped(node, c)
        top = length_range(cand)[1]
        if top is not None and top <= mx:
            best, lo = cand, c + 1
        else:
            hi = c - 1
    return best


_DFA_CACHE: dict = {}


def _full_dfa(node: A.Node, deadline, limit: int):
    """The complete DFA of a (small) format language: per state, its (byte-class label, target, counts a
    code point) groups, whether it accepts, and the fewest code points to acceptance. Memoised per node
    (formats are few); None when it has more than `limit` states."""
    hit = _DFA_CACHE.get(node)
    if hit is not None:
        return hit if hit[0] is not None else None
    from .dfa import DEAD, START, LazyDFA
    from .dfa_ops import _ranges
    from .nfa import build_nfa

    d = LazyDFA(build_nfa(node, deadline), deadline)  # (subset construction: faster than derivatives here)
    rows: dict[int, list] = {}
    todo = [START]
    while todo:
        q = todo.pop()
        if q in rows:
            continue
        if deadline is not None:
            deadline.check()
        if len(rows) >= limit:
            _DFA_CACHE[node] = (None,)
            return None
        d.expand(q)
        groups: dict[tuple[int, bool], list[int]] = {}
        for b, t in enumerate(d.T[q].tolist()):
            if t != DEAD:
                groups.setdefault((t, not (0x80 <= b <= 0xBF)), []).append(b)
        rows[q] = [(A.Bytes(_ranges(bs)), t, lead) for (t, lead), bs in groups.items()]
        todo.extend(t for _, t, _ in rows[q] if t not in rows)
    acc = {q: bool(d.accepting[q]) for q in rows}
    # fewest code points from q to acceptance (Bellman-Ford over the small graph, 0/1 weights)
    INF = 1 << 30
    mincp = {q: (0 if acc[q] else INF) for q in rows}
    changed = True
    while changed:
        changed = False
        for q, row in rows.items():
            best = mincp[q]
            for _, t, lead in row:
                c = mincp[t] + (1 if lead else 0)
                if c < best:
                    best = c
            if best < mincp[q]:
                mincp[q], changed = best, True
    res = (rows, acc, mincp, START)
    if len(_DFA_CACHE) > 256:
        _DFA_CACHE.clear()
    _DFA_CACHE[node] = res
    return res


def with_length(node: A.Node, mn: int, mx: int | None, deadline=None, limit: int = 20000,
                cap: bool = True) -> A.Node:
    """node ∩ {strings of mn..mx code points} (mx None: no maximum), exact when the layered product fits
    `limit` states, else the capped sub-language of cap_to_length (sound; `cap=False`: FormatLengthTooLarge
    instead, for callers that must stay exact)."""
    from .dfa_ops import _prune

    flo, fhi = length_range(node)
    if mx is not None and fhi is not None and fhi <= mx:
        mx = None  # implied
    if mn <= flo:
        mn = 0
    if mx is not None and mn > mx:
        return A.NOTHING
    if mn == 0 and mx is None:
        return node
    if mx is not None:
        node = unbind_unreachable_counts(node, mx)
    full = _full_dfa(node, deadline, limit)
    top = mx if mx is not None else mn
    # (a layered state costs ~1 us and a few edges: twice the generic product's state limit)
    if full is None or len(full[0]) * (top + 1) > 2 * limit:
        if not cap:
            raise FormatLengthTooLarge()
        capped = cap_to_length(node, mx) if mx is not None else None
        if capped is None or capped == node:
            raise FormatLengthTooLarge()
        return with_length(capped, mn, None, deadline, limit)
    rows, acc, mincp, start = full
    layers = _length_layers(rows, mincp, start, mn, mx, deadline)
    ids: list[dict[int, int]] = []
    n = 0
    for layer in layers:
        ids.append({q: n + k for k, q in enumerate(layer)})
        n += len(layer)
    edges = []
    finals = []
    last = len(layers) - 1
    for i, layer in enumerate(layers):
        here = ids[i]
        up = ids[i + 1] if i < last else (here if mx is None and i == mn else {})
        for q in layer:
            u = here[q]
            if acc[q] and i >= mn:
                finals.append(u)
            for lab, t, lead in rows[q]:
                v = (up if lead else here).get(t)
                if v is not None:
                    edges.append((u, lab, v))
    if not finals:
        return A.NOTHING
    if mn == 0:
        return A.Graph(n, 0, tuple(finals), tuple(edges))
    return _prune(n, 0, finals, edges)


def _length_layers(rows: list, mincp: list, start: int, mn: int, mx: int | None, deadline) -> list[list[int]]:
    """The layers of `with_length`'s product: layer i holds the format states after i code points (saturating at
    mn when there is no maximum: that layer is closed under its edges); states that cannot end within mx are never
    built, so without a minimum every built state is co-reachable."""
    nlayers = (mx if mx is not None else mn) + 1
    layers: list[list[int]] = []
    cur = [start]
    for i in range(nlayers):
        if deadline is not None:
            deadline.check()
        seen = dict.fromkeys(cur)
        todo = list(cur)
        # closure under continuation bytes (same code point count); the saturating layer (no maximum, i = mn) holds
        # every state after at least mn code points: closed under every edge
        saturating = mx is None and i == mn
        while todo:
            q = todo.pop()
            for _, t, lead in rows[q]:
                if (saturating or not lead) and t not in seen and (mx is None or i + mincp[t] <= mx):
                    seen[t] = None
                    todo.append(t)
        layer = list(seen)
        layers.append(layer)
        if mx is None and i == mn:
            break
        nxt = dict.fromkeys(t for q in layer for _, t, lead in rows[q]
                            if lead and (mx is None or i + 1 + mincp[t] <= mx))
        if not nxt or i + 1 >= nlayers:
            break
        cur = list(nxt)
    return layers


class FormatLengthTooLarge(Exception):
    """A format with length bounds that neither the product nor the capped format can express."""
