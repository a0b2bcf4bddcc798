"""The server's decisions route (`POST /v1/decisions`, vLLM 0.33's shape) and vLLM's diffusion canvas fields in
`vllm_xargs` (seed canvas, pinned positions, canvas length, steps; our text templates), driven over HTTP on
127.0.0.1 with httpx and the openai client; every wait is bounded and the server stops by itself."""
from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs fastapi (pip install fastapi uvicorn openai)")
uvicorn = pytest.importorskip("uvicorn", reason="the server needs uvicorn")
openai = pytest.importorskip("openai", reason="the tests drive the server with the openai client")
try:  # the HTTP client the openai package is built on (httpx2 in its 3.x line, httpx before)
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

from dllm_constrain.serve.app import build_app  # noqa: E402
from dllm_constrain.serve.backend import EngineBackend  # noqa: E402
import serve_support  # noqa: E402

WAIT = 60.0  # bound on every wait in this module
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}}, "required": ["name", "age", "city"]}
ASK = "Create a record with name Ada Lovelace; age 36; city London."
TEMPLATE = '{"name":"Ada","age":<hole:2>,"city":"<hole:..6>'  # compact: the server compiles compact JSON


def running_server(app: Any) -> contextlib.AbstractContextManager[str]:
    """Serve `app` on a free 127.0.0.1 port in a background thread; yields the base URL; stops at exit."""
    return serve_support.running_server(app, wait=WAIT)


@pytest.fixture(scope="module")
def llm() -> Any:
    import dllm_constrain as dc

    return dc.LLM()


@pytest.fixture(scope="module")
def served(llm: Any) -> Iterator[tuple[str, str]]:
    backend = EngineBackend(llm)
    with running_server(build_app(backend, request_timeout=WAIT)) as url:
        yield url, backend.model_id


