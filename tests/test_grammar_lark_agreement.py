"""The grammar constraint agrees with Lark (`lark.Lark(g, parser="lalr", lexer="basic")`):

* a regex terminal matches what Python's `re.match` returns (the first match in the regex's priority order,
  not the longest), which is what Lark's lexer uses;
* the frontier mask and select_commits agree (a token allowed alone at the frontier is committed);
* grammars that accept only the empty text compile, and a grammar that accepts no text is refused by name;
* on a handful of grammars and random strings, accepts_text equals Lark's verdict.
"""
from __future__ import annotations

import re

import lark
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lark_reference import lark_accepts

from dllm_constrain.constraints import TokenizerInfo
from dllm_constrain.constraints.compiler import GrammarCompiler
from dllm_constrain.constraints.cfg.pike import PikeDFA, PikeNFA
from dllm_constrain.errors import InvalidGrammarError

EOS, MASK = 0, 1


def byte_info() -> TokenizerInfo:
    """Every byte is a token (ids 2..257); 0 = EOS, 1 = MASK."""
    return TokenizerInfo([None, None] + [bytes([b]) for b in range(256)], eos_id=EOS, mask_id=MASK)


def ids(text: str) -> list[int]:
    return [b + 2 for b in text.encode("utf-8")]


# ------------------------------------------------------------------------- first-match terminals
def test_a_terminal_matches_what_python_re_match_returns_not_its_longest_match() -> None:
    g = 'start: A "c"\nA: /a|ab/'
    lk = lark.Lark(g, parser="lalr", lexer="basic")
    cg = GrammarCompiler(byte_info()).compile(g)
    assert not lark_accepts(lk, "abc") and lark_accepts(lk, "ac")
    assert not cg.accepts_text("abc") and not cg.accepts_tokens(ids("abc") + [EOS])
    assert cg.accepts_text("ac") and cg.accepts_tokens(ids("ac") + [EOS])
    # the committed canvas "a b c EOS" is not completable, even without Lark's verification
    st_ = cg.new_canvas_state(4, verify_with_lark=False)
    assert not st_.is_completable(ids("abc") + [EOS])
    # the mask after "a" does not offer "b" (which select_commits would refuse)
    st2 = cg.new_canvas_state(4)
    canvas = ids("a") + [MASK] * 3
    allowed = st2.allowed_sets(canvas)[1]
    assert ids("b")[0] not in allowed and ids("c")[0] in allowed
    for t in allowed:
        assert cg.new_canvas_state(4).select_commits(canvas, [(1, t, 1.0)]) == [(1, t)]


def test_the_priority_order_of_alternatives_and_quantifiers_decides_the_lexeme() -> None:
    cases = [
        ('start: A B\nA: /ab|a/\nB: "b"', ["ab", "abb", "a"]),
        ('start: A B?\nA: /a+(ab)?/\nB: "b"', ["aab", "aa", "a", "ab", "aabb", "aaab"]),
        ('start: A+\nA: /(ab|a)(ba|b)?/', ["ab", "aba", "abab", "abba", "aa", "abbab"]),
        ('start: A+ B\nA: /a+?/\nB: "b"', ["ab", "aab", "b", "aa"]),
        ('start: C+\nC: /<.*?>/', ["<a><b>", "<a>", "<a", "<<>>"]),
        ('start: A "c"\nA: /a(b|bc)?/', ["abc", "abcc", "ac", "abcc"]),
    ]
    comp = GrammarCompiler(byte_info())
    for g, texts in cases:
        lk = lark.Lark(g, parser="lalr", lexer="basic")
        cg = comp.compile(g)
        for s in texts:
            assert cg.accepts_text(s) == lark_accepts(lk, s), (g, s)


PIKE_PATTERNS = [r"a|ab", r"ab|a", r"a*(ab)?", r"(a|ab)(c|bcd)", r"<.*?>", r"a+?", r"a{1,3}?b?", r"(ab|a)(ba|b)?",
                 r"a*?b|a", r"[a-c]{2,4}", r"(a|b)*?ab", r"\d+(\.\d*)?", r"(?:a|ab)c?", r"a?b??a", r"(ab)*a",
                 r"é|éa", r"[^b]+b?", r"(a|aa)+", r"(aa|a)+?a", r"\w+|\s", r"(!|(\/\/))[^\n]*"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PIKE_PATTERNS), st.text(alphabet="abcd.é1 !/<>\n", max_size=8))
def test_the_terminal_automaton_ends_where_python_re_match_ends(pattern: str, text: str) -> None:
    d = _pike(pattern)
    m = re.match(pattern, text)
    want = None if m is None else len(m.group(0).encode("utf-8"))
    assert d.match_len(text.encode("utf-8")) == want


