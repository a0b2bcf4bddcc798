"""The server's bounds against hostile or careless clients: body size, media type, malformed bodies, prompt
length, queue time, unsupported fields, schema warnings, and a bounded graceful shutdown.

Every refusal is an OpenAI error body with a 4xx/503 status, never a 500 and never a hang. Most tests run the app
over a model-free backend (they are about the HTTP layer); the ones that need compilation or the engine use the
bundled model with small canvases.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs fastapi (pip install fastapi uvicorn openai)")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install fastapi uvicorn openai)")

from dllm_constrain.serve.admission import Drain  # noqa: E402
from dllm_constrain.serve.app import build_app  # noqa: E402
from dllm_constrain.serve.backend import (  # noqa: E402
    EngineBackend,
    Failed,
    GenerationRequest,
    RequestHandle,
)
from dllm_constrain.serve.errors import RequestAbortedError  # noqa: E402
from dllm_constrain.serve.limits import MAX_JSON_DEPTH, ServeLimits  # noqa: E402
from dllm_constrain.serve.shutdown import ShutdownPlan, make_server  # noqa: E402
from serve_support import WAIT, InstantBackend, free_port, post, running_server  # noqa: E402

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.fixture(scope="module")
def llm() -> Any:
    import dllm_constrain as dc

    return dc.LLM()


class _HangingBackend(InstantBackend):
    """Takes requests into its 'engine' at once and never finishes them; `close` fails them as a shutdown does."""

    model_id = "hanging"

    def __init__(self) -> None:
        super().__init__()
        self.handles: list[RequestHandle] = []
        self.drained = threading.Event()

    def submit(self, request: GenerationRequest) -> RequestHandle:
        self.requests.append(request)
        handle = RequestHandle(f"h-{len(self.requests)}", request, asyncio.get_running_loop())
        handle.admitted = True
        self.handles.append(handle)
        return handle

    def drain(self) -> None:
        self.drained.set()

    def close(self, timeout: float = 10.0) -> None:
        for handle in self.handles:
            handle.publish(Failed(RequestAbortedError("the server is shutting down: the request was stopped")))


def _error(text: str) -> dict[str, Any]:
    return json.loads(text)["error"]


# ---------------------------------------------------------------------------------------------- bodies
def test_a_body_over_the_limit_is_413_whether_declared_or_chunked() -> None:
    backend = InstantBackend()
    with running_server(build_app(backend, limits=ServeLimits(max_body_bytes=2000))) as url:
        big = {"prompt": "x" * 5000, "max_tokens": 8}
        for chunked in (False, True):
            status, _, text = post(url + "/completions", big, chunked=chunked)
            assert status == 413 and _error(text)["code"] == "payload_too_large", text
        status, _, _ = post(url + "/completions", {"prompt": "x" * 1000, "max_tokens": 8})
        assert status == 200
    assert [len(r.prompt) for r in backend.requests] == [1000]


def test_a_body_that_is_not_declared_json_is_415_and_an_undeclared_one_is_read_as_json() -> None:
    backend = InstantBackend()
    body = json.dumps({"prompt": "x", "max_tokens": 8}).encode()
    with running_server(build_app(backend)) as url:
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            status, _, text = post(url + "/completions", body, headers={"Content-Type": content_type})
            assert status == 415 and _error(text)["code"] == "unsupported_media_type", text
        assert post(url + "/completions", body)[0] == 200
        assert post(url + "/completions", body, headers={"Content-Type": "application/json; charset=utf-8"})[0] == 200
    assert len(backend.requests) == 2


@pytest.mark.parametrize("raw", [
    b"[" * 200_000 + b"]" * 200_000,  # past the decoder's recursion limit
    json.dumps({"prompt": "x", "metadata": json.loads("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))}).encode(),
    b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}",  # more digits than Python converts
    b'{"prompt": "\xff\xfe"}',  # not UTF-8
    b'{"prompt": "x",',  # truncated
    b"",
    b'"just a string"',
], ids=["deep-array", "deep-field", "huge-integer", "bad-utf8", "truncated", "empty", "not-an-object"])
def test_a_malformed_body_is_a_400(raw: bytes) -> None:
    backend = InstantBackend()
    with running_server(build_app(backend)) as url:
        status, _, text = post(url + "/completions", raw, headers={"Content-Type": "application/json"})
    assert status == 400 and _error(text)["code"] == "invalid_request", text
    assert backend.requests == []


def test_neutral_values_of_unimplemented_fields_are_accepted() -> None:
    backend = InstantBackend()
    neutral = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "ignore_eos": False, "stop_token_ids": [],
               "min_tokens": 0, "logprobs": False, "top_logprobs": 0, "top_p": 1, "user": "someone"}
    with running_server(build_app(backend)) as url:
        status, _, text = post(url + "/chat/completions",
                               {"messages": [{"role": "user", "content": "x"}], **neutral})
    assert status == 200, text


@pytest.mark.parametrize("field,value", [("top_logprobs", 3), ("logprobs", True), ("top_p", 0.5), ("top_k", 5),
                                         ("min_p", 0.1), ("repetition_penalty", 1.2), ("ignore_eos", True),
                                         ("stop_token_ids", [3]), ("min_tokens", 4)])
def test_an_output_changing_field_the_server_does_not_implement_is_a_400(field: str, value: Any) -> None:
    backend = InstantBackend()
    with running_server(build_app(backend)) as url:
        status, _, text = post(url + "/chat/completions", {"messages": [{"role": "user", "content": "x"}], field: value})
    assert status == 400 and _error(text)["param"] == field, text
    assert backend.requests == []


# ---------------------------------------------------------------------------------------------- prompt length
def test_a_prompt_longer_than_any_that_fits_is_refused_before_it_reaches_the_backend() -> None:
    backend = InstantBackend()
    with running_server(build_app(backend, limits=ServeLimits(max_prompt_chars=1000))) as url:
        status, _, text = post(url + "/completions", {"prompt": "x" * 1001, "max_tokens": 8})
        assert status == 400 and _error(text)["code"] == "context_length_exceeded", text
        status, _, text = post(url + "/chat/completions", {"messages": [{"role": "user", "content": "y" * 5000}]})
        assert status == 400 and _error(text)["code"] == "context_length_exceeded", text
        assert post(url + "/completions", {"prompt": "x" * 1000, "max_tokens": 8})[0] == 200
    assert len(backend.requests) == 1


def test_the_prompt_bound_of_a_model_admits_every_prompt_that_fits(llm: Any) -> None:
    """The bound is a necessary condition: the longest text one token stands for times the context; a prompt of
    the longest tokens that fills the context is under it."""
    from dllm_constrain.serve.limits import prompt_char_bound

    bound = prompt_char_bound(llm)
    context = llm.engine.model.max_sequence_length
    longest = max(len(b) for b in llm.tokenizer_info().token_bytes if b is not None)
    assert bound >= context * longest
    info = llm.tokenizer_info()
    widest = max((b for b in info.token_bytes if b is not None), key=len).decode("utf-8", "replace")
    fitting = (widest + " ") * (context // 4)
    assert len(llm.encode(fitting)) <= context and len(fitting) <= bound
    assert len("x" * (bound + 1)) > bound and len(llm.encode("x" * (bound + 1))) > context


# ---------------------------------------------------------------------------------------------- queue time
def test_a_request_that_cannot_reach_the_engine_in_time_is_503_with_retry_after(llm: Any) -> None:
    backend = EngineBackend(llm)  # never started: every request waits
    app = build_app(backend, manage_backend=False, limits=ServeLimits(max_queue_time=0.3))
    with running_server(app) as url:
        status, headers, text = post(url + "/completions", {"prompt": "What is 3 plus 4?", "max_tokens": 8})
    assert status == 503 and _error(text)["code"] == "queue_timeout", text
    assert int(headers["retry-after"]) >= 1
    assert backend.stats()["waiting"] == 0  # the timed-out request left the queue


def test_the_queue_time_limit_does_not_cut_a_request_that_already_runs(llm: Any) -> None:
    backend = EngineBackend(llm)
    with running_server(build_app(backend, limits=ServeLimits(max_queue_time=0.001))) as url:
        status, _, text = post(url + "/completions", {"prompt": "What is 3 plus 4?", "max_tokens": 32,
                                                      "guided_regex": "[0-9]+"})
    assert status == 200, text


# ---------------------------------------------------------------------------------------------- warnings
def test_unknown_schema_keywords_reach_the_client_in_a_header_and_the_body(llm: Any) -> None:
    typo = {"type": "object", "properties": {"name": {"type": "string", "maxLenght": 5}}, "required": ["name"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": typo}}
    with running_server(build_app(EngineBackend(llm))) as url:
        ask = {"messages": [{"role": "user", "content": "Name Ada."}], "max_tokens": 32, "response_format": fmt}
        status, headers, text = post(url + "/chat/completions", ask)
        assert status == 200, text
        header = json.loads(headers["x-constraint-warnings"])
        assert len(header) == 1 and "'maxLenght' at #/properties/name" in header[0]
        assert json.loads(text)["constraint_warnings"] == header
        status, headers, _ = post(url + "/chat/completions", {**ask, "stream": True})
        assert status == 200 and json.loads(headers["x-constraint-warnings"]) == header
        clean = {**ask, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}}
        status, headers, text = post(url + "/chat/completions", clean)
        assert status == 200 and "x-constraint-warnings" not in headers and "constraint_warnings" not in text


# ---------------------------------------------------------------------------------------------- shutdown
def test_a_draining_server_refuses_requests_and_reports_draining_on_health_with_503() -> None:
    import urllib.error
    import urllib.request

    drain = Drain()
    drain.begin()
    backend = InstantBackend()
    with running_server(build_app(backend, drain=drain)) as url:
        status, headers, text = post(url + "/completions", {"prompt": "x", "max_tokens": 8})
        assert status == 503 and _error(text)["code"] == "server_shutting_down" and "retry-after" in headers
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=WAIT)
        assert err.value.code == 503 and json.loads(err.value.read()) == {"status": "draining"}
    assert backend.requests == []


def test_shutdown_stops_running_requests_with_a_clear_error_within_its_bound() -> None:
    backend, drain = _HangingBackend(), Drain()
    plan = ShutdownPlan(shutdown_timeout=2.0)
    app = build_app(backend, drain=drain)
    server = make_server(app, backend=backend, drain=drain, plan=plan, host="127.0.0.1", port=free_port(),
                         log_level="warning")
    with running_server(app, server) as url, ThreadPoolExecutor(2) as pool:
        pending = pool.submit(post, url + "/completions", {"prompt": "x", "max_tokens": 8})
        deadline = time.monotonic() + WAIT
        while not backend.handles:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        began = time.monotonic()
        server.handle_exit(signal.SIGTERM, None)  # what uvicorn's signal handler calls
        status, _, text = pending.result(WAIT)
        took = time.monotonic() - began
    assert status == 503 and _error(text)["code"] == "request_aborted" and "shutting down" in _error(text)["message"]
    assert backend.drained.is_set() and drain.draining
    assert plan.abort_after - 0.2 <= took <= plan.shutdown_timeout + 5.0  # generous: a loaded machine


def test_sigterm_under_load_exits_within_the_shutdown_timeout_and_no_request_gets_a_500() -> None:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "dllm_constrain.serve", "--port", str(port), "--max-batch-size",
                             "1", "--shutdown-timeout", "3", "--log-level", "warning"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_until_up(url, proc)
        ask = {"prompt": "What is 3 plus 4?", "max_tokens": 192, "guided_regex": "[0-9]+( [0-9]+)*"}
        with ThreadPoolExecutor(24) as pool:  # one runs at a time: more than the timeout's worth of work
            answers = [pool.submit(_post_or_gone, url + "/completions", ask) for _ in range(24)]
            time.sleep(0.5)
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=WAIT)
            took = time.monotonic() - began
            statuses = [a.result(WAIT) for a in answers]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT)
    # uvicorn re-raises the signal it caught once it has shut down, so the exit status is SIGTERM's
    assert proc.returncode in (0, -signal.SIGTERM), proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    assert took < 3.0 + 3.0  # the timeout plus the interpreter's exit
    assert all(s in (200, 503, None) for s in statuses), statuses
    assert 503 in statuses  # some were stopped or refused: the drain did not wait for all of them


def _post_or_gone(url: str, body: dict[str, Any]) -> int | None:
    try:
        return post(url, body)[0]
    except OSError:  # the listener closed before this request connected
        return None


def _wait_until_up(url: str, proc: subprocess.Popen) -> None:
    import urllib.request

    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, "the server exited at start"
        assert time.monotonic() < deadline, "the server did not come up"
        try:
            with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=2):
                return
        except OSError:
            time.sleep(0.2)


def test_the_prompt_bound_counts_the_characters_of_chat_messages_together() -> None:
    """Messages handed to a checkpoint's own chat template are bounded by their contents, not by how many there are."""
    from dllm_constrain.errors import PromptTooLongError

    limits = ServeLimits(max_prompt_chars=100)
    limits.check_prompt([{"role": "user", "content": "x" * 60}, {"role": "assistant", "content": None}])
    with pytest.raises(PromptTooLongError):
        limits.check_prompt([{"role": "system", "content": "x" * 60}, {"role": "user", "content": "y" * 41}])
