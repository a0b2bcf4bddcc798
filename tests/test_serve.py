"""The OpenAI-compatible server (dllm_constrain.serve), driven by the official `openai` client over real HTTP.

Servers run in-process (uvicorn in a background thread on a free 127.0.0.1 port, stopped with should_exit) on
the bundled model with small canvases, so the module takes seconds. Pure pieces (committed-prefix text, chat
templates, the worker's queue) are tested without HTTP.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs fastapi (pip install fastapi uvicorn openai)")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install fastapi uvicorn openai)")
openai = pytest.importorskip("openai", reason="the server tests drive it with the openai client (pip install openai)")
jsonschema = pytest.importorskip("jsonschema")

from dllm_constrain.serve.app import build_app  # noqa: E402
from dllm_constrain.engine.state import OutputConstraint  # noqa: E402
from dllm_constrain.serve.backend import (  # noqa: E402
    EngineBackend,
    GenerationRequest,
    RequestHandle,
)
from dllm_constrain.serve.chat import ChatFormatter  # noqa: E402
from dllm_constrain.serve.streaming import CommittedText  # noqa: E402
from serve_support import running_server  # noqa: E402

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
ASK = "Create a record with name Ada Lovelace; age 36."
WAIT = 30.0  # bound on every wait in this module


# ---------------------------------------------------------------------------------------------- fixtures
def _client(base_url: str) -> Any:
    return openai.OpenAI(base_url=base_url, api_key="x", timeout=WAIT, max_retries=0)


@pytest.fixture(scope="module")
def llm() -> Any:
    import dllm_constrain as dc

    return dc.LLM()


@pytest.fixture(scope="module")
def spare_llm() -> Any:
    """A second copy for servers with special settings: an engine is owned by one worker thread at a time."""
    import dllm_constrain as dc

    return dc.LLM()


@pytest.fixture(scope="module")
def served(llm: Any) -> Iterator[tuple[Any, str]]:
    backend = EngineBackend(llm)
    with running_server(build_app(backend, chat=ChatFormatter.for_llm(llm), request_timeout=WAIT)) as url:
        yield _client(url), backend.model_id


def _chat(client: Any, model: str, **kw: Any) -> Any:
    kw.setdefault("messages", [{"role": "user", "content": ASK}])
    kw.setdefault("max_tokens", 48)
    return client.chat.completions.create(model=model, **kw)


def _schema_format(schema: Any, strict: bool | None = True) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "answer", "schema": schema}
    if strict is not None:
        spec["strict"] = strict
    return {"type": "json_schema", "json_schema": spec}


def _stream_text(stream: Any) -> tuple[str, str | None, Any]:
    """(concatenated content, the finish_reason, the usage chunk's usage) of a chat stream."""
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            assert finish is None, "content after the finishing chunk"
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish, usage


# ---------------------------------------------------------------------------------------------- over HTTP
def test_models_lists_the_served_model(served: tuple[Any, str]) -> None:
    client, model = served
    assert [m.id for m in client.models.list().data] == [model]
    with pytest.raises(openai.NotFoundError):
        _chat(client, "no-such-model")


def test_chat_json_schema_is_schema_valid_with_usage_counters(served: tuple[Any, str]) -> None:
    client, model = served
    resp = _chat(client, model, response_format=_schema_format(PERSON))
    choice = resp.choices[0]
    jsonschema.validate(json.loads(choice.message.content), PERSON)
    assert choice.finish_reason == "stop" and resp.object == "chat.completion" and resp.model == model
    u = resp.usage
    assert u.prompt_tokens > 0 and u.completion_tokens > 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens
    stats = u.model_extra["dllm"]
    assert stats["nfe"] >= 1 and {"forced_tokens", "remasks", "backtracks"} <= stats.keys()


def test_stream_equals_non_stream_for_a_seed(served: tuple[Any, str]) -> None:
    client, model = served
    kw = dict(response_format=_schema_format(PERSON), temperature=0.8, seed=7)
    whole = _chat(client, model, **kw)
    text, finish, usage = _stream_text(_chat(client, model, stream=True, stream_options={"include_usage": True},
                                             **kw))
    assert text == whole.choices[0].message.content and finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object_gives_a_json_object(served: tuple[Any, str]) -> None:
    client, model = served
    resp = _chat(client, model, response_format={"type": "json_object"})
    assert isinstance(json.loads(resp.choices[0].message.content), dict)


@pytest.mark.parametrize("extra", [{"structured_outputs": {"regex": r"[0-9]+\."}}, {"guided_regex": r"[0-9]+\."},
                                   {"guided_choice": ["7.", "8."]}])
def test_regex_through_extra_body(served: tuple[Any, str], extra: dict[str, Any]) -> None:
    client, model = served
    resp = client.completions.create(model=model, prompt="What is 3 plus 4?", max_tokens=16, extra_body=extra)
    text = resp.choices[0].text
    assert text[:-1].isdigit() and text.endswith(".")
    if "guided_choice" in extra:
        assert text in ("7.", "8.")


def test_shipped_grammar_through_structured_outputs(served: tuple[Any, str]) -> None:
    client, model = served
    resp = _chat(client, model, messages=[{"role": "user", "content": "What is 3 plus 4?"}], max_tokens=16,
                 extra_body={"structured_outputs": {"grammar": "arithmetic"}})
    text = resp.choices[0].message.content
    assert text and set(text) <= set("0123456789+-*/() .")


def test_stop_string_cuts_streamed_and_whole_alike(served: tuple[Any, str]) -> None:
    client, model = served
    kw = dict(response_format=_schema_format(PERSON), stop=[","])
    whole = _chat(client, model, **kw)
    assert "," not in whole.choices[0].message.content and whole.choices[0].finish_reason == "stop"
    text, finish, _ = _stream_text(_chat(client, model, stream=True, **kw))
    assert (text, finish) == (whole.choices[0].message.content, "stop")


def test_bad_schema_is_400_with_our_message(served: tuple[Any, str]) -> None:
    client, model = served
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as err:
            _chat(client, model, response_format=_schema_format({"type": "foo"}), stream=stream)
        body = err.value.body
        assert "unknown type 'foo'" in body["message"]
        assert (body["code"], body["param"], body["type"]) == ("invalid_schema", "response_format",
                                                               "invalid_request_error")


def test_canvas_too_short_is_400(served: tuple[Any, str]) -> None:
    client, model = served
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as err:
            _chat(client, model, response_format=_schema_format(PERSON), max_tokens=3, stream=stream)
        assert (err.value.body["code"], err.value.body["param"]) == ("constraint_too_long", "max_tokens")
        assert "max_new_tokens is 3" in err.value.body["message"]


@pytest.mark.parametrize("kw, param", [
    ({"n": 2}, "n"),
    ({"extra_body": {"guided_regex": "a", "guided_json": {"type": "object"}}}, "guided_regex"),
    ({"extra_body": {"structured_outputs": {"whitespace_pattern": " "}}}, "structured_outputs.whitespace_pattern"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"extra_body": {"guided_grammar": "start: foo"}}, "guided_grammar"),
    ({"extra_body": {"guided_json": "{not json"}}, "guided_json"),  # the library's InvalidSchemaError
    ({"extra_body": {"structured_outputs": {"json": '{"type": "foo"}'}}}, "structured_outputs.json"),
])
def test_unsupported_or_bad_fields_are_400_naming_them(served: tuple[Any, str], kw: dict[str, Any],
                                                       param: str) -> None:
    client, model = served
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, model, **kw)
    assert err.value.body["param"] == param


