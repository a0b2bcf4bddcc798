"""Every shipped grammar through a real BPE vocabulary, token by token.

* strings generated from the grammar (a hypothesis strategy driving random derivations of the Lark grammar,
  bounded depth) and the shipped examples are accepted token by token: at every prefix the frontier mask
  allows the next token, and EOS is allowed at the end;
* a corpus of near misses (hand-written, plus single-character mutations of valid strings that Lark
  rejects) is rejected: some token, or the final EOS, is masked out.

Tokenizers: a byte-level BPE trained here on the grammars' examples (tokens freely span lexeme boundaries:
no pre-tokenizer split), and ../shared's bpe32k when it is present.
"""
from __future__ import annotations

import random
from pathlib import Path

import lark
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from lark_reference import lark_accepts
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from dllm_constrain.constraints import TokenizerInfo
from dllm_constrain.constraints.compiler import GrammarCompiler
from dllm_constrain.constraints.cfg.sample import random_sentence
from dllm_constrain.grammars import examples, list_grammars, load_grammar

SHARED_32K = Path(__file__).resolve().parents[2] / "shared" / "data" / "tokenizers" / "bpe32k"
SPECIALS = ["<eos>", "<mask>"]

NEAR_MISSES = {
    "json": ['{"a": 1,}', "[1 2]", "{'a': 1}", '{"a" 1}', "[01]", "tru", '"unterminated', "{,}", "[1,]", "1.", "--1"],
    "arithmetic": ["1 +", "* 2", "(1 + 2", "1 2", "f(1,)", "1 ** 2", "1 +* 2", ")", "X + 1"],
    "sql": ["SELECT FROM t", "SELECT * t", "SELECT * FROM", "SELECT * FROM t WHERE", "SELECT a, FROM t",
            "SELECT * FROM t LIMIT x", "SELECT * FROM select", "SELECT * FROM t ORDER a", "SELEC * FROM t"],
    "c_like": ["int x = 1", "x = ;", "if x { }", "for (;;;) ;", "{", "int 1x;", "return return;", "x == 1;"],
    "smiles": ["C(", "C)", "(C)", "1CC", "C==C", "[C", "Cx", "C..C", "C%1"],
    "csv": ["a,b", "a,b,c,d", "a,b\nc,d,e", 'a,"b,c', 'a,b"c",d'],
    "tsv": ["a\tb", "a,b,c", "a\tb\tc\td"],
}


def _corpus() -> list[str]:
    out = []
    for name in list_grammars():
        out.extend(examples(name))
        out.extend(NEAR_MISSES.get(name, []))
    out += ["The quick brown fox jumps over the lazy dog.", "SELECT name, age FROM users WHERE age > 30"]
    return out * 10


@pytest.fixture(scope="module")
def small_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def _info(tok: Tokenizer) -> TokenizerInfo:
    return TokenizerInfo.from_tokenizer(tok, eos_id=tok.token_to_id("<eos>"), mask_id=tok.token_to_id("<mask>"))


@pytest.fixture(scope="module")
def small_info(small_bpe) -> TokenizerInfo:
    return _info(small_bpe)


def encode(tok: Tokenizer, info: TokenizerInfo, text: str) -> list[int]:
    ids = tok.encode(text, add_special_tokens=False).ids
    assert b"".join(info.token_bytes[i] for i in ids) == text.encode("utf-8")
    return ids


def accepted_token_by_token(cg, ids: list[int]) -> bool:
    """Commit ids one by one at the frontier of a canvas one longer than the text; each must be allowed by
    the frontier mask, and EOS must be allowed after the last one. The calls run without a time limit: what
    the grammar accepts must not depend on the machine's load (the limit's answers: test_grammar_deadline)."""
    n = len(ids) + 1
    mask_id, eos = cg.mask_id, cg.eos_id
    state = cg.new_canvas_state(n, timeout_s=None)
    canvas = [mask_id] * n
    for i, t in enumerate(ids):
        if not bool(state.allowed_tokens(canvas, [i])[0, t]):
            return False
        canvas[i] = t
    return bool(state.allowed_tokens(canvas, [n - 1])[0, eos])


