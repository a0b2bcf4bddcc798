"""The server prompts an Instruct checkpoint exactly as `LLM.generate` does: one code path for the chat template.

/v1/chat/completions hands the messages to the LLM, which renders its checkpoint's chat template (Llama-3 layout for
LLaDA-8B-Instruct); /v1/completions' prompt string is one user message, as `LLM.generate("...")` takes it.
"""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server needs fastapi (pip install fastapi uvicorn openai)")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install fastapi uvicorn openai)")
pytest.importorskip("openai", reason="the server tests drive it with the openai client (pip install openai)")

import dllm_constrain as dc  # noqa: E402
from checkpoints import build_llada_instruct  # noqa: E402
from dllm_constrain.serve.app import build_app  # noqa: E402
from dllm_constrain.serve.backend import EngineBackend  # noqa: E402
from dllm_constrain.serve.chat import ChatFormatter  # noqa: E402
from test_serve import WAIT, _client, running_server  # noqa: E402

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three primes."}]


def test_chat_and_completions_endpoints_answer_what_llm_generate_answers(tmp_path: Path) -> None:
    build_llada_instruct(tmp_path, seed=3)
    llm = dc.LLM(tmp_path, freeze_gc_heap=False)
    options = {"max_new_tokens": 12, "temperature": 0.0, "seed": 1}
    chat_expected = llm.generate(MESSAGES, **options)[0].text  # before the backend owns the engine
    text_expected = llm.generate("Name three primes.", **options)[0].text
    backend = EngineBackend(llm)
    with running_server(build_app(backend, chat=ChatFormatter.for_llm(llm), request_timeout=WAIT)) as url:
        client = _client(url)
        chat = client.chat.completions.create(model=backend.model_id, messages=MESSAGES, max_tokens=12,
                                              temperature=0.0, seed=1)
        text = client.completions.create(model=backend.model_id, prompt="Name three primes.", max_tokens=12,
                                         temperature=0.0, seed=1)
    assert chat.choices[0].message.content == chat_expected
    assert chat.usage.prompt_tokens == len(llm.prompt_ids(MESSAGES))
    assert text.choices[0].text == text_expected
