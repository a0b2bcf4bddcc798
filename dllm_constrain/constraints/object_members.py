"""JSON object members in any order, each declared property at most once (`regex_ast.Members`).

JSON Schema does not order an object's properties. Written as a plain automaton, "each of n properties at
most once, in any order" needs a state per subset of the properties already written (2^n). The
`Members` node keeps that construction implicit: its state is the set of entries used, and
the derivative engine (`deriv.py`) builds a state only when a walk reaches it. Keys are distinct JSON
string literals, so a few bytes into a key a single entry survives and the visited part stays small.

This module holds what both automaton constructions share: building the node (with a satisfiability
check), the member-count bookkeeping, the exact shortest completion of a state (the DFA's `dist`), and
an eager subset construction for the Thompson-NFA path (`nfa.py`), bounded in size.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..errors import CompilationTimeoutError, UnsupportedSchemaError
from . import regex_ast as A

INF = 1 << 30


def object_members(entries: Sequence[tuple[A.Node, bool]], extras: Sequence[A.Node], sep: A.Node, lo: int,
                   hi: int | None, path: str = "#", ordered: bool = False, interleave_max: int = 32) -> A.Node:
    """Members of an object: `entries` are (key-value node, required) pairs, each usable at most once, in
    any order; `extras` are key-value nodes usable any number of times, before, between or after them
    (additional properties, whose names may repeat); lo/hi bound the member count. NOTHING when no member
    list satisfies them. With more than `interleave_max` entries, additional members come after the entries
    only (see the state notes below). `ordered`: entries only in their given order, additional members after
    them (a linear automaton: cheaper canvas masks, fewer texts).

    Repeated additional names collapse when the text is parsed, so counting them towards `lo` would accept
    objects with too few properties: at most one additional member counts towards `lo` (all of them count
    towards `hi`, which stays sound). A `lo` that needs two or more additional members is refused."""
    entries = [(kv, req) for kv, req in entries if not (A.is_nothing(kv) and not req)]
    if any(A.is_nothing(kv) for kv, _ in entries):
        return A.NOTHING
    extras = tuple(x for x in extras if not A.is_nothing(x))
    n_req = sum(1 for _, req in entries if req)
    if hi is not None and (n_req > hi or lo > hi):
        return A.NOTHING
    if lo > len(entries) + (1 if extras else 0):
        if extras:
            raise UnsupportedSchemaError("minProperties", path, f"{lo} properties need several additional "
                                         "properties, whose names could repeat")
        return A.NOTHING
    if not entries and not extras:
        return A.EMPTY
    if ordered:
        return _ordered_members(entries, extras, sep, lo, hi)
    return A.Members(tuple(kv for kv, _ in entries), tuple(req for _, req in entries), extras, sep, lo, hi,
                     interleave=len(entries) <= interleave_max)


# A state is (used, extra): `used` is the set of declared entries written (a bit mask) and `extra` the
# number of additional members written, clamped to what the bounds can tell apart (0/1 without hi: only
# one additional member counts towards lo; up to hi with it).
# Interleaved (`Members.interleave`): additional and declared members mix freely, as JSON Schema leaves an
# object's member order open. The DFA then holds a state per (written subset, key prefix), which for
# objects with many declared names multiplies fast; so larger objects take additional members after the
# declared ones only, and the first additional member freezes the state to (FROZEN, room left under hi):
# additional values are then not multiplied by the subsets.
START_EXTRA = 0
FROZEN = -1  # `used` once additional members closed the declared ones (non-interleaved objects)
UNBOUNDED = -1  # room left without hi


def is_started(used: int, extra: int) -> bool:
    """Whether a separator precedes the next member."""
    return used != 0 or extra != 0


def can_add_entry(used: int, extra: int, hi: int | None) -> bool:
    return used != FROZEN and (hi is None or used.bit_count() + extra < hi)


def after_extra(used: int, extra: int, required_mask: int, lo: int, hi: int | None,
                interleave: bool = True) -> tuple[int, int] | None:
    """The state after one more additional member; None when it is not allowed (no room under hi; when
    not interleaved, also a required entry still missing or lo out of reach, as no entry may follow)."""
    if interleave:
        if hi is not None and used.bit_count() + extra >= hi:
            return None
        return used, (min(extra + 1, 1) if hi is None else extra + 1)
    if used == FROZEN:
        if extra == UNBOUNDED:
            return FROZEN, UNBOUNDED
        return (FROZEN, extra - 1) if extra > 0 else None
    n = used.bit_count()
    if (used & required_mask) != required_mask or n + 1 < lo:
        return None
    if hi is None:
        return FROZEN, UNBOUNDED
    return (FROZEN, hi - n - 1) if n < hi else None


def can_close(used: int, extra: int, required_mask: int, lo: int) -> bool:
    if used == FROZEN:
        return True
    return (used & required_mask) == required_mask and used.bit_count() + min(extra, 1) >= lo


def shortest_completion(entry_costs: Sequence[int], required_mask: int, extra_cost: int, sep_cost: int, lo: int,
                        hi: int | None, used: int, extra: int) -> int:
    """Exact length of the shortest continuation that closes the member list from state (used, extra):
    every missing required entry, then the cheapest further members towards lo (at most one additional
    member counts, in all), a separator before each member but the very first. INF when none closes it.
    (Non-interleaved objects reach FROZEN only through a state that could close, so the cheapest
    completion of an unfrozen state never needs an additional member before a declared one.)"""
    if used == FROZEN:
        return 0
    # the missing required entries, by their bits (not a pass over all entries: objects with hundreds of declared
    # properties ask this of every member-list state the automaton reaches)
    need = required_mask & ~used
    total = 0
    added = 0
    while need:
        low = need & -need
        w = entry_costs[low.bit_length() - 1]
        if w >= INF:
            return INF
        total += w
        added += 1
        need ^= low
    k = max(0, lo - used.bit_count() - min(extra, 1) - added)
    if k:
        taken = used | required_mask
        optional = [w for i, w in enumerate(entry_costs) if not taken >> i & 1 and w < INF]
        pool = sorted(optional + ([extra_cost] if extra_cost < INF and extra == 0 else []))
        if len(pool) < k:
            return INF
        total += sum(pool[:k])
        added += k
    if hi is not None and used.bit_count() + extra + added > hi:
        return INF
    n_seps = added if is_started(used, extra) else max(added - 1, 0)
    return min(INF, total + sep_cost * n_seps)


def members_to_graph(m: A.Members, max_nodes: int = 4096) -> A.Node:
    """The eager subset automaton of `m` as a `Graph` (for the Thompson-NFA path); refuses with
    CompilationTimeoutError beyond `max_nodes` states rather than growing exponentially."""
    req_mask = sum(1 << i for i, r in enumerate(m.required) if r)
    index: dict[tuple[int, int], int] = {(0, START_EXTRA): 0}
    order = [(0, START_EXTRA)]
    edges: list[tuple[int, A.Node, int]] = []
    finals = []
    i = 0
    while i < len(order):
        used, extra = order[i]
        if can_close(used, extra, req_mask, m.lo):
            finals.append(i)
        succ = []
        if can_add_entry(used, extra, m.hi):
            succ = [(kv, (used | (1 << j), extra)) for j, kv in enumerate(m.entries) if not used >> j & 1]
        nx = after_extra(used, extra, req_mask, m.lo, m.hi, m.interleave)
        if nx is not None:
            succ += [(x, nx) for x in m.extras]
        for kv, key in succ:
            v = index.get(key)
            if v is None:
                if len(order) >= max_nodes:
                    raise CompilationTimeoutError(f"object members automaton too large (> {max_nodes} states)")
                v = index[key] = len(order)
                order.append(key)
            edges.append((i, A.seq(m.sep, kv) if is_started(used, extra) else kv, v))
        i += 1
    if not finals:
        return A.NOTHING
    return A.Graph(len(order), 0, tuple(finals), tuple(edges))


def _ordered_members(entries: Sequence[tuple[A.Node, bool]], extras: Sequence[A.Node], sep: A.Node, lo: int,
                     hi: int | None) -> A.Node:
    """The members automaton with entries in their given order, as a `Graph` over (next entry, declared
    members so far) and, once additional members start, the room left under hi (same rules as `Members`)."""
    m = len(entries)
    cap = hi if hi is not None else max(lo, 1)
    index: dict[tuple, int] = {}
    edges: list[tuple[int, A.Node | None, int]] = []

    def node(key: tuple) -> int:
        if key not in index:
            index[key] = len(index)
            todo.append(key)
        return index[key]

    todo: list[tuple] = []
    node(("D", 0, 0))
    finals = []
    while todo:
        key = todo.pop()
        u = index[key]
        if key[0] == "T":  # additional members only; key[1] = room left (UNBOUNDED without hi)
            finals.append(u)
            room = key[1]
            if room != 0:
                v = node(("T", room if room == UNBOUNDED else room - 1))
                edges.extend((u, A.seq(sep, x), v) for x in extras)
            continue
        _, i, c = key
        if i < m:
            kv, req = entries[i]
            if hi is None or c < hi:
                v = node(("D", i + 1, min(c + 1, cap)))
                edges.append((u, A.seq(sep, kv) if c else kv, v))
            if not req:
                edges.append((u, None, node(("D", i + 1, c))))
            continue
        if c >= lo:
            finals.append(u)
        if extras and c + 1 >= lo and (hi is None or c < hi):
            v = node(("T", UNBOUNDED if hi is None else hi - c - 1))
            edges.extend((u, A.seq(sep, x) if c else x, v) for x in extras)
    if not finals:
        return A.NOTHING
    return A.Graph(len(index), 0, tuple(finals), tuple(edges))
