"""Regex `pattern`s under the readings validators use (Python's `re`, ECMA-262): whether a name matches
under every reading or under some, and jsonschema's `pattern` keyword read that way."""
from __future__ import annotations

import re
import sys
import threading

from ...errors import InvalidRegexError, InvalidSchemaError
from ..byte_lru import ByteLRU
from ..deriv import DerivDFA
from ..regex_parser import parse_regex, search_language

# Memory budgets of the per-pattern caches (every schema may bring patterns of its own: a server sees an unbounded
# stream of them): Python's compiled patterns, and the byte DFAs of the other readings (up to tens of KB each).
PATTERN_CACHE_BYTES = 4 * 2**20
READING_DFA_CACHE_BYTES = 32 * 2**20


def _compiled_pattern_bytes(r: re.Pattern) -> int:
    return sys.getsizeof(r) + 2 * len(r.pattern)


def _reading_dfa_bytes(d: DerivDFA | bool) -> int:
    return 64 if d is False else d.memory_bytes()


_PATTERN_CACHE: ByteLRU = ByteLRU(PATTERN_CACHE_BYTES, _compiled_pattern_bytes, name="pattern cache")
_READING_DFAS: ByteLRU = ByteLRU(READING_DFA_CACHE_BYTES, _reading_dfa_bytes, name="pattern reading cache",
                                 grows=True)
_READING_LOCK = threading.Lock()


def pattern_search(p: str, name: str, path: str) -> bool:
    """re.search (Python's reading of a pattern)."""
    r = _PATTERN_CACHE.get(p)
    if r is None:
        try:
            r = re.compile(p)
        except re.error as e:
            raise InvalidSchemaError(f"invalid regex {p!r} at {path}: {e}") from None
        _PATTERN_CACHE.put(p, r)
    return r.search(name) is not None


def pattern_matches(p: str, name: str, path: str, reading: str) -> bool:
    """Whether `name` matches pattern p under every reading ("all") or under some reading ("any") of
    the readings validators use: Python's `re` (Unicode \\d \\w \\s, `$` before a final newline) and
    ECMA-262 (ASCII \\d \\w, `.` excluding \\r and U+2028/9). Patterns our parser refuses (lookaround,
    ...) are read by Python's `re` alone."""
    py = pattern_search(p, name, path)
    if py != (reading == "all"):
        return py  # all: Python says no; any: Python says yes
    key = (p, reading)
    with _READING_LOCK:
        d = _READING_DFAS.get(key)
        if d is None:
            try:
                d = DerivDFA(search_language(parse_regex(p, reading)))
            except InvalidRegexError:
                d = False
            _READING_DFAS.put(key, d)
        if d is False:
            return py
        return d.matches(name.encode("utf-8", "surrogatepass"))


def all_readings_pattern(validator, pattern, instance, schema):
    """jsonschema's `pattern` keyword, matched under every reading (see pattern_matches)."""
    if not validator.is_type(instance, "string") or not isinstance(pattern, str):
        return
    if not pattern_matches(pattern, instance, "#", "all"):
        from jsonschema.exceptions import ValidationError

        yield ValidationError(f"{instance!r} does not match {pattern!r} under every regex reading")

