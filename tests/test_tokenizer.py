"""engine/tokenizer.py: encode/decode, special-id resolution order, and token bytes for the constraint compiler."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from checkpoints import (
    DREAM_SPECIALS,
    LLADA_SPECIALS,
    byte_level_tokenizer,
    sentencepiece_style_tokenizer,
)
from dllm_constrain.engine.tokenizer import Tokenizer
from dllm_constrain.errors import CheckpointError

TEXTS = [
    "hello world",
    '{"name": "Ada", "age": 36}',
    "naïve café – 東京 🚀",
    "  leading spaces\n\ttabs\r\nand newlines  ",
    "",
]
SHARED_BPE32K = Path(__file__).resolve().parents[2] / "shared" / "data" / "tokenizers" / "bpe32k"


def write_folder(folder: Path, backend: HFTokenizer, **json_files: dict) -> Path:
    """A folder with tokenizer.json and the given extra JSON files (config, tokenizer_config, ...)."""
    folder.mkdir(parents=True, exist_ok=True)
    backend.save(str(folder / "tokenizer.json"))
    for name, content in json_files.items():
        (folder / f"{name}.json").write_text(json.dumps(content))
    return folder


@pytest.fixture()
def llada_tok() -> Tokenizer:
    return Tokenizer(byte_level_tokenizer(LLADA_SPECIALS))


@pytest.mark.parametrize("text", TEXTS)
def test_decode_inverts_encode(llada_tok: Tokenizer, text: str) -> None:
    assert llada_tok.decode(llada_tok.encode(text)) == text


def test_decode_leaves_out_special_tokens(llada_tok: Tokenizer) -> None:
    ids = llada_tok.encode("ab") + [llada_tok.mask_id, llada_tok.eos_id, llada_tok.eos_id]
    assert llada_tok.decode(ids) == "ab"


def test_decode_ignores_ids_beyond_the_tokenizer_vocabulary(llada_tok: Tokenizer) -> None:
    """Model vocabularies are padded past the tokenizer's; such ids must not crash decoding."""
    assert llada_tok.decode(llada_tok.encode("ab") + [llada_tok.vocab_size + 5]) == "ab"


def test_encode_adds_specials_only_when_asked() -> None:
    from tokenizers import processors

    backend = byte_level_tokenizer(LLADA_SPECIALS)
    bos = backend.token_to_id("<|startoftext|>")
    backend.post_processor = processors.TemplateProcessing(single="<|startoftext|> $A",
                                                           special_tokens=[("<|startoftext|>", bos)])
    tok = Tokenizer(backend)
    assert tok.encode("hi", add_special=True) == [bos] + tok.encode("hi")


def test_special_ids_come_from_config_json_first(tmp_path: Path) -> None:
    backend = byte_level_tokenizer(LLADA_SPECIALS)
    config = {"mask_token_id": 7, "eos_token_id": 8, "pad_token_id": 9, "bos_token_id": 10}
    tok = Tokenizer(write_folder(tmp_path, backend, config=config,
                                 tokenizer_config={"eos_token": "<|eot_id|>"}))
    assert (tok.mask_id, tok.eos_id, tok.pad_id, tok.bos_id) == (7, 8, 9, 10)


def test_a_list_of_eos_ids_in_config_gives_its_first(tmp_path: Path) -> None:
    tok = Tokenizer(write_folder(tmp_path, byte_level_tokenizer(LLADA_SPECIALS), config={"eos_token_id": [5, 6]}))
    assert tok.eos_id == 5


def test_nested_text_config_ids_are_read(tmp_path: Path) -> None:
    """DiffusionGemma keeps its token ids in config.json's text_config."""
    tok = Tokenizer(write_folder(tmp_path, sentencepiece_style_tokenizer(),
                                 config={"text_config": {"eos_token_id": 1, "pad_token_id": 0, "bos_token_id": 2}}))
    assert (tok.eos_id, tok.pad_id, tok.bos_id) == (1, 0, 2)


def test_tokenizer_config_names_the_token_when_config_json_does_not(tmp_path: Path) -> None:
    backend = byte_level_tokenizer(LLADA_SPECIALS)
    tok = Tokenizer(write_folder(tmp_path, backend, config={},
                                 tokenizer_config={"eos_token": {"content": "<|eot_id|>", "special": True}}))
    assert tok.eos_id == backend.token_to_id("<|eot_id|>")