_PIKES: dict[str, PikeDFA] = {}


def _pike(pattern: str) -> PikeDFA:
    if pattern not in _PIKES:
        _PIKES[pattern] = PikeDFA(PikeNFA(pattern))
    return _PIKES[pattern]


def test_a_repeated_group_that_can_match_empty_is_refused_naming_the_terminal() -> None:
    with pytest.raises(InvalidGrammarError, match="terminal A.*empty string"):
        GrammarCompiler(byte_info()).compile('start: A\nA: /(b?c?)*a/')


# ------------------------------------------------------------------------- mask and select_commits agree
COMMENT_GRAMMAR = r'''start: "INT"i _WS+ INT _WS*
_WS: /[ \t]+/
COMMENT: /(!|(\/\/))[^\n]*/
%import common.INT
%ignore COMMENT
'''


@pytest.mark.parametrize("n", [16, 24, 40])
def test_an_ignored_comment_to_end_of_line_is_not_offered_where_text_must_follow(n: int) -> None:
    """A comment runs to the end of the line and the grammar has no newline: it can only end the text, so it
    cannot come first. The frontier mask of the empty canvas must not offer '!' or '/'; every token it does
    offer is committed by select_commits."""
    cg = GrammarCompiler(byte_info()).compile(COMMENT_GRAMMAR)
    allowed = cg.new_canvas_state(n).allowed_sets([MASK] * n)[0]
    assert allowed == set(ids("Ii"))
    for t in allowed:
        assert cg.new_canvas_state(n).select_commits([MASK] * n, [(0, t, 1.0)]) == [(0, t)]
    # after the required text a comment is fine, and the mask offers it
    canvas = ids("INT 5") + [MASK] * (n - 5)
    st_ = cg.new_canvas_state(n)
    row = st_.allowed_sets(canvas)[5]
    assert ids("!")[0] in row and ids("/")[0] in row
    for t in sorted(row):
        assert cg.new_canvas_state(n).select_commits(canvas, [(5, t, 1.0)]) == [(5, t)]


# ------------------------------------------------------------------------- empty and no text
@pytest.mark.parametrize("g", ["start: start?\n", "start: \n"])
def test_a_grammar_accepting_only_the_empty_text_compiles_like_lark_parses_it(g: str) -> None:
    assert lark_accepts(lark.Lark(g, parser="lalr", lexer="basic"), "")
    cg = GrammarCompiler(byte_info()).compile(g)
    assert cg.accepts_text("") and cg.accepts_tokens([EOS]) and not cg.accepts_text("a")
    assert cg.min_tokens() == 0
    st_ = cg.new_canvas_state(3)
    assert st_.allowed_sets([MASK] * 3)[0] == {EOS}


@pytest.mark.parametrize("g", ['start: A A\nA: /a+/', 'start: A B\nA: /[ab]+/\nB: /b+/\n', 'start: A x\nx: A x | A\nA: /a+/'])
def test_a_grammar_that_accepts_no_text_is_refused_by_name(g: str) -> None:
    with pytest.raises(InvalidGrammarError, match="accepts no text"):
        GrammarCompiler(byte_info()).compile(g)


# ------------------------------------------------------------------------- acceptance agrees with Lark
AGREEMENT = [
    ('start: A "c"\nA: /a|ab/', "abc"),
    ('start: (A | B)+\nA: "a"\nB: /ab+/', "ab"),
    ('start: NAME ("," NAME)*\nNAME: /[a-c]+|c/\n%ignore " "', "abc, "),
    ('start: "if"i NAME ";"\nNAME: /[a-z]+/\n%ignore " "', "ifIF ;"),
    ('start: C+\nC: /<.*?>/', "<a>"),
    ('start: X+\nX: /(ab|a)(ba|b)?/', "ab"),
    (COMMENT_GRAMMAR, "INTint 5!/\t"),
    ('?start: sum\n?sum: sum "+" NUM | NUM\nNUM: /[0-9]+(\\.[0-9]*)?/', "1+.2"),
]
_CG: dict[str, tuple] = {}


def _both(g: str):
    if g not in _CG:
        _CG[g] = (GrammarCompiler(byte_info()).compile(g), lark.Lark(g, parser="lalr", lexer="basic"))
    return _CG[g]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_acceptance_agrees_with_lark_on_random_strings(data) -> None:
    g, alphabet = data.draw(st.sampled_from(AGREEMENT))
    text = data.draw(st.text(alphabet=alphabet, max_size=8))
    cg, lk = _both(g)
    assert cg.accepts_text(text) == lark_accepts(lk, text), (g, text)
