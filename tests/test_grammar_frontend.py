"""Lark front end: what is refused by name, what is honoured, and the grammar loader."""
from __future__ import annotations

import lark
import pytest

from dllm_constrain.constraints import TokenizerInfo
from dllm_constrain.constraints.cfg import load_spec
from dllm_constrain.constraints.compiler import GrammarCompiler
from dllm_constrain.errors import ConstraintTooLongError, InvalidGrammarError
from dllm_constrain.grammars import examples, list_grammars, load_grammar


def byte_info() -> TokenizerInfo:
    """Every byte is a token (ids 2..257); 0 = EOS, 1 = MASK."""
    return TokenizerInfo([None, None] + [bytes([b]) for b in range(256)], eos_id=0, mask_id=1)


@pytest.mark.parametrize("grammar, match", [
    ('start: A\nA: /(?<=a)b/', "lookaround"),
    ('start: A\nA: /a(?=b)/', "lookaround"),
    ('start: A\nA: /(a)\\1/', "backreference"),
    ('start: A\nA: /\\bab/', "anchor or word boundary"),
    ('start: A\nA: /^ab/', "anchor"),
    ('start: A\nA: /ab/i', "regex flags"),
    ('%declare X\nstart: X', "declare"),
    ('start: A\nA: /a*/', "zero-width"),
    ('start: a | b\na: "x"\nb: "x"', "not LALR"),
    ('start: undefined_rule', "grammar refused by Lark"),
    ('', "empty"),
])
def test_a_feature_we_cannot_honour_is_refused_by_name(grammar: str, match: str) -> None:
    with pytest.raises(InvalidGrammarError, match=match):
        load_spec(grammar)


def test_errors_are_typed_through_the_compiler_and_cached() -> None:
    comp = GrammarCompiler(byte_info())
    for _ in range(2):
        with pytest.raises(InvalidGrammarError, match="lookaround"):
            comp.compile('start: A\nA: /(?!a)b/')


def test_common_escaped_string_is_replaced_by_an_equivalent_lookaround_free_regex() -> None:
    g = 'start: ESCAPED_STRING\n%import common.ESCAPED_STRING'
    cg = GrammarCompiler(byte_info()).compile(g)
    lk = lark.Lark(g, parser="lalr", lexer="basic")
    for s in ['""', '"a"', r'"a\"b"', r'"\\"', r'"\\\""', '"a"b"', r'"\"', '"a\nb"', r'"\\\\"x"']:
        try:
            lk.parse(s)
            ok = True
        except lark.exceptions.LarkError:
            ok = False
        assert cg.accepts_text(s) == ok, s


def test_keywords_are_reserved_and_case_insensitive_strings_work() -> None:
    g = 'start: "select"i NAME\nNAME: /[a-zA-Z]+/\n%ignore " "'
    cg = GrammarCompiler(byte_info()).compile(g)
    assert cg.accepts_text("SELECT abc") and cg.accepts_text("sElEcT x")
    assert not cg.accepts_text("select select")  # a keyword is never a NAME (Lark's basic lexer)
    assert not cg.accepts_text("selectx")  # one NAME lexeme, not the keyword
    g2 = 'start: "select"i NAME\nNAME: /[a-z]+/\n%ignore " "'
    cg2 = GrammarCompiler(byte_info()).compile(g2)
    lk = lark.Lark(g2, parser="lalr", lexer="basic")
    for s in ["select x", "SELECT x", "sElEcT x", "Select x", "select SELECT", "selectx"]:
        try:
            lk.parse(s)
            ok = True
        except lark.exceptions.LarkError:
            ok = False
        assert cg2.accepts_text(s) == ok, s


def test_lexing_follows_larks_first_match_with_longest_match_per_terminal() -> None:
    g = 'start: (A | B)+\nA: "a"\nB: /ab+/'
    cg = GrammarCompiler(byte_info()).compile(g)
    lk = lark.Lark(g, parser="lalr", lexer="basic")
    for s in ["a", "ab", "aab", "abbb", "aaba", "b"]:
        try:
            lk.parse(s)
            ok = True
        except lark.exceptions.LarkError:
            ok = False
        assert cg.accepts_text(s) == ok, s


def test_lazy_terminals_take_the_shortest_match() -> None:
    g = 'start: C+\nC: /<.*?>/'
    cg = GrammarCompiler(byte_info()).compile(g)
    assert cg.accepts_text("<a><b>") and cg.accepts_text("<a>")
    assert not cg.accepts_text("<a")


def test_a_grammar_too_long_for_the_canvas_is_refused_with_its_minimum_length() -> None:
    cg = GrammarCompiler(byte_info()).compile('start: "abcdef"')
    assert cg.min_tokens() == 6
    with pytest.raises(ConstraintTooLongError):
        cg.new_canvas_state(5)
    cg.new_canvas_state(6)


# ------------------------------------------------------------------------------------------ loader
def test_every_shipped_grammar_loads_compiles_and_parses_its_examples() -> None:
    comp = GrammarCompiler(byte_info())
    assert set(list_grammars()) == {"json", "arithmetic", "sql", "c_like", "smiles", "csv", "tsv"}
    for name in list_grammars():
        text = load_grammar(name)
        lk = lark.Lark(text, parser="lalr", lexer="basic")
        cg = comp.compile(text)
        for ex in examples(name):
            lk.parse(ex)
            assert cg.accepts_text(ex), (name, ex)


def test_csv_is_parameterised_by_its_column_count() -> None:
    comp = GrammarCompiler(byte_info())
    two = comp.compile(load_grammar("csv:2"))
    assert load_grammar("csv", columns=2) == load_grammar("csv:2") == load_grammar("csv:columns=2")
    assert two.accepts_text("a,b\nc,d\n") and two.accepts_text('"x, y",')
    assert not two.accepts_text("a,b,c") and not two.accepts_text("a")
    tsv = comp.compile(load_grammar("tsv:3"))
    assert tsv.accepts_text("a\tb\tc") and not tsv.accepts_text("a,b,c")
    with pytest.raises(InvalidGrammarError, match="columns"):
        load_grammar("csv:0")
    with pytest.raises(InvalidGrammarError, match="unknown parameters"):
        load_grammar("csv:rows=2")


def test_the_loader_takes_names_paths_and_text(tmp_path) -> None:
    p = tmp_path / "g.lark"
    p.write_text('start: "x"+\n')
    assert load_grammar(str(p)) == 'start: "x"+\n'
    assert load_grammar(p) == 'start: "x"+\n'
    assert load_grammar('start: "y"') == 'start: "y"'
    assert load_grammar("SQL") == load_grammar("sql")
    with pytest.raises(InvalidGrammarError, match="unknown grammar name"):
        load_grammar("sqll")
    with pytest.raises(InvalidGrammarError, match="not found"):
        load_grammar(str(tmp_path / "missing.lark"))
    with pytest.raises(InvalidGrammarError, match="takes no parameters"):
        load_grammar("json:3")
