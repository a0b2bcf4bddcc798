"""A least-recently-used map bounded by bytes, and the size parsing and estimates its users need.

A count bound is the wrong bound for caches whose entries range from a few hundred bytes (a refused pattern) to
tens of megabytes (a wide schema's automaton after many requests explored it): 64 entries is either a few kilobytes
or gigabytes. `ByteLRU` holds entries while the sum of their estimated sizes stays within `max_bytes`, dropping the
least recently used first. An entry's size is its key's (`deep_size`, or `key_sizer`) plus what `sizer` says of its value on insert; a cache of values that
grow while cached (`grows=True`: automata explored by requests) asks `sizer` again for every entry on each insert, so
that each is charged what it holds now. An entry larger than the whole budget is not kept at all.
"""
from __future__ import annotations

import re
import sys
import threading
import types
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import numpy as np

from ..errors import InvalidRequestError

V = TypeVar("V")

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_bytes(value: int | str, what: str = "a memory size") -> int:
    """A byte count from an int or text such as "512MB", "1.5GiB", "65536" (decimal KB/MB/GB, binary KiB/MiB/GiB).
    Raises InvalidRequestError naming `what` for anything else or for a negative size."""
    if isinstance(value, bool):
        raise InvalidRequestError(f"{what} must be a byte count or a size such as '512MB', got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)
        unit = m.group(2).upper() if m else None
        if m is None or unit not in _UNITS:
            raise InvalidRequestError(f"{what} must be a byte count or a size such as '512MB' or '1GiB', "
                                      f"got {value!r}")
        n = int(float(m.group(1)) * _UNITS[unit])
    else:
        raise InvalidRequestError(f"{what} must be a byte count or a size such as '512MB', "
                                  f"got {type(value).__name__}")
    if n < 0:
        raise InvalidRequestError(f"{what} must not be negative, got {value!r}")
    return n


def deep_size(obj: Any, limit: int = 200_000) -> int:
    """Bytes of `obj` and of the containers, strings and plain objects it reaches (each counted once; numpy arrays
    by their buffers; long containers by a sample), visiting at most `limit` objects: an estimate for cached values built of plain Python
    objects (regex syntax trees, tuples of ranges, grammar tables). Modules, functions, classes and other callables
    are not followed (they are shared by the process, not held by the value), and no attribute is computed."""
    seen: set[int] = set()
    todo = [obj]
    total = 0
    while todo and len(seen) < limit:
        o = todo.pop()
        if id(o) in seen or o is None or isinstance(o, _NOT_FOLLOWED) or callable(o):
            continue
        seen.add(id(o))
        total += sys.getsizeof(o, 64)
        if isinstance(o, np.ndarray):
            total += o.nbytes if o.base is None else 0
        elif isinstance(o, (str, bytes, bytearray, int, float, complex, range)):
            continue
        elif isinstance(o, dict):
            todo.extend(o.keys())
            todo.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset, deque)):
            if len(o) > _SAMPLED_LEN:  # a long sequence (code-point ranges, members): charged by a sample
                items = list(o)
                sample = items[:: len(items) // _SAMPLE]
                total += len(items) * sum(deep_size(x, limit // _SAMPLE) for x in sample) // len(sample)
            else:
                todo.extend(o)
        else:
            d = _instance_dict(o)
            if d is not None:
                todo.extend(d.values())
            for cls in type(o).__mro__:
                slots = cls.__dict__.get("__slots__", ())
                for slot in (slots,) if isinstance(slots, str) else slots:
                    try:
                        todo.append(object.__getattribute__(o, slot))
                    except (AttributeError, TypeError):
                        pass
    return total


def _instance_dict(o: Any) -> dict | None:
    try:
        d = object.__getattribute__(o, "__dict__")
    except (AttributeError, TypeError):
        return None
    return d if isinstance(d, dict) else None


# containers longer than this are charged by a sample of _SAMPLE evenly spaced items (a walk over every code-point
# range of a Unicode class, for each memoised value holding one, made the estimate cost as much as the compilation)
_SAMPLED_LEN = 64
_SAMPLE = 8

_NOT_FOLLOWED = (bool, type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                 threading.Thread)


class ByteLRU(Generic[V]):
    """A thread-safe LRU map bounded by the estimated bytes of its values (`sizer(value)`), and optionally by a
    count (`max_entries`). `max_bytes` 0 keeps nothing (every lookup misses). `grows`: the values' sizes may change
    while cached (re-counted on every insert)."""

    def __init__(self, max_bytes: int | str, sizer: Callable[[Any], int], max_entries: int | None = None,
                 name: str = "cache", grows: bool = False, key_sizer: Callable[[Any], int] | None = None) -> None:
        self.name = name
        self.max_bytes = parse_bytes(max_bytes, f"the {name}'s memory budget")
        if max_entries is not None and (not isinstance(max_entries, int) or max_entries < 1):
            raise InvalidRequestError(f"the {name} holds at least one entry, got max_entries={max_entries!r}")
        self.max_entries = max_entries
        self._sizer = sizer
        self.grows = grows
        self._key_sizer = key_sizer if key_sizer is not None else deep_size
        # key -> (value, bytes last counted, the key's own bytes)
        self._items: OrderedDict[Hashable, tuple[Any, int, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items

    @property
    def nbytes(self) -> int:
        """The entries' sizes as last counted (on the last insert or lookup of each)."""
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def keys(self) -> list[Hashable]:
        """The keys, least recently used first."""
        with self._lock:
            return list(self._items)

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value under `key` (now the most recently used), else `default`."""
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return default
            self._items.move_to_end(key)
            return hit[0]

    def pop(self, key: Hashable) -> None:
        with self._lock:
            hit = self._items.pop(key, None)
            if hit is not None:
                self._bytes -= hit[1]

    def put(self, key: Hashable, value: Any) -> bool:
        """Store `value` under `key` as the most recently used, then drop the least recently used entries until the
        re-counted sizes fit the budget. False when the value alone exceeds the budget (it is then not stored)."""
        key_size = int(self._key_sizer(key))
        size = int(self._sizer(value)) + key_size
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.max_bytes:
                return False
            self._items[key] = (value, size, key_size)
            self._bytes += size
            if self.grows:
                self._recount()
            self._evict()
            return True

    def set_max_bytes(self, max_bytes: int | str) -> None:
        """Change the budget (entries beyond it are dropped now)."""
        n = parse_bytes(max_bytes, f"the {self.name}'s memory budget")
        with self._lock:
            self.max_bytes = n
            if self.grows:
                self._recount()
            self._evict()

    def _recount(self) -> None:
        """Charge every entry what it holds now (cached automata grow as requests explore them)."""
        total = 0
        for key, (value, _, key_size) in self._items.items():
            size = int(self._sizer(value)) + key_size
            self._items[key] = (value, size, key_size)
            total += size
        self._bytes = total

    def _evict(self) -> None:
        while self._items and (self._bytes > self.max_bytes
                               or (self.max_entries is not None and len(self._items) > self.max_entries)):
            _, (_, size, _) = self._items.popitem(last=False)
            self._bytes -= size
            self.evictions += 1


def byte_memo(max_bytes: int, sizer: Callable[[Any], int] = deep_size, name: str = "memo",
              size_of_args: Callable[..., int] | None = None) -> Callable[[Callable[..., V]], Callable[..., V]]:
    """`functools.lru_cache` bounded by bytes: memoises a pure function of hashable arguments in a `ByteLRU`
    (exceptions are not memoised). An entry is charged `sizer(value)`, or `size_of_args(*args)` when given (an
    estimate from the arguments, where walking the value would cost as much as computing it). The wrapper's `cache`
    is that ByteLRU, `cache_clear()` empties it."""

    def wrap(fn: Callable[..., V]) -> Callable[..., V]:
        by_args = size_of_args
        cache: ByteLRU = ByteLRU(max_bytes, (lambda entry: entry[1]) if by_args is not None else sizer, name=name)
        missing = object()

        def memoised(*args: Any, **kwargs: Any) -> V:
            key = (args, tuple(sorted(kwargs.items()))) if kwargs else args
            hit = cache.get(key, missing)
            if hit is not missing:
                return hit[0] if by_args is not None else hit
            value = fn(*args, **kwargs)
            cache.put(key, (value, by_args(*args, **kwargs)) if by_args is not None else value)
            return value

        memoised.cache = cache  # type: ignore[attr-defined]
        memoised.cache_clear = cache.clear  # type: ignore[attr-defined]
        memoised.__wrapped__ = fn  # type: ignore[attr-defined]
        memoised.__name__ = getattr(fn, "__name__", "memoised")
        memoised.__doc__ = fn.__doc__
        return memoised

    return wrap
