"""Module-scoped `LLM` fixtures shared by test modules; a module imports the ones it uses by name (each module
still gets instances of its own, built once per module)."""
from __future__ import annotations

import pytest

import dllm_constrain as dc
from checkpoints import build_dream_instruct, build_llada_instruct


@pytest.fixture(scope="module")
def tiny(tiny_llada, tiny_tokenizer):
    """The tiny random LLaDA of conftest.py behind the public API."""
    return dc.LLM.from_model(tiny_llada, tiny_tokenizer, freeze_gc_heap=False)


@pytest.fixture(scope="module")
def bundled():
    """The bundled model."""
    return dc.LLM()


@pytest.fixture(scope="module")
def llada(tmp_path_factory: pytest.TempPathFactory) -> dc.LLM:
    """A random LLaDA-8B-Instruct-shaped checkpoint (chat template, generation config) loaded from disk."""
    folder = tmp_path_factory.mktemp("llada_instruct")
    build_llada_instruct(folder, seed=3)
    return dc.LLM(folder, freeze_gc_heap=False)


@pytest.fixture(scope="module")
def dream(tmp_path_factory: pytest.TempPathFactory) -> dc.LLM:
    """A random Dream-Instruct-shaped checkpoint loaded from disk."""
    folder = tmp_path_factory.mktemp("dream_instruct")
    build_dream_instruct(folder, seed=5)
    return dc.LLM(folder, freeze_gc_heap=False)