def _decide(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/decisions", json=body, timeout=WAIT)


QUESTIONS = [
    {"type": "predicate", "instructions": "Does Ada live in London?", "name": "london"},
    {"type": "choice", "instructions": "Which city?", "choices": [{"value": "London"}, {"value": "New York"},
                                                                 {"value": True}]},
    {"type": "score", "instructions": "How old is Ada?", "levels": [{"label": "young"}, {"label": "old"}]},
]


@pytest.mark.parametrize("joint", [False, True])
def test_decisions_answer_in_vllms_shape(served: tuple[str, str], joint: bool) -> None:
    url, model = served
    reply = _decide(url, {"model": model, "input": [{"role": "user", "content": "Ada Lovelace, 36, London."}],
                          "questions": QUESTIONS, "joint": joint})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == model and set(body["usage"]) >= {"input_tokens", "output_tokens", "total_tokens",
                                                              "input_tokens_details", "output_tokens_details"}
    pred, choice, score = body["answers"]
    assert pred["type"] == "predicate" and pred["name"] == "london" and 0 <= pred["probability"] <= 1
    assert pred["label"] in ("yes", "no")
    assert choice["type"] == "choice" and choice["choice"] in ("London", "New York", True)
    assert [p["value"] for p in choice["probabilities"]] == ["London", "New York", True]
    assert score["type"] == "score" and [p["label"] for p in score["probabilities"]] == ["young", "old"]
    for answer in (choice, score):
        assert math.isclose(sum(p["probability"] for p in answer["probabilities"]), 1.0, abs_tol=1e-9)
        assert 0 <= answer["confidence"] <= 1
    assert score["score"] == pytest.approx(score["probabilities"][1]["probability"])


def test_twenty_questions_answered_jointly_on_one_canvas(served: tuple[str, str]) -> None:
    url, model = served
    questions = [{"type": "predicate", "instructions": f"Is {i} an even number?"} for i in range(10)]
    questions += [{"type": "choice", "instructions": f"Which colour is item {i}?",
                   "choices": [{"value": "red"}, {"value": "green"}, {"value": "light blue"}]} for i in range(10)]
    reply = _decide(url, {"model": model, "input": "Numbers and colours.", "questions": questions, "joint": True})
    assert reply.status_code == 200, reply.text
    answers = reply.json()["answers"]
    assert len(answers) == 20
    assert all(a["label"] in ("yes", "no") for a in answers[:10])
    assert all(a["choice"] in ("red", "green", "light blue") for a in answers[10:])


@pytest.mark.parametrize("body, status, param", [
    ({"input": "x", "questions": [{"type": "choice", "instructions": "q", "choices": [{"value": "a"}]}]}, 400,
     "questions.0.choice.choices"),
    ({"input": "x", "questions": []}, 400, "questions"),
    ({"input": "x", "questions": [{"type": "predicate", "instructions": "q", "extra": 1}]}, 400, None),
    ({"input": "x", "questions": [{"type": "predicate", "instructions": "q"}] * 65, "joint": True}, 400, None),
    ({"model": "other", "input": "x", "questions": [{"type": "predicate", "instructions": "q"}]}, 404, "model"),
])
def test_bad_decision_requests_get_openai_error_bodies(served: tuple[str, str], body: dict[str, Any], status: int,
                                                       param: str | None) -> None:
    url, _ = served
    reply = _decide(url, body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["message"]
    if param is not None:
        assert error["param"] is not None and error["param"].startswith(param)


def test_vllm_xargs_seed_canvas_and_pins_hold(served: tuple[str, str], llm: Any) -> None:
    url, model = served
    client = openai.OpenAI(base_url=url, api_key="x", timeout=WAIT, max_retries=0)
    seed = llm.encode_text('{"name":"Ada","age":36,"city":"London"}')
    pinned = list(range(0, 6))  # the opening of the record; the rest is the model's, under the schema
    reply = client.completions.create(model=model, prompt=ASK, extra_body={
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
        "vllm_xargs": {"diffusion_seed_canvas": seed, "diffusion_pinned": pinned, "diffusion_max_steps": 8}})
    text = reply.choices[0].text
    jsonschema.validate(json.loads(text), PERSON)
    assert text.startswith(llm.engine.decode(seed[:6]))


def test_a_template_streams_its_pinned_prefix_as_committed_text(served: tuple[str, str]) -> None:
    url, model = served
    client = openai.OpenAI(base_url=url, api_key="x", timeout=WAIT, max_retries=0)
    stream = client.completions.create(model=model, prompt=ASK, stream=True, extra_body={
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
        "vllm_xargs": {"template": TEMPLATE}})
    chunks = [c.choices[0].text for c in stream if c.choices and c.choices[0].text]
    assert chunks[0].startswith('{"name":"Ada","age":')
    jsonschema.validate(json.loads("".join(chunks)), PERSON)


def test_pins_inconsistent_with_the_schema_are_a_400_naming_the_position(served: tuple[str, str], llm: Any) -> None:
    url, model = served
    seed = llm.encode_text('{"nam": "Ada", "age": 36, "city": "London"}')
    reply = httpx.post(f"{url}/completions", timeout=WAIT, json={
        "model": model, "prompt": ASK,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
        "vllm_xargs": {"diffusion_seed_canvas": seed, "diffusion_pinned": list(range(len(seed)))}})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "pinned_token_unfit" and "canvas position" in error["message"]


@pytest.mark.parametrize("xargs, match", [({"diffusion_read_only": True}, "not supported"),
                                          ({"diffusion_guess": 1}, "not supported"),
                                          ({"diffusion_pinned": [0]}, "seed_canvas")])
def test_unsupported_or_bad_vllm_xargs_are_400(served: tuple[str, str], xargs: dict[str, Any], match: str) -> None:
    url, model = served
    reply = httpx.post(f"{url}/completions", timeout=WAIT,
                       json={"model": model, "prompt": ASK, "max_tokens": 8, "vllm_xargs": xargs})
    assert reply.status_code == 400, reply.text
    assert match in reply.json()["error"]["message"]