_COMPILED: dict = {}


def compiled(info: TokenizerInfo, name: str):
    key = (info.fingerprint, name)
    if key not in _COMPILED:
        text = load_grammar(name)
        _COMPILED[key] = (GrammarCompiler(info).compile(text), lark.Lark(text, parser="lalr", lexer="basic"))
    return _COMPILED[key]


@pytest.mark.parametrize("name", list_grammars())
def test_examples_are_accepted_token_by_token(name, small_bpe, small_info) -> None:
    cg, _lk = compiled(small_info, name)
    for text in examples(name):
        assert accepted_token_by_token(cg, encode(small_bpe, small_info, text)), (name, text)


@pytest.mark.parametrize("name", list_grammars())
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(2, 7))
def test_generated_strings_are_accepted_token_by_token(name, seed, depth, small_bpe, small_info) -> None:
    # integer seeds, not st.randoms(): the test session flushes denormals, which hypothesis floats refuse
    cg, lk = compiled(small_info, name)
    text = random_sentence(cg, random.Random(seed), max_depth=depth)
    assume(text is not None)
    assert lark_accepts(lk, text)
    assert accepted_token_by_token(cg, encode(small_bpe, small_info, text)), (name, text)


def _mutations(text: str, rng: random.Random, k: int) -> list[str]:
    alphabet = sorted(set(text + "(),;'\"[]{} 0a=-+*\n\t"))
    out = []
    for _ in range(k):
        if not text:
            out.append(rng.choice(alphabet))
            continue
        i = rng.randrange(len(text))
        op = rng.randrange(3)
        if op == 0:
            out.append(text[:i] + text[i + 1:])
        elif op == 1:
            out.append(text[:i] + rng.choice(alphabet) + text[i:])
        else:
            out.append(text[:i] + rng.choice(alphabet) + text[i + 1:])
    return out


@pytest.mark.parametrize("name", list_grammars())
def test_near_misses_are_rejected(name, small_bpe, small_info) -> None:
    cg, lk = compiled(small_info, name)
    rng = random.Random(1234)
    corpus = list(NEAR_MISSES[name])
    for text in examples(name):
        corpus += _mutations(text, rng, 6)
    rejected = 0
    for text in corpus:
        if lark_accepts(lk, text):
            continue  # a mutation that happens to be valid
        rejected += 1
        assert not cg.accepts_text(text), (name, text)
        assert not accepted_token_by_token(cg, encode(small_bpe, small_info, text)), (name, text)
    assert rejected >= len(NEAR_MISSES[name])


@pytest.mark.skipif(not (SHARED_32K / "tokenizer.json").is_file(), reason="../shared bpe32k tokenizer absent")
@pytest.mark.parametrize("name", list_grammars())
def test_shipped_grammars_with_the_shared_32k_tokenizer(name) -> None:
    tok = Tokenizer.from_file(str(SHARED_32K / "tokenizer.json"))
    info = TokenizerInfo.from_tokenizer(str(SHARED_32K))
    if info.mask_id is None:  # the shared tokenizer has no mask token: use a padded id past the vocabulary
        info = TokenizerInfo(info.token_bytes, eos_id=info.eos_id, mask_id=len(info.token_bytes),
                             special_ids=sorted(info.special_ids), vocab_size=len(info.token_bytes) + 1)
    cg, lk = compiled(info, name)
    rng = random.Random(7)
    texts = examples(name)[:2] + [t for t in (random_sentence(cg, rng, 4) for _ in range(2)) if t]
    for text in texts:
        assert accepted_token_by_token(cg, encode(tok, info, text)), (name, text)
    for text in NEAR_MISSES[name][:3]:
        assert not accepted_token_by_token(cg, encode(tok, info, text)), (name, text)
    # a mask over the whole vocabulary at the first position is non-trivial and well-formed
    row = cg.new_canvas_state(16, timeout_s=None).allowed_tokens([cg.mask_id] * 16, [0])[0].numpy()
    assert 0 < int(np.count_nonzero(row)) < info.vocab_size
