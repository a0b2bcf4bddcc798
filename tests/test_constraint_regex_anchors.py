"""Anchors inside groups and alternatives: `pattern` (re.search) and `regex=` (full match) read exactly, as
Python's `re` and ECMA-262 read them on strings without a newline (where the two agree)."""
from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_constrain.constraints.deriv import DerivDFA
from dllm_constrain.constraints.regex_anchors import MAX_ANCHORED_COPIES
from dllm_constrain.constraints.regex_parser import parse_regex, search_language
from dllm_constrain.errors import InvalidRegexError

_ATOMS = ["a", "b", "[ab]", ".", "^", "$", "(?:^|a)", "(?:b|$)"]
_ALPHABET = "abc,"


@st.composite
def anchored_regexes(draw, depth: int = 3) -> str:
    """Small patterns with `^` / `$` anywhere: in sequences, alternatives, repeated groups."""
    if depth == 0:
        return draw(st.sampled_from(_ATOMS))
    kind = draw(st.sampled_from(["atom", "cat", "alt", "quant"]))
    if kind == "atom":
        return draw(st.sampled_from(_ATOMS))
    if kind == "cat":
        return draw(anchored_regexes(depth - 1)) + draw(anchored_regexes(depth - 1))
    if kind == "alt":
        return "(" + draw(anchored_regexes(depth - 1)) + "|" + draw(anchored_regexes(depth - 1)) + ")"
    q = draw(st.sampled_from(["?", "*", "+", "{2}", "{0,2}", "{1,3}", "{2,}"]))
    return "(?:" + draw(anchored_regexes(depth - 1)) + ")" + q


def _strings(rng: random.Random, n: int, alphabet: str = _ALPHABET) -> list[str]:
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(n)]


@pytest.mark.parametrize("reading", ["python", "all"])
@settings(max_examples=80, deadline=None)
@given(anchored_regexes(), st.integers(0, 2**32 - 1))
def test_search_language_with_anchors_anywhere_is_re_search(reading, pattern, seed):
    dfa = DerivDFA(search_language(parse_regex(pattern, reading)))
    for s in _strings(random.Random(seed), 120):
        assert dfa.matches(s.encode()) == (re.search(pattern, s) is not None), (pattern, s)


@settings(max_examples=80, deadline=None)
@given(anchored_regexes(), st.integers(0, 2**32 - 1))
def test_full_match_language_with_anchors_anywhere_is_re_fullmatch(pattern, seed):
    dfa = DerivDFA(parse_regex(pattern).node)
    for s in _strings(random.Random(seed), 120):
        assert dfa.matches(s.encode()) == (re.fullmatch(pattern, s) is not None), (pattern, s)


@settings(max_examples=60, deadline=None)
@given(anchored_regexes(), st.integers(0, 2**32 - 1))
def test_the_any_reading_admits_every_python_match_even_around_a_final_newline(pattern, seed):
    # Python's `$` also matches before a final newline: "any" (a superset of every reading) keeps those
    dfa = DerivDFA(search_language(parse_regex(pattern, "any")))
    for s in _strings(random.Random(seed), 120, _ALPHABET + "\n"):
        if re.search(pattern, s) is not None:
            assert dfa.matches(s.encode()), (pattern, s)


@pytest.mark.parametrize("pattern,yes,no", [
    (r"(^$)|(^[a-f0-9]{8}$)", ["", "0123abcd"], ["0123abcd0", "x", "0123abc"]),
    (r"^([^,]|$)", ["", "a", "a,b"], [",", ",a"]),
    (r"^([0-9x]+\.[0-9x]+$|%VERSION%)", ["1.2", "x.0x", "%VERSION%", "%VERSION%-rc"], ["1.2 ", "v1.2", "1."]),
    (r"(^|,)id", ["id", "a,id", "x,idx"], ["xid", ""]),
])
def test_patterns_seen_in_real_schemas_read_as_re_search(pattern, yes, no):
    dfa = DerivDFA(search_language(parse_regex(pattern, "all")))
    for s in yes + no:
        assert (re.search(pattern, s) is not None) == (s in yes), s  # the examples themselves are right
        assert dfa.matches(s.encode()) == (s in yes), s


def test_an_anchor_inside_a_non_empty_sequence_empties_that_branch_only():
    assert DerivDFA(search_language(parse_regex(r"a^b", "all"))).matches(b"a^b") is False
    dfa = DerivDFA(search_language(parse_regex(r"a^b|c", "all")))
    assert dfa.matches(b"xcx") and not dfa.matches(b"ab")


def test_a_repeated_anchored_group_beyond_the_expansion_bound_is_refused():
    parse_regex(f"(?:^a|b){{{MAX_ANCHORED_COPIES}}}")
    with pytest.raises(InvalidRegexError, match="anchor"):
        parse_regex(f"(?:^a|b){{{MAX_ANCHORED_COPIES + 1}}}")
