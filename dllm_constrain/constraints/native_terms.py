"""The derivative term algebra in C (`_terms.c`): `NativeTerms`, the `Terms` of deriv_terms.py with its hot
methods run by the native store, and `new_terms`, which picks it when the extension is built."""
from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

from . import regex_ast as A
from ._cwalk import NO_C_ENV
from .deadline import Deadline, check_active
from .deriv_terms import CHARS_K, GAT_K, MEM_K, T_NOTHING, Terms

# Memory estimates (bytes) behind `NativeTerms.memory_bytes`, calibrated as deriv_terms.PY_TERM_BYTES is: the native
# store's tables at their first size (per-term arrays for 1024 terms, the intern, derivative and sequence memos, the
# byte and id pools) and per native term (doubling included).
NATIVE_STORE_BASE_BYTES = 224 * 1024
NATIVE_TERM_BYTES = 200


class NativeTerms(Terms):
    """Terms whose algebra runs in C (`_terms.c`: the same normal forms and memos as `Terms`). Code-point classes,
    graph and member-list terms keep their payload here (`a`, `b`, `c` hold it, by term); the store asks for their
    expansion and their nullable / minimal length once per term. Construction from the regex AST, graphs and member
    lists is `Terms`' own code, running on the C constructors. `store_type` is `_terms.TermStore` (see `new_terms`)."""

    def __init__(self, store_type: type, deadline: Deadline | None = None):
        super().__init__(deadline)
        # the store calls back through a weak reference: bound methods would make a cycle (terms -> store -> terms),
        # and a compiled constraint dropped from the cache would then wait for the cyclic collector (one pause of
        # tens of milliseconds inside some later request, freeing thousands of objects) instead of going at once
        ref = weakref.ref(self)
        store = store_type(_weak_callback(ref, "_expansion_of"), _weak_callback(ref, "_props_of"),
                           _weak_callback(ref, "_tick"))
        self.store = store
        self.kind = None  # the store knows the kinds (store.kind(t)); the maps below hold CHARS / GAT / MEM payloads
        self.a, self.b, self.c = {}, {}, {}
        self._external_kind: dict[int, int] = {}
        # the hot entry points are the store's own methods: no Python frame between a caller and the C code
        self.bytes_ = store.bytes_
        self.seq = store.seq
        self.alt = store.alt
        self.nullable = store.nullable
        self.minlen = store.minlen
        self.deriv = store.deriv
        self.classes = store.classes
        self.shortest_first_byte = store.shortest_first_byte

    def lit(self, data: bytes) -> int:
        return self.store.lit(bytes(data))

    def rep(self, x: int, lo: int, hi: int | None) -> int:
        return self.store.rep(x, lo, hi)

    def chars(self, ranges: A.Ranges) -> int:
        if not ranges:
            return T_NOTHING
        if len(ranges) == 1 and ranges[0][1] < 0x80:
            return self.bytes_(ranges)
        return self._external(("C", ranges), CHARS_K, ranges, None)

    def _external(self, key: tuple, kind: int, a, b, c=None) -> int:
        t = self.intern.get(key)
        if t is None:
            t = self.store.external(kind)
            self.a[t], self.b[t], self.c[t] = a, b, c
            self._external_kind[t] = kind
            self.intern[key] = t  # last: an interrupted call leaves an unreachable term, never a half-made one
        return t

    def gat(self, g: int, u: int) -> int:
        return self._external(("G", g, u), GAT_K, g, u)

    def mem(self, i: int, used: int, tail: int) -> int:
        return self._external(("M", i, used, tail), MEM_K, i, used, tail)

    def cuts(self, t: int) -> frozenset[int]:
        return frozenset(self.store.cuts(t))

    @property
    def n_terms(self) -> int:
        return self.store.n_terms

    def memory_bytes(self) -> int:
        """The native store's tables (allocated at a fixed size, then doubled as terms come) and the terms."""
        return NATIVE_STORE_BASE_BYTES + NATIVE_TERM_BYTES * self.n_terms

    # ---- what the store asks of graph and member-list terms
    def _expansion_of(self, t: int) -> int:
        kind = self._external_kind[t]
        if kind == CHARS_K:
            return self._utf8_term(self.a[t])  # the store remembers it
        return self.expansion(t) if kind == GAT_K else self.members_expansion(t)

    def _props_of(self, t: int) -> tuple[bool, int]:
        kind = self._external_kind[t]
        if kind == CHARS_K:
            return False, len(chr(self.a[t][0][0]).encode("utf-8"))
        if kind == GAT_K:
            return self._gat_nullable(t), self._gat_minlen(t)
        return self._mem_nullable(t), self._members_minlen(t)

    def _tick(self) -> None:
        if self.deadline is not None:
            self.deadline.check()
        check_active()


def _weak_callback(ref: weakref.ReferenceType, name: str) -> Callable[..., Any]:
    """The method `name` of the object behind `ref`, called without holding the object alive."""
    def call(*args: Any) -> Any:
        obj = ref()
        if obj is None:
            raise ReferenceError("a term store outlived the terms object that owns it")
        return getattr(obj, name)(*args)
    return call


def new_terms(deadline: Deadline | None = None) -> Terms:
    """The term algebra: in C when the extension is built (and DLLM_CONSTRAIN_NO_C is not set), else `Terms`."""
    if not os.environ.get(NO_C_ENV):
        try:
            from ._terms import TermStore
        except ImportError:
            return Terms(deadline)
        return NativeTerms(TermStore, deadline)
    return Terms(deadline)
