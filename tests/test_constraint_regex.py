"""Regex -> byte automaton: agreement with Python's `re` (the oracle jsonschema uses for `pattern`)."""
from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_constrain.constraints import regex_ast as A
from dllm_constrain.constraints.deriv import DerivDFA
from dllm_constrain.constraints.dfa import LazyDFA
from dllm_constrain.constraints.nfa import build_nfa
from dllm_constrain.constraints.regex_parser import parse_regex, search_language
from dllm_constrain.constraints.utf8 import utf8_sequences
from dllm_constrain.errors import InvalidRegexError

from constraint_support import small_regexes

ALPHABET = ["a", "b", "c", "é", "0", "7", "\n", " ", "-", ".", "Z", "\u0800", "\U0001F600"]


def _strings(rng: random.Random, n: int = 300) -> list[str]:
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 5))) for _ in range(n)]


@settings(max_examples=60, deadline=None)
@given(small_regexes(), st.integers(0, 2**32 - 1))
def test_full_match_language_equals_python_re_on_random_strings(pattern, seed):
    rnd = random.Random(seed)
    dfa = DerivDFA(parse_regex(pattern).node)
    for s in _strings(rnd, 150):
        assert dfa.matches(s.encode()) == (re.fullmatch(pattern, s) is not None), (pattern, s)


@settings(max_examples=40, deadline=None)
@given(small_regexes(), st.integers(0, 2**32 - 1))
def test_search_language_is_pythons_re_search(pattern, seed):
    rnd = random.Random(seed)
    dfa = DerivDFA(search_language(parse_regex(pattern)))
    for s in _strings(rnd, 100):
        assert dfa.matches(s.encode()) == (re.search(pattern, s) is not None), (pattern, s)


@settings(max_examples=40, deadline=None)
@given(small_regexes(), st.integers(0, 2**32 - 1))
def test_derivative_dfa_and_subset_construction_dfa_agree(pattern, seed):
    rnd = random.Random(seed)
    node = parse_regex(pattern).node
    d1, d2 = DerivDFA(node), LazyDFA(build_nfa(node))
    for s in _strings(rnd, 100):
        assert d1.matches(s.encode()) == d2.matches(s.encode())


def test_byte_level_automaton_rejects_invalid_utf8():
    dfa = DerivDFA(parse_regex(".*").node)
    assert dfa.matches("é".encode())
    assert not dfa.matches(b"\xc3")  # a lone lead byte is not text
    assert not dfa.matches(b"\xa9")


def test_utf8_sequences_cover_exactly_the_code_point_range():
    rs = ((0x7F, 0x801), (0xFFFF, 0x10001))
    seqs = utf8_sequences(rs)
    for cp in [0x7F, 0x80, 0x7FF, 0x800, 0x801, 0xFFFF, 0x10000, 0x10001]:
        enc = chr(cp).encode()
        assert any(len(sq) == len(enc) and all(lo <= b <= hi for b, (lo, hi) in zip(enc, sq)) for sq in seqs)
    for cp in [0x802, 0xFFFE, 0x10002]:
        enc = chr(cp).encode()
        assert not any(len(sq) == len(enc) and all(lo <= b <= hi for b, (lo, hi) in zip(enc, sq)) for sq in seqs)


@pytest.mark.parametrize("pattern,yes,no", [
    (r"\d{3}-\d{2}", ["123-45"], ["12-345", "abc-de"]),
    # inside a negated class \W is taken as its ASCII superset, so non-ASCII letters are (soundly) excluded
    (r"[^\W\d]+", ["abc"], ["a1", "_!", "", "é"]),
    (r"(?P<x>ab)+c?", ["abab", "abc"], ["ac", ""]),
    (r"x{,2}y", ["y", "xxy"], ["xxxy"]),
    (r"\u00e9|\x41", ["é", "A"], ["e"]),
    (r"^abc$", ["abc"], ["abcd"]),
])
def test_examples(pattern, yes, no):
    dfa = DerivDFA(parse_regex(pattern).node)
    for s in yes:
        assert dfa.matches(s.encode()), s
    for s in no:
        assert not dfa.matches(s.encode()), s


@pytest.mark.parametrize("pattern", [r"(a)\1", r"a(?=b)", r"(?<!a)b", r"\bword\b", r"(?i)abc", r"a++", r"(?>ab)",
                                     r"(^a){40}", r"[", r"a{2,1}", r"(ab", r"*a"])
def test_unsupported_or_invalid_regexes_raise_invalid_regex_error(pattern):
    with pytest.raises(InvalidRegexError):
        parse_regex(pattern)


def test_negated_shorthand_never_admits_what_python_would_not_match():
    # \D must exclude every Unicode decimal digit (Python str patterns are Unicode-aware)
    dfa = DerivDFA(parse_regex(r"\D").node)
    assert not dfa.matches("٣".encode())  # ARABIC-INDIC DIGIT THREE
    assert dfa.matches(b"x")


def test_alternation_of_many_literals_is_a_shared_prefix_trie():
    words = [f"item{i}" for i in range(500)]
    node = A.alt_literals(words)
    dfa = DerivDFA(node)
    assert all(dfa.matches(w.encode()) for w in words[::37])
    assert not dfa.matches(b"item500") and not dfa.matches(b"item")
