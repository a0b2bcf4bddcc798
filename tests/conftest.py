"""Shared test set-up: the machine is small and shared, so every test runs single-threaded.

Triton decides at decoration time whether a @triton.jit function is compiled or interpreted, so the
interpreter flag must be set before anything imports Triton (torch._dynamo does, when a checkpoint loads).
Tests have no GPU: every Triton kernel they run goes through the interpreter. backend="auto" still takes
the torch path on CPU, so this costs the other tests nothing.
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
torch.set_flush_denormal(True)


# ---------------------------------------------------------------- tiny LLaDA + byte-level tokenizer (engine tests)
import pytest  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402

TINY_SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|mask|>"]  # ids 0..3, the bundled model's layout


def build_tiny_tokenizer() -> Tokenizer:
    """A byte-level BPE without merges: the 4 specials then the 256 byte symbols (260 ids), no training."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(TINY_SPECIALS + alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(TINY_SPECIALS)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def build_tiny_llada(seed: int = 0, vocab_size: int = 260, max_sequence_length: int = 256):
    """A 2-layer random LLaDA with the bundled model's special ids (bos 0, eos 1, pad 2, mask 3)."""
    from dllm_constrain.engine.models.llada import LLaDAConfig, LLaDAModel

    torch.manual_seed(seed)
    cfg = LLaDAConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden_size=64, vocab_size=vocab_size,
                      mask_token_id=3, eos_token_id=1, pad_token_id=2, bos_token_id=0,
                      max_sequence_length=max_sequence_length)
    return LLaDAModel(cfg).eval()


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Tokenizer:
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_llada():
    return build_tiny_llada()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, tiny_llada, tiny_tokenizer):
    """The tiny LLaDA saved as a checkpoint folder (config.json, model.safetensors, tokenizer.json)."""
    from dllm_constrain.engine.loader import save_checkpoint

    folder = tmp_path_factory.mktemp("tiny_llada")
    save_checkpoint(tiny_llada, tiny_tokenizer, folder)
    return folder