def test_special_tokens_map_is_read_after_tokenizer_config(tmp_path: Path) -> None:
    backend = byte_level_tokenizer(LLADA_SPECIALS)
    tok = Tokenizer(write_folder(tmp_path, backend, special_tokens_map={"eos_token": "<|eot_id|>"}))
    assert tok.eos_id == backend.token_to_id("<|eot_id|>")


def test_well_known_names_resolve_llada_and_dream_masks() -> None:
    llada = byte_level_tokenizer(LLADA_SPECIALS)
    dream = byte_level_tokenizer(DREAM_SPECIALS)
    assert Tokenizer(llada).mask_id == llada.token_to_id("<|mdm_mask|>")
    assert Tokenizer(dream).mask_id == dream.token_to_id("<|mask|>")
    assert Tokenizer(dream).eos_id == dream.token_to_id("<|endoftext|>")


def test_pad_falls_back_to_eos() -> None:
    tok = Tokenizer(byte_level_tokenizer(LLADA_SPECIALS))
    assert tok.pad_id == tok.eos_id


def test_a_role_found_nowhere_is_none() -> None:
    tok = Tokenizer(byte_level_tokenizer(["<|endoftext|>"]))
    assert tok.mask_id is None and tok.bos_id is None


def test_missing_tokenizer_json_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        Tokenizer(tmp_path)


@pytest.mark.parametrize("text", TEXTS)
def test_byte_level_token_bytes_concatenate_to_the_text(llada_tok: Tokenizer, text: str) -> None:
    table = llada_tok.token_bytes()
    assert b"".join(table[i] for i in llada_tok.encode(text)) == text.encode("utf-8")


def test_every_byte_has_a_single_byte_token(llada_tok: Tokenizer) -> None:
    """The byte-level alphabet covers all 256 bytes, so every string is expressible."""
    singles = {b for b in llada_tok.token_bytes() if b is not None and len(b) == 1}
    assert singles == {bytes([i]) for i in range(256)}


def test_special_tokens_have_no_bytes(llada_tok: Tokenizer) -> None:
    table = llada_tok.token_bytes()
    assert all(table[i] is None for i in (llada_tok.mask_id, llada_tok.eos_id, llada_tok.bos_id))


def test_token_bytes_pads_to_the_model_vocabulary(llada_tok: Tokenizer) -> None:
    table = llada_tok.token_bytes(size=llada_tok.vocab_size + 20)
    assert len(table) == llada_tok.vocab_size + 20 and table[-20:] == [None] * 20


def test_sentencepiece_style_space_and_byte_fallback_tokens() -> None:
    tok = Tokenizer(sentencepiece_style_tokenizer())
    table = tok.token_bytes()
    assert table[tok.token_to_id("▁the")] == b" the"
    assert table[tok.token_to_id("<0xE2>")] == b"\xe2"
    assert table[tok.token_to_id("<mask>")] is None


@pytest.mark.parametrize("text", ["the cat", "Hello, World!", "déjà 🚀"])
def test_sentencepiece_style_token_bytes_concatenate_to_the_prefixed_text(text: str) -> None:
    """Metaspace prepends one space to the text; token bytes keep it (decode strips it at the start only)."""
    tok = Tokenizer(sentencepiece_style_tokenizer())
    table = tok.token_bytes()
    assert b"".join(table[i] for i in tok.encode(text)) == (" " + text).encode("utf-8")
    assert tok.decode(tok.encode(text)) == text


def test_unsupported_decoder_is_refused_rather_than_guessed() -> None:
    backend = HFTokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece()
    with pytest.raises(CheckpointError, match="WordPiece"):
        Tokenizer(backend).token_bytes()


@pytest.mark.skipif(not SHARED_BPE32K.is_dir(), reason="../shared/data/tokenizers/bpe32k is not present")
def test_shared_bpe32k_tokenizer_resolves_specials_and_bytes() -> None:
    tok = Tokenizer(SHARED_BPE32K)
    assert tok.eos_id == tok.token_to_id("<|end_of_text|>")
    assert tok.pad_id == tok.token_to_id("<|pad|>")
    table = tok.token_bytes()
    text = '{"id": 42, "title": "Zürich – naïve 🚀"}\n'
    assert b"".join(table[i] for i in tok.encode(text)) == text.encode("utf-8")
