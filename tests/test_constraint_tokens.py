"""TokenizerInfo (token bytes, specials) and the token automaton (trie walks, C and numpy agree)."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.constraints import _cwalk
from dllm_constrain.constraints.regex_parser import parse_regex

from constraint_support import small_regexes


def byte_level_tokenizer(extra: list[str]) -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    specials = ["<|bos|>", "<|eos|>", "<|pad|>", "<|mask|>"]
    vocab = {t: i for i, t in enumerate(specials + alphabet + extra)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(specials)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def test_byte_level_vocabulary_decodes_to_raw_bytes_and_specials_have_none():
    # "Ġ" is the stand-in of a space, "Ã©" of the two bytes of "é"
    tok = byte_level_tokenizer(["Ġhello", "Ã©"])
    info = TokenizerInfo.from_tokenizer(tok, eos_id=1, mask_id=3)
    tb = info.token_bytes
    assert tb[0] is None and tb[1] is None and tb[2] is None and tb[3] is None
    assert sorted(tb[4:260]) == [bytes([b]) for b in range(256)]
    assert tb[260] == b" hello" and tb[261] == "é".encode()
    assert info.eos_id == 1 and info.mask_id == 3


def test_model_vocab_wider_than_the_tokenizer_is_padded_with_never_allowed_ids():
    tok = byte_level_tokenizer([])
    info = TokenizerInfo.from_tokenizer(tok, eos_id=1, mask_id=3, vocab_size=300)
    assert info.vocab_size == 300 and len(info.token_bytes) == 260
    cc = ConstraintCompiler(info).compile_regex(".*")
    m = cc.new_canvas_state(2).allowed_tokens([3, 3], [0, 1])
    assert m.shape == (2, 300) and not m[:, 260:].any() and not m[:, [0, 2, 3]].any()


def test_tokenizer_json_folder_is_read_with_its_declared_eos(tmp_path):
    tok = byte_level_tokenizer(["ab"])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|eos|>"}')
    info = TokenizerInfo.from_tokenizer(str(tmp_path), mask_id=3)
    assert info.eos_id == 1 and info.token_bytes[260] == b"ab"


def test_engine_style_wrapper_with_token_bytes_is_accepted():
    class Wrapper:
        eos_id, mask_id = 2, 3
        special_ids = frozenset({0, 2, 3})

        def token_bytes(self):
            return [None, b"a", None, None, b"b"]

    info = TokenizerInfo.from_tokenizer(Wrapper())
    assert info.eos_id == 2 and info.mask_id == 3 and info.token_bytes == [None, b"a", None, None, b"b"]


def test_trie_children_are_contiguous_and_every_token_has_its_node():
    rng = random.Random(0)
    toks = list({bytes(rng.choice(b"abc\xc3\xa9") for _ in range(rng.randint(1, 4))) for _ in range(60)})
    info = TokenizerInfo(toks + [None], eos_id=len(toks))
    tr = info.trie()
    for p in range(tr.n_nodes):
        kids = np.flatnonzero(tr.parent[1:] == p) + 1
        if kids.size:
            assert (kids == np.arange(tr.child_start[p], tr.child_end[p])).all()
    for t, b in enumerate(toks):
        node, path = tr.token_node[t], []
        while node:
            path.append(int(tr.byte[node]))
            node = tr.parent[node]
        assert bytes(reversed(path)) == b


@pytest.mark.skipif(_cwalk.load() is None, reason="no C compiler: the numpy walker is the only one")
@settings(max_examples=40, deadline=None)
@given(small_regexes(), st.integers(0, 2**32 - 1))
def test_c_and_numpy_trie_walks_agree(pattern, seed):
    rng = random.Random(seed)
    toks = list({bytes(rng.choice(b"abc0-.\xc3\xa9\xe0\xa0\x80") for _ in range(rng.randint(1, 5)))
                 for _ in range(200)})
    info = TokenizerInfo(toks + [None, None], eos_id=len(toks), mask_id=len(toks) + 1)
    cc = ConstraintCompiler(info, cache=False).compile_ast(parse_regex(pattern).node)
    ta = cc.ta
    assert ta._cwalker is not None
    todo, seen = [1], {1}
    while todo:
        s = todo.pop()
        a, b = ta.walk_tokens(s)
        c, d = ta._walk_tokens_numpy(s)
        o1, o2 = np.argsort(a), np.argsort(c)
        assert np.array_equal(a[o1], c[o2]) and np.array_equal(b[o1], d[o2])
        for u in set(b.tolist()) - seen:
            seen.add(u)
            todo.append(u)


def test_two_ids_with_the_same_bytes_are_both_allowed():
    info = TokenizerInfo([b"a", b"ab", b"a", b"b", None, None], eos_id=4, mask_id=5)
    cc = ConstraintCompiler(info, cache=False).compile_regex("ab")
    m = cc.new_canvas_state(2).allowed_tokens([5, 5], [0, 1])
    assert set(m[0].nonzero().flatten().tolist()) == {0, 1, 2}
    assert set(m[1].nonzero().flatten().tolist()) == {3, 4}
    a, b = cc.ta.walk_tokens(1)
    c, d = cc.ta._walk_tokens_numpy(1)
    assert sorted(zip(a.tolist(), b.tolist())) == sorted(zip(c.tolist(), d.tolist()))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=4), min_size=1, max_size=30), st.binary(max_size=5))
def test_a_token_prefix_is_recognised_exactly(tokens, data):
    info = TokenizerInfo(list(tokens) + [None, None], eos_id=len(tokens), mask_id=len(tokens) + 1)
    assert info.is_token_prefix(data) == any(t.startswith(data) for t in tokens)


@given(st.lists(st.integers(0, 3000), max_size=200))
def test_a_set_built_from_indices_has_exactly_those_members(indices):
    from dllm_constrain.constraints.token_automaton import bits_from, bits_of

    assert bits_of(bits_from(np.array(indices, dtype=np.int64))) == sorted(set(indices))
