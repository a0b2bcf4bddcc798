"""The process's one compile cache: compiled constraints and refusals, bounded by bytes.

`CompileCache` keys an entry by (tokenizer fingerprint, `ConstraintKey`) and stores it under the key's digest (kind,
SHA-256 of the canonical constraint text, options): the text itself, up to megabytes for a wide schema, is never
kept. Entries are charged `entry_bytes` (a compiled constraint's `memory_bytes()`, which grows as requests explore
its automaton, re-counted on every insert) within a budget (`DEFAULT_CACHE_BYTES`; `LLM(compile_cache_memory=...)`,
the server's --compile-cache-memory), least recently used out first (byte_lru.ByteLRU). See "Memory" in
docs/constraints.md.
"""
from __future__ import annotations

import gc
import hashlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from ..errors import CompilationTimeoutError, CompilationWorkLimitError, ConstraintError, InvalidRequestError
from .byte_lru import ByteLRU, deep_size
from .deadline import pause_point
from .protocol import CompiledKind, declares

# The compile cache's default memory budget: what the cached constraints are charged (`entry_bytes`), not counting
# the tokenizer's tables they share. Set per process with `LLM(compile_cache_memory=...)`, the server's
# --compile-cache-memory or `COMPILE_CACHE.set_max_bytes`.
DEFAULT_CACHE_BYTES = 256 * 2**20
# Bytes charged for a cached refusal beyond its message (the record, the key)
REFUSAL_BYTES = 512


def entry_bytes(entry: Any) -> int:
    """The estimated bytes a compile-cache entry holds: a regular constraint's `memory_bytes()` (which grows as
    requests explore it), a grammar's, or a refusal's message and record."""
    if isinstance(entry, BaseException):
        return REFUSAL_BYTES + sum(len(str(a)) for a in entry.args)
    if declares(entry, CompiledKind):
        return entry.memory_bytes()
    return deep_size(entry, limit=10_000)  # a substitute compiler's result (tests, adapters)


def _key_bytes(key: Hashable) -> int:
    """A compile-cache key's own bytes: a digest and a few short fields (a substitute compiler in the key is not
    the cache's to charge)."""
    return 256


class CompileCache:
    """An LRU of compiled constraints and of refusals, keyed by (tokenizer fingerprint, `ConstraintKey`), stored
    under the key's digest (`ConstraintKey.digest()`), and bounded by bytes (`max_bytes`, each entry's `entry_bytes` re-counted on every insert: cached automata grow
    as requests explore them), optionally also by a count (`maxsize`). Keys hold a hash of the canonical constraint
    text, never the text; a refusal is kept without its traceback (which would keep the compilation's frames alive)
    and raised as a fresh copy each time. Thread-safe; a compilation runs outside the lock (two threads may compile
    the same constraint at once; the later result replaces the earlier), and only a finished build is stored: an
    exception that interrupts one (a timeout, KeyboardInterrupt) leaves the cache as it was."""

    def __init__(self, maxsize: int | None = None, max_bytes: int | str = DEFAULT_CACHE_BYTES) -> None:
        if maxsize is not None and (not isinstance(maxsize, int) or isinstance(maxsize, bool) or maxsize < 1):
            raise InvalidRequestError(f"a compile cache holds at least one entry, got maxsize={maxsize!r}")
        self.maxsize = maxsize
        self._lru: ByteLRU = ByteLRU(max_bytes, entry_bytes, max_entries=maxsize, name="compile cache",
                                     grows=True, key_sizer=_key_bytes)
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, key: Hashable) -> bool:
        return _stored_key(key) in self._lru

    @property
    def max_bytes(self) -> int:
        return self._lru.max_bytes

    @property
    def nbytes(self) -> int:
        """The entries' estimated bytes as last counted."""
        return self._lru.nbytes

    @property
    def evictions(self) -> int:
        return self._lru.evictions

    def keys(self) -> list[Hashable]:
        """The stored keys, least recently used first: (scope, (kind, SHA-256 of the constraint text, options))."""
        return self._lru.keys()

    def set_max_bytes(self, max_bytes: int | str) -> None:
        """Change the memory budget (an int or a size such as "1GiB"); entries beyond it are dropped now."""
        self._lru.set_max_bytes(max_bytes)

    def clear(self) -> None:
        self._lru.clear()

    def lookup(self, key: Hashable) -> Any:
        """The cached result for `key` (a cached refusal is raised), or None when it is not cached. A compiled
        constraint worn out by the requests it served (`CompiledConstraint.worn_out`) is dropped here: the caller
        compiles it afresh, and the requests holding the old one go on with it."""
        key = _stored_key(key)
        hit = self._lru.get(key)
        if declares(hit, CompiledKind) and hit.worn_out():
            self._lru.pop(key)
            hit = None
        if hit is None:
            return None
        self.hits += 1
        if isinstance(hit, BaseException):
            raise _fresh(hit)
        return hit

    def get_or_build(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The cached result for `key`, else `build()` stored under it (least recently used entries out)."""
        hit = self.lookup(key)
        if hit is not None:
            return hit
        built = _build_or_refusal(build)
        self.misses += 1
        key = _stored_key(key)
        if isinstance(built, BaseException):
            self._lru.put(key, _stripped(built))
            raise built
        self._lru.put(key, built)
        return built


def _stored_key(key: Hashable) -> Hashable:
    """What the cache stores for a (scope, ConstraintKey) key: the constraint's digest in place of its text."""
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], ConstraintKey):
        return key[0], key[1].digest()
    return key


