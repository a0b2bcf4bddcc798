"""Shared test set-up: the machine is small and shared, so every test runs single-threaded.

Triton decides at decoration time whether a @triton.jit function is compiled or interpreted, so the
interpreter flag must be set before anything imports Triton (torch._dynamo does, when a checkpoint loads;
`import torch` does not). Without a CUDA device every Triton kernel the tests run goes through the interpreter
(backend="auto" still takes the torch path on the CPU, so this costs the other tests nothing); with one, the kernels
compile for it (the kernel tests that run Triton on CPU tensors switch the interpreter on for their module).

Placement: the default suite is a CPU suite. Its tests compare outputs bitwise (across runs, batch mixes, cache
modes, threads), which holds on the CPU and not across GPU kernels that choose their tiling by shape. So on a host
with CUDA, every test but those in tests/gpu/ (marker `gpu`) and those that test the default placement itself
(marker `default_placement`) gets the CPU as the default device; on a host without CUDA the default is the CPU
anyway and nothing is patched. Tests of CUDA behaviour live in tests/gpu/ and compare with tolerances.
"""
from __future__ import annotations

import os

import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(1)
torch.set_flush_denormal(True)

import pytest  # noqa: E402

from dllm_constrain.engine import placement  # noqa: E402  (the package imports no Triton)

REAL_DEFAULT_DEVICE = placement.default_device


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (tests/gpu/; skipped without one)")
    config.addinivalue_line("markers", "default_placement: tests the default device choice itself (not pinned "
                                       "to the CPU on a CUDA host)")


@pytest.fixture(scope="session", autouse=True)
def _cpu_default_device():
    """On a CUDA host, the default device of the CPU suite is the CPU (see the module docstring); session-scoped so
    that module- and session-scoped fixtures (an `LLM` made once per module) are placed by it too."""
    if not CUDA:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(placement, "default_device", lambda: torch.device("cpu"))
        yield


@pytest.fixture(autouse=True)
def _real_default_device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests marked `gpu` or `default_placement` see the real default device."""
    if CUDA and (request.node.get_closest_marker("gpu") or request.node.get_closest_marker("default_placement")):
        monkeypatch.setattr(placement, "default_device", REAL_DEFAULT_DEVICE)


# ---------------------------------------------------------------- tiny LLaDA + byte-level tokenizer (engine tests)
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
