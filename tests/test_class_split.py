"""The vocabulary split by the JSON-string byte class (class_split.py): a state whose rows send every class byte to one
state gets the token transitions of the whole-trie walk from a walk over the other tokens plus the class tokens'
rows by length; any other state is walked whole."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.constraints.class_split import LOOP_CLASS, ClassSplit
from dllm_constrain.constraints.deriv import DEAD

from constraint_support import grouping_thresholds, needs_native, table_automaton, trans_fields

CLASS = np.frombuffer(LOOP_CLASS, dtype=np.uint8).astype(np.intp)


@st.composite
def split_vocabularies(draw) -> list[bytes | None]:
    """Class tokens of several lengths and tokens with other bytes (a quote, a backslash, a newline, UTF-8 lead
    bytes), sharing prefixes, some spelled twice, a few ids spelling nothing."""
    class_byte = st.sampled_from(list(b"ab -~0"))
    other_byte = st.sampled_from(list(b'ab"\\\n\xc3\xa9'))
    word = st.one_of(st.lists(class_byte, min_size=1, max_size=7).map(bytes),
                     st.lists(other_byte, min_size=1, max_size=4).map(bytes))
    toks: list[bytes | None] = draw(st.lists(st.one_of(word, st.none()), min_size=1, max_size=80))
    return toks + [None, None]  # EOS, mask


@st.composite
def chain_tables(draw, max_states: int = 10) -> np.ndarray:
    """A complete byte table in which many states send all class bytes to one state (themselves, another state or
    DEAD): the shapes of a JSON string, a counted string and a key; the other bytes go anywhere."""
    n = draw(st.integers(2, max_states))
    full = np.zeros((n, 256), dtype=np.int32)
    for s in range(1, n):
        cuts = sorted(set(draw(st.lists(st.integers(1, 255), max_size=5))) | {0, 256})
        for lo, hi in zip(cuts, cuts[1:]):
            full[s, lo:hi] = draw(st.one_of(st.just(0), st.integers(0, n - 1)))
        if draw(st.booleans()):
            full[s, CLASS] = draw(st.sampled_from([s, 0, min(s + 1, n - 1), draw(st.integers(0, n - 1))]))
    return full


@needs_native
@settings(max_examples=200, deadline=None)
@given(chain_tables(), split_vocabularies(), st.integers(0, 12), st.integers(0, 12))
def test_split_transitions_equal_the_whole_walks_from_every_state(full, toks, dense_min, small):
    with grouping_thresholds(dense_min, small):
        split = table_automaton(full, toks, use_c=True)
        fallback = table_automaton(full, toks, use_c=False)
        assert split._split is not None
        for s in range(1, full.shape[0]):
            assert trans_fields(split, s) == trans_fields(fallback, s)


@given(split_vocabularies(), st.lists(st.integers(1, 9), unique=True))
def test_class_rows_by_length_hold_exactly_the_class_tokens_of_those_lengths(toks, lengths):
    sp = ClassSplit(toks, len(toks))
    lengths = sorted(k for k in lengths if k <= sp.max_len)
    runs = sp.runs(lengths)
    want = sorted(t for t, b in enumerate(toks) if b and set(b) <= set(LOOP_CLASS) and len(b) in lengths)
    row = np.unpackbits(sp.row_of(runs), bitorder="little")
    assert np.flatnonzero(row).tolist() == want
    assert sp.count_of(runs) == len(want)
    assert sorted(np.concatenate(sp.ids_of(runs) + [np.zeros(0, dtype=np.int64)]).tolist()) == want


@given(split_vocabularies())
def test_the_rest_trie_spells_exactly_the_tokens_with_a_byte_outside_the_class(toks):
    sp = ClassSplit(toks, len(toks))
    tr = sp.rest_trie
    spelled = set(tr.node_tok[tr.node_tok >= 0].tolist()) | set(tr.dup_extra.tolist())
    assert spelled == {t for t, b in enumerate(toks) if b and not set(b) <= set(LOOP_CLASS)}


def json_string_state(cc, prefix: bytes) -> int:
    s = 1
    for b in prefix:
        cc.ta.dfa.expand(s)
        s = int(cc.ta.dfa.T[s][b])
    return s


@pytest.fixture
def vocab_info():
    from constraint_support import json_test_vocabulary

    toks = json_test_vocabulary() + [b"hello", b"hello world", b"x" * 12]
    return TokenizerInfo(toks + [None, None], eos_id=len(toks), mask_id=len(toks) + 1)


@needs_native
def test_a_json_string_state_is_a_loop_on_the_class(vocab_info):
    cc = ConstraintCompiler(vocab_info, cache=False).compile_json_schema({"type": "string"})
    s = json_string_state(cc, b'"ab')
    assert cc.ta._split.chain(cc.ta.dfa, s) == [s] * cc.ta._split.max_len


@needs_native
def test_a_counted_string_state_is_a_chain_that_ends_dead(vocab_info):
    cc = ConstraintCompiler(vocab_info, cache=False).compile_json_schema({"type": "string", "maxLength": 3})
    s = json_string_state(cc, b'"a')
    chain = cc.ta._split.chain(cc.ta.dfa, s)
    assert len(set(chain[:2])) == 2 and DEAD not in chain[:2] and set(chain[2:]) == {DEAD}


@needs_native
def test_a_state_with_class_bytes_going_apart_is_not_split(vocab_info):
    cc = ConstraintCompiler(vocab_info, cache=False).compile_regex(r'"[a-z]*"')
    assert cc.ta._split.chain(cc.ta.dfa, json_string_state(cc, b'"')) is None


@needs_native
def test_a_json_string_state_is_computed_without_the_whole_trie_walk(vocab_info):
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    split = ConstraintCompiler(vocab_info, cache=False).compile_json_schema(schema)
    whole = ConstraintCompiler(vocab_info, cache=False).compile_json_schema(schema)
    s = json_string_state(split, b'{"name":"x')
    assert json_string_state(whole, b'{"name":"x') == s

    def no_whole_walk(*args, **kwargs):
        raise AssertionError("the whole trie was walked")

    split.ta._cwalker.walk_grouped = no_whole_walk
    whole.ta._split = None
    assert trans_fields(split.ta, s) == trans_fields(whole.ta, s)
    assert split.ta.trans(s).n_allowed > len(vocab_info.token_bytes) // 2


@needs_native
def test_prepare_builds_the_per_tokenizer_tables_before_the_first_constraint(vocab_info, monkeypatch):
    from dllm_constrain.constraints import _cwalk, class_split

    assert vocab_info.prepare() is vocab_info

    def built_again(*args, **kwargs):
        raise AssertionError("a per-tokenizer table was built after prepare()")

    monkeypatch.setattr(_cwalk.PreorderTrie, "__init__", built_again)
    monkeypatch.setattr(class_split.ClassSplit, "__init__", built_again)
    cc = ConstraintCompiler(vocab_info, cache=False).compile_json_schema({"type": "string"})
    state = cc.new_canvas_state(8)
    assert state.allowed_tokens([vocab_info.mask_id] * 8, [0]).any()