def _stripped(e: BaseException) -> BaseException:
    """A refusal to cache: a copy without traceback, cause or context (each would keep a compilation's frames,
    and through them its syntax trees, alive for as long as the entry)."""
    return _fresh(e)


def _fresh(e: BaseException) -> BaseException:
    """A new exception of e's type with e's arguments and attributes, and no traceback: what a cached refusal
    raises each time (re-raising one shared instance would chain every raise's frames onto it)."""
    new = type(e).__new__(type(e), *e.args)
    new.args = e.args
    new.__dict__.update(e.__dict__)
    return new


def _build_or_refusal(build: Callable[[], Any]) -> Any:
    """build()'s result, or the constraint's refusal (a ConstraintError other than a timeout) to cache."""
    gc_was_enabled = gc.isenabled()
    try:
        gc.disable()  # compilation allocates many small acyclic objects: skip the cyclic collector
        return build()
    except CompilationWorkLimitError as e:
        return e  # the work limit is a constant: the same constraint meets it again, so the refusal is cached
    except CompilationTimeoutError:
        raise  # not cached: a later call with more time compiles again
    except ConstraintError as e:
        return e
    finally:
        if gc_was_enabled:
            gc.enable()
            # the young objects the compilation made are collected here, on the compiling thread: left to the
            # allocation that next crosses the collector's threshold, that pass (a walk over thousands of new objects,
            # then the same again one generation up) often fell on the engine's loop thread. The pass holds the GIL
            # throughout (up to a few ms): beside a request loop, it waits for the loop to wait (deadline.pausing)
            pause_point()
            gc.collect(1)


COMPILE_CACHE = CompileCache()


def clear_cache() -> None:
    """Forget every compiled constraint of this process."""
    COMPILE_CACHE.clear()


@dataclass(frozen=True)
class ConstraintKey:
    """A constraint normalised for compiling and caching: kind "regex" (the pattern), "json_schema" (the schema
    as canonical JSON of its dict) or "grammar" (Lark text and start rule), with the options' key."""

    kind: str
    source: str
    options: tuple[Any, ...] = ()

    def digest(self) -> tuple[str, bytes, tuple[Any, ...]]:
        """What the compile cache keys this constraint by: its kind, a SHA-256 of its text and its options (the
        text itself, up to megabytes for a wide schema, is not kept by the cache)."""
        return self.kind, hashlib.sha256(self.source.encode("utf-8", "surrogatepass")).digest(), self.options
