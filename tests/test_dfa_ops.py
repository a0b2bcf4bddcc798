"""Products of byte DFAs (intersection and difference of regular languages): a string is in the product exactly when
it is in every positive operand and in no negated one."""
from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_constrain.constraints import regex_ast as A
from dllm_constrain.constraints.deriv import DEAD, START, DerivDFA
from dllm_constrain.constraints.dfa_ops import _mask_ranges, difference, product
from dllm_constrain.constraints.formats import FormatLengthTooLarge, with_length
from dllm_constrain.constraints.regex_parser import parse_regex

ATOMS = ["a", "b", "c", "[ab]", "[^a]", "[a-c]", ".", "\\d", "0", "9", "é"]
texts = st.text(alphabet="abc09é-", max_size=8)


@st.composite
def patterns(draw, depth: int = 2) -> str:
    """Small regexes over a few characters: atoms, sequences, alternations and bounded or open repetitions."""
    if depth == 0 or draw(st.booleans()):
        return draw(st.sampled_from(ATOMS))
    kind = draw(st.sampled_from(["seq", "alt", "rep"]))
    if kind == "seq":
        return "".join(draw(st.lists(patterns(depth=depth - 1), min_size=2, max_size=3)))
    if kind == "alt":
        return "(?:" + "|".join(draw(st.lists(patterns(depth=depth - 1), min_size=2, max_size=3))) + ")"
    inner = draw(patterns(depth=depth - 1))
    return "(?:" + inner + ")" + draw(st.sampled_from(["*", "+", "?", "{1,3}", "{2}"]))


def _accepts(node: A.Node, text: str) -> bool:
    dfa, s = DerivDFA(node), START
    for byte in text.encode():
        dfa.expand(s)
        s = int(dfa.T[s][byte])
        if s == DEAD:
            return False
    dfa.expand(s)
    return bool(dfa.accepting[s])


@settings(max_examples=150, deadline=None)
@given(st.lists(patterns(), min_size=1, max_size=3), st.data())
def test_a_product_holds_the_strings_of_every_positive_operand_and_of_no_negated_one(pats, data) -> None:
    negate = [False] + [data.draw(st.booleans()) for _ in pats[1:]]
    node = product([parse_regex(p).node for p in pats], negate)
    for text in data.draw(st.lists(texts, min_size=1, max_size=12)):
        expected = all((re.fullmatch(p, text) is not None) != neg for p, neg in zip(pats, negate))
        assert _accepts(node, text) == expected, (pats, negate, text)


@given(st.integers(min_value=0, max_value=(1 << 256) - 1))
def test_a_byte_mask_reads_as_its_ascending_runs(mask: int) -> None:
    ranges = _mask_ranges(mask)
    assert sum(1 << b for lo, hi in ranges for b in range(lo, hi + 1)) == mask
    assert all(hi < lo2 - 1 for (_, hi), (lo2, _) in zip(ranges, ranges[1:]))


@settings(max_examples=150, deadline=None)
@given(patterns(), st.integers(min_value=0, max_value=4), st.one_of(st.none(), st.integers(min_value=0, max_value=6)))
def test_a_pattern_with_length_bounds_by_layers_is_the_generic_products_language(pat, mn, mx) -> None:
    """The layered product (a pattern's DFA times a code-point counter) that lowers `pattern` with
    `minLength`/`maxLength` accepts exactly the strings of the generic product with a counting language."""
    node = parse_regex(pat).node
    counting = A.rep(A.chars(A.ANY_CHAR), mn, mx)
    generic = product([node, counting])
    try:
        layered = with_length(node, mn, mx, cap=False)
    except FormatLengthTooLarge:
        return  # too large to build exactly: the caller falls back to the generic product
    assert A.is_nothing(difference(layered, [generic])), (pat, mn, mx)
    assert A.is_nothing(difference(generic, [layered])), (pat, mn, mx)