def test_sixteen_concurrent_clients_get_schema_valid_answers(served: tuple[Any, str]) -> None:
    client, model = served
    kinds = [{"type": "integer", "minimum": 0, "maximum": 99}, {"type": "string", "maxLength": 8},
             {"type": "boolean"}, {"enum": ["red", "green", "blue"]}]
    schemas = [{"type": "object", "properties": {f"k{i}": kinds[i % 4]}, "required": [f"k{i}"]} for i in range(16)]

    def ask(i: int) -> tuple[str, Any]:
        kw = dict(response_format=_schema_format(schemas[i]), max_tokens=24)
        if i % 2:
            return _stream_text(_chat(client, model, stream=True, **kw))[0], schemas[i]
        return _chat(client, model, **kw).choices[0].message.content, schemas[i]

    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(16)))
    for text, schema in answers:
        jsonschema.validate(json.loads(text), schema)
    assert time.monotonic() - t0 < 4 * WAIT


class _GatedLLM:
    """An LLM whose requests wait for a gate at their first engine step: holds the engine loop busy for as long as a
    test needs (the backend submits each request through `LLM.submit` and follows it with its progress events)."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm
        self.gate = threading.Event()
        self.outcomes: list[str] = []  # "ok" or the exception class name, per request, in the order they ended
        self.step_gate: threading.Event | None = None  # when set: every step after the first waits for it

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        progress, steps = kwargs.get("progress"), []

        def gated_progress(event: Any) -> None:
            if not steps:
                assert self.gate.wait(WAIT)
            elif self.step_gate is not None:
                assert self.step_gate.wait(WAIT)
            steps.append(event.step)
            if progress is not None:
                progress(event)

        kwargs["progress"] = gated_progress
        handle = self._llm.submit(*args, **kwargs)

        def record(future: Any) -> None:
            exc = future.exception()
            self.outcomes.append("ok" if exc is None else type(exc).__name__)

        handle.future.add_done_callback(record)
        return handle


STOPPED = ("_RequestStopped", "GenerationAbortedError")  # how a request removed from the engine ends


def _wait_for(predicate: Any) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def single_slot_llm() -> Any:
    """An LLM whose engine runs one request at a time: the scheduler's limit is the server's one admission limit."""
    import dllm_constrain as dc

    return dc.LLM(max_num_seqs=1)


def test_full_queue_is_429(single_slot_llm: Any) -> None:
    gated = _GatedLLM(single_slot_llm)
    backend = EngineBackend(gated, max_queue=1)
    with running_server(build_app(backend, request_timeout=WAIT)) as url:
        client = _client(url)

        def ask() -> str:
            return client.completions.create(model=backend.model_id, prompt="What is 3 plus 4?", max_tokens=8,
                                             extra_body={"guided_regex": "[0-9]+"}).choices[0].text

        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(ask)
            _wait_for(lambda: backend.stats()["running"] == 1)
            waiting = pool.submit(ask)
            _wait_for(lambda: backend.stats()["waiting"] == 1)
            with pytest.raises(openai.RateLimitError) as err:
                ask()
            assert err.value.body["code"] == "queue_full" and err.value.response.headers["retry-after"] == "1"
            gated.gate.set()
            assert running.result(WAIT).isdigit() and waiting.result(WAIT).isdigit()


def test_a_drain_fails_the_requests_the_scheduler_has_not_admitted_and_lets_the_running_one_finish(
        single_slot_llm: Any) -> None:
    from dllm_constrain.serve.errors import ServerDrainingError

    async def scenario() -> None:
        gated = _GatedLLM(single_slot_llm)
        backend = EngineBackend(gated)
        backend.start()
        digits = OutputConstraint(regex="[0-9]+")
        try:
            running = backend.submit(GenerationRequest("What is 3 plus 4?", digits, 8))
            waiting = backend.submit(GenerationRequest("What is 3 plus 5?", digits, 8))
            assert backend.stats() == {"waiting": 1, "running": 1, "aborted": 0}  # one slot in the engine
            backend.drain()
            gated.gate.set()
            with pytest.raises(ServerDrainingError):
                await asyncio.wait_for(waiting.result(), WAIT)
            assert (await asyncio.wait_for(running.result(), WAIT)).text.isdigit()
        finally:
            gated.gate.set()
            backend.close()

    asyncio.run(scenario())


def test_client_disconnect_stops_the_running_request(spare_llm: Any) -> None:
    """A client that gives up is noticed while its request runs; the request leaves the engine at its next step."""
    gated = _GatedLLM(spare_llm)
    backend = EngineBackend(gated)
    with running_server(build_app(backend)) as url:
        impatient = openai.OpenAI(base_url=url, api_key="x", timeout=0.5, max_retries=0)
        with pytest.raises(openai.APITimeoutError):
            impatient.completions.create(model=backend.model_id, prompt="What is 3 plus 4?", max_tokens=64)
        _wait_for(lambda: backend.stats()["aborted"] == 1)
        gated.gate.set()
        _wait_for(lambda: backend.stats()["running"] == 0)
    assert len(gated.outcomes) == 1 and gated.outcomes[0] in STOPPED


def test_client_leaving_a_stream_stops_its_request(spare_llm: Any) -> None:
    gated = _GatedLLM(spare_llm)
    gated.gate.set()
    gated.step_gate = threading.Event()
    backend = EngineBackend(gated)
    with running_server(build_app(backend)) as url:
        stream = _client(url).chat.completions.create(
            model=backend.model_id, messages=[{"role": "user", "content": ASK}], max_tokens=64, stream=True)
        first = next(iter(stream))  # the role chunk: the request started and runs its second step
        assert first.choices[0].delta.role == "assistant"
        stream.close()
        _wait_for(lambda: backend.stats()["aborted"] == 1)
        gated.step_gate.set()
        _wait_for(lambda: backend.stats()["running"] == 0)
    assert len(gated.outcomes) == 1 and gated.outcomes[0] in STOPPED


class _SilentBackend:
    """A backend that accepts requests and never answers (to test the server's timeout alone)."""

    model_id = "silent"

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def submit(self, request: GenerationRequest) -> RequestHandle:
        return RequestHandle("silent-1", request, asyncio.get_running_loop())


def test_request_timeout_is_504_with_an_openai_error_body() -> None:
    with running_server(build_app(_SilentBackend(), request_timeout=0.3)) as url:
        for stream in (False, True):
            with pytest.raises(openai.InternalServerError) as err:
                _chat(_client(url), "silent", stream=stream)
            assert err.value.status_code == 504 and err.value.body["code"] == "request_timeout"


class _ConstraintTimeoutBackend(_SilentBackend):
    """A backend whose requests start, then end with the library's ConstraintTimeoutError (a constraint call ran
    past its per-call limit mid-generation)."""

    model_id = "timeout"

    def submit(self, request: GenerationRequest) -> RequestHandle:
        from dllm_constrain.errors import ConstraintTimeoutError
        from dllm_constrain.serve.backend import Failed, Started

        handle = RequestHandle("timeout-1", request, asyncio.get_running_loop())
        handle.publish(Started())
        handle.publish(Failed(ConstraintTimeoutError(kind="json_schema", operation="allowed_tokens",
                                                     timeout_s=0.5)))
        return handle


def test_constraint_timeout_is_504_or_an_error_event() -> None:
    with running_server(build_app(_ConstraintTimeoutBackend(), request_timeout=WAIT)) as url:
        with pytest.raises(openai.InternalServerError) as err:
            _chat(_client(url), "timeout", response_format=_schema_format(PERSON))
        assert err.value.status_code == 504
        assert (err.value.body["code"], err.value.body["type"], err.value.body["param"]) == (
            "constraint_timeout", "timeout_error", "response_format")
        assert "allowed_tokens exceeded its time limit of 0.5 s" in err.value.body["message"]
        stream = _chat(_client(url), "timeout", response_format=_schema_format(PERSON), stream=True)
        with pytest.raises(openai.APIError) as err:  # the stream had started: an error event, no [DONE]
            list(stream)
        assert err.value.body["code"] == "constraint_timeout"


def test_unknown_route_and_method_get_openai_error_bodies() -> None:
    import urllib.error
    import urllib.request

    with running_server(build_app(_SilentBackend())) as url:
        for path, status in [("/no-such-route", 404), ("/chat/completions", 405)]:  # GET on a POST route: 405
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(url + path, timeout=WAIT)
            body = json.loads(err.value.read())
            assert err.value.code == status and set(body["error"]) == {"message", "type", "param", "code"}


# ---------------------------------------------------------------------------------------------- the worker
def test_worker_skips_aborted_and_expired_requests(spare_llm: Any) -> None:
    """Requests dropped while waiting never reach the engine; the live one still gets its answer."""
    async def scenario() -> None:
        backend = EngineBackend(spare_llm)  # not started yet: everything waits
        gone = backend.submit(GenerationRequest("What is 3 plus 4?", OutputConstraint(regex="[0-9]+"), 8))
        late = backend.submit(GenerationRequest("What is 3 plus 4?", OutputConstraint(regex="[0-9]+"), 8,
                                                timeout=0.0))
        live = backend.submit(GenerationRequest("What is 3 plus 4?", OutputConstraint(regex="[0-9]+"), 8))
        gone.abort()
        assert backend.stats()["waiting"] == 2
        backend.start()
        try:
            done = await asyncio.wait_for(live.result(), WAIT)
            assert done.text.isdigit()
            _wait_for(lambda: backend.stats() == {"waiting": 0, "running": 0, "aborted": 1})
            assert late._queue.empty() and gone._queue.empty()  # neither ran nor got an answer
        finally:
            backend.close()

    asyncio.run(scenario())


def test_worker_runs_requests_with_different_constraints_together_and_isolates_a_bad_prompt(
        spare_llm: Any) -> None:
    """Requests with different constraints each go into the engine's continuous batch (one call each); a prompt
    the engine refuses fails alone."""
    from dllm_constrain.errors import PromptTooLongError

    async def scenario() -> None:
        gated = _GatedLLM(spare_llm)
        gated.gate.set()
        backend = EngineBackend(gated)
        digits = OutputConstraint(regex="[0-9]+")
        same = [backend.submit(GenerationRequest(f"What is {i} plus 4?", digits, 8)) for i in range(3)]
        other = backend.submit(GenerationRequest("What is 3 plus 4?", OutputConstraint(regex="[0-9]+\\."), 8))
        backend.start()
        try:
            answers = [await asyncio.wait_for(h.result(), WAIT) for h in (*same, other)]
            assert all(a.text.rstrip(".").isdigit() for a in answers) and answers[-1].text.endswith(".")
            _wait_for(lambda: len(gated.outcomes) == 4)
            assert gated.outcomes == ["ok"] * 4
        finally:
            backend.close()
        gated.outcomes.clear()
        backend = EngineBackend(gated)
        good = backend.submit(GenerationRequest("What is 3 plus 4?", digits, 8))
        bad = backend.submit(GenerationRequest("word " * 5000, digits, 8))
        backend.start()
        try:
            assert (await asyncio.wait_for(good.result(), WAIT)).text.isdigit()
            with pytest.raises(PromptTooLongError):
                await asyncio.wait_for(bad.result(), WAIT)
            _wait_for(lambda: len(gated.outcomes) == 2)
            assert sorted(gated.outcomes) == ["PromptTooLongError", "ok"]
        finally:
            backend.close()

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------------- pure pieces
def test_command_line_options() -> None:
    from dllm_constrain.serve.__main__ import parse_args

    args = parse_args(["--port", "9000", "--max-queue", "2", "--request-timeout", "5"])
    assert (args.host, args.port, args.max_queue, args.request_timeout, args.model) == ("127.0.0.1", 9000, 2, 5.0,
                                                                                        None)
    with pytest.raises(SystemExit):
        parse_args(["--max-queue", "-1"])
    assert parse_args(["--kv-cache-memory", "4GiB"]).kv_cache_memory == 4 << 30
    with pytest.raises(SystemExit):
        parse_args(["--kv-cache-memory", "lots"])


def test_a_request_is_encoded_once_and_its_usage_counts_those_ids(served: tuple[Any, str], llm: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    client, model = served
    encoded: list[Any] = []
    prompt_ids = llm.prompt_ids
    monkeypatch.setattr(llm, "prompt_ids", lambda p, schema=None: encoded.append(p) or prompt_ids(p, schema))
    resp = _chat(client, model, max_tokens=8, extra_body={"guided_regex": "[0-9]+"})
    assert len(encoded) == 1 and resp.usage.prompt_tokens == len(prompt_ids(encoded[0]))


def test_committed_text_holds_back_partial_characters_and_stop_prefixes() -> None:
    t = CommittedText(stop=["END"])
    assert t.advance("caf\ufffd") == "caf"  # the rest of 'é' is not committed yet
    assert t.advance("café E") == "é "  # 'E' may start the stop string
    assert t.advance("café EN") == ""
    assert t.advance("café ENX") == "ENX"
    assert t.advance("café ENX and END more") == " and "
    assert t.stopped and t.advance("café ENX and END more!") == ""
    assert t.finish("café ENX and END more!!") == ("café ENX and ", "", True)
    plain = CommittedText()
    assert plain.advance("ab") == "ab" and plain.finish("abc") == ("abc", "c", False)


def test_chat_template_from_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": {"content": "</s>"},
        "chat_template": "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}"
                         "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"}))

    class Tok:
        def token_to_id(self, token: str) -> int | None:
            return {"<s>": 0}.get(token)

    class FakeLLM:
        path, prompt_format, tokenizer = tmp_path, "raw", Tok()

        def encode(self, text: str) -> list[int]:
            return [0, 9]  # the tokenizer adds BOS itself

    fmt = ChatFormatter.for_llm(FakeLLM())
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert fmt.render(msgs) == "<system>Be brief.</s><user>Hi</s><assistant>"
    joined = ChatFormatter()
    assert joined.render(msgs + [{"role": "user", "content": "there"}]) == "Hi\nthere"


def test_starting_the_backend_prepares_the_tokenizer_tables(spare_llm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from dllm_constrain.constraints import TokenizerInfo

    prepared: list[TokenizerInfo] = []
    monkeypatch.setattr(TokenizerInfo, "prepare", lambda self: prepared.append(self) or self)
    backend = EngineBackend(spare_llm)
    backend.start()
    backend.close()
    assert prepared == [spare_llm.tokenizer_info()]
