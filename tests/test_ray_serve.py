"""Replicas of the server on Ray Serve (dllm_constrain.serve.ray_serve), driven by the official `openai` client.

The cluster tests (marker `ray`, run by `.ci/run`'s Ray stage: `python -m pytest -m ray tests/test_ray_serve.py`)
start a local Ray instance on 127.0.0.1 with 2 CPUs and 2 replicas of the bundled model behind Ray's proxy on a
free port, and stop it at the end of the module; every wait is bounded. The backend's health check and the
command line are tested without a cluster. Without Ray the module's Ray tests skip, unless
DLLM_CONSTRAIN_REQUIRE_RAY=1 (CI) makes that a failure.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

jsonschema = pytest.importorskip("jsonschema")
openai = pytest.importorskip("openai", reason="the tests drive the server with the openai client")
pytest.importorskip("fastapi", reason="the server needs fastapi")

from dllm_constrain.serve.backend import EngineBackend, GenerationRequest  # noqa: E402
from dllm_constrain.serve import ray_proxy  # noqa: E402
from dllm_constrain.serve.errors import EngineUnhealthyError  # noqa: E402

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
ASK = "Create a record with name Ada Lovelace; age 36."
MODEL = "dllm-constrain-bundled"
WAIT = 120.0  # bound on every request in this module (2 replicas share 2 loaded cores)


def _ray_serve() -> Any:
    """The module under test, or a skip (a failure under DLLM_CONSTRAIN_REQUIRE_RAY=1) when Ray is missing."""
    try:
        from dllm_constrain.serve import ray_serve
    except ImportError as exc:
        if os.environ.get("DLLM_CONSTRAIN_REQUIRE_RAY") == "1":
            raise
        pytest.skip(f"Ray Serve is not importable ({exc}); pip install 'dllm-constrain[ray]'")
    return ray_serve


# ---------------------------------------------------------------------------------------------- health (no Ray)
class _StillCall:
    """An engine call that never ends by itself (what a wedged engine step looks like from the backend)."""

    def __init__(self) -> None:
        self.future: concurrent.futures.Future = concurrent.futures.Future()

    def abort(self) -> None:
        self.future.set_exception(RuntimeError("aborted"))


class _StillLLM:
    """Accepts requests and keeps their progress callbacks, so a test decides when the engine steps."""

    def __init__(self) -> None:
        self.progress: list[Any] = []

    def submit(self, prompt: str, *, on_stream: Any, progress: Any, **options: Any) -> _StillCall:
        self.progress.append(progress)
        return _StillCall()


def test_backend_is_unhealthy_until_started_and_once_closing() -> None:
    backend = EngineBackend(_StillLLM())
    with pytest.raises(EngineUnhealthyError, match="not serving"):
        backend.check_health(stall_timeout=60)
    backend.start()
    backend.check_health(stall_timeout=60)  # idle and started: healthy
    backend.close(timeout=1)
    with pytest.raises(EngineUnhealthyError, match="not serving"):
        backend.check_health(stall_timeout=60)


def test_backend_is_unhealthy_when_its_engine_makes_no_step_with_requests_in_it() -> None:
    llm = _StillLLM()
    backend = EngineBackend(llm)
    backend.start()

    async def scenario() -> None:
        backend.submit(GenerationRequest(prompt="x"))
        time.sleep(0.3)
        with pytest.raises(EngineUnhealthyError, match="no step for"):
            backend.check_health(stall_timeout=0.1)
        [progress] = llm.progress
        progress(type("Step", (), {"snapshots": ()})())  # the engine stepped the request
        backend.check_health(stall_timeout=0.1)

    asyncio.run(scenario())
    backend.close(timeout=1)


# ---------------------------------------------------------------------------------------------- the proxy's middleware
def _through_middleware(app: Any) -> list[dict[str, Any]]:
    """The ASGI messages a client gets from `app` behind ReplicaLossMiddleware."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(ray_proxy.ReplicaLossMiddleware(app)({"type": "http"}, receive, send))
    return sent


def test_a_request_the_proxy_left_unanswered_gets_a_503_openai_error() -> None:
    async def replica_died(scope: Any, receive: Any, send: Any) -> None:
        return None  # what Ray's proxy does for a request whose replica died

    start, body = _through_middleware(replica_died)
    assert start["status"] == 503 and (b"retry-after", b"1") in start["headers"]
    assert json.loads(body["body"]) == {"error": ray_proxy.REPLICA_LOST}


def test_a_stream_the_proxy_cut_short_ends_with_an_error_event() -> None:
    async def cut_stream(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        await send({"type": "http.response.body", "body": b'data: {"choices": []}\n\n', "more_body": True})

    *_, last = _through_middleware(cut_stream)
    assert last["more_body"] is False
    assert json.loads(last["body"].decode().removeprefix("data: ")) == {"error": ray_proxy.REPLICA_LOST}


def test_finished_responses_pass_the_middleware_unchanged() -> None:
    messages = [{"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"application/json")]},
                {"type": "http.response.body", "body": b'{"error": {}}', "more_body": False}]

    async def answered(scope: Any, receive: Any, send: Any) -> None:
        for message in messages:
            await send(message)

    assert _through_middleware(answered) == messages


# ---------------------------------------------------------------------------------------------- command line
def test_command_line_takes_the_servers_options_and_rays() -> None:
    from dllm_constrain.serve.ray_cli import parse_args

    _ray_serve()
    server, policy, ray_init = parse_args(["--replicas", "3", "--port", "9123", "--max-batch-size", "4",
                                           "--num-cpus-per-replica", "2", "--ray-address", "auto"])
    assert (server.port, server.max_batch_size, server.host) == (9123, 4, "127.0.0.1")
    options = policy.deployment_options(server)
    assert options["num_replicas"] == 3 and "autoscaling_config" not in options
    assert options["max_ongoing_requests"] == 8  # two batches per replica by default
    assert options["ray_actor_options"] == {"num_cpus": 2.0, "num_gpus": 0.0}
    assert options["graceful_shutdown_timeout_s"] == server.shutdown_timeout  # the server's own bound
    assert ray_init == {"address": "auto"}


def test_command_line_autoscaling_bounds_become_rays_autoscaling_config() -> None:
    from dllm_constrain.serve.ray_cli import parse_args

    _ray_serve()
    server, policy, _ = parse_args(["--min-replicas", "1", "--max-replicas", "4", "--target-ongoing-requests", "6"])
    options = policy.deployment_options(server)
    assert "num_replicas" not in options
    assert options["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "initial_replicas": 1,
                                             "target_ongoing_requests": 6.0}


def test_command_line_refuses_inconsistent_replica_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    from dllm_constrain.serve.ray_cli import parse_args

    _ray_serve()
    with pytest.raises(SystemExit):
        parse_args(["--min-replicas", "3", "--max-replicas", "2"])
    assert "max_replicas must be" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- the cluster
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.ray
def test_the_command_serves_a_replica_and_stops_on_sigterm() -> None:
    """`python -m dllm_constrain.serve.ray` end to end: up, answering, and gone (exit 0) after SIGTERM. Runs
    before the module's cluster exists (a Ray instance of its own, in its own process)."""
    _ray_serve()
    port = _free_port()
    command = [sys.executable, "-m", "dllm_constrain.serve.ray", "--replicas", "1", "--ray-num-cpus", "1",
               "--port", str(port), "--max-batch-size", "2", "--log-level", "warning"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=os.environ | {"RAY_USAGE_STATS_ENABLED": "0"}, start_new_session=True)
    try:
        deadline = time.monotonic() + WAIT
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith("serving 1 replica(s) at"):
                break
            assert time.monotonic() < deadline, "the command did not come up"
        else:
            pytest.fail(f"the command exited with {proc.wait()}")
        text, finish = _ask(_client(f"http://127.0.0.1:{port}/v1"), 0, stream=False)
        jsonschema.validate(json.loads(text), PERSON)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def replicas() -> Iterator[str]:
    """2 replicas of the bundled model on a local Ray instance (2 CPUs, 127.0.0.1); yields the /v1 URL."""
    ray_serve = _ray_serve()
    from dllm_constrain.serve.__main__ import parse_args

    os.environ.setdefault(ray_proxy.CALLBACK_ENV, ray_proxy.CALLBACK_PATH)  # RayServeRunner sets it too

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    server = parse_args(["--host", "127.0.0.1", "--port", str(_free_port()), "--max-batch-size", "4",
                         "--log-level", "warning"])
    runner = ray_serve.RayServeRunner(
        server, ray_serve.ReplicaPolicy(replicas=2, health_check_period_s=2.0, graceful_shutdown_timeout_s=60.0),
        ray_address="local",
        ray_init={"num_cpus": 2, "_node_ip_address": "127.0.0.1", "_temp_dir": tempfile.mkdtemp(prefix="ray")})
    runner.start()
    try:
        yield runner.url
    finally:
        runner.stop()


def _client(url: str) -> Any:
    return openai.OpenAI(base_url=url, api_key="x", timeout=WAIT, max_retries=0)


def _ask(client: Any, seed: int, *, stream: bool, max_tokens: int = 48) -> tuple[str, str | None]:
    """(text, finish_reason) of one json_schema chat request, streamed or not."""
    kw = {"model": MODEL, "messages": [{"role": "user", "content": ASK}], "seed": seed, "max_tokens": max_tokens,
          "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}}
    if not stream:
        reply = client.chat.completions.create(**kw)
        return reply.choices[0].message.content, reply.choices[0].finish_reason
    text, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


@pytest.mark.ray
def test_replicas_answer_concurrent_json_schema_requests_streamed_and_not(replicas: str) -> None:
    client = _client(replicas)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: _ask(client, i, stream=i % 2 == 1), range(8)))
    for text, finish in answers:
        assert finish == "stop"
        jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.ray
def test_models_route_and_openai_errors_pass_through_the_proxy(replicas: str) -> None:
    client = _client(replicas)
    assert [m.id for m in client.models.list().data] == [MODEL]
    with pytest.raises(openai.BadRequestError, match="unknown type 'nope'") as refused:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK}],
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "x", "schema": {"type": "nope"}}})
    assert refused.value.code == "invalid_schema"


def _kill_one_replica() -> str:
    import ray

    names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                   if a["name"].startswith("SERVE_REPLICA::"))
    assert len(names) == 2, names
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
    return names[0]


@pytest.mark.ray
def test_a_replica_killed_mid_load_fails_its_requests_with_an_error_while_the_other_answers(replicas: str) -> None:
    """24 long requests, streamed and not, spread over both replicas; one replica is killed once the first answer
    is back (both still have requests in flight). Each request ends within the bound: a schema-valid answer, or
    an OpenAI error saying the replica is gone (503 replica_unavailable before the response started, an error
    event in a stream that had started). The surviving replica keeps answering, and the deployment recovers."""
    client = _client(replicas)
    first_done = threading.Event()
    killed_at: list[float] = []

    def ask(i: int) -> tuple[str, Any, float]:
        try:
            text, finish = _ask(client, i, stream=i % 3 == 0, max_tokens=768)
            assert finish is not None, "a stream ended without its last chunk"
            jsonschema.validate(json.loads(text), PERSON)
            return "ok", finish, time.monotonic()
        except openai.APIStatusError as exc:
            return "refused", (exc.status_code, exc.code, exc.message), time.monotonic()
        except openai.APIError as exc:  # an error event in a stream
            return "stream error", ("stream", exc.code, exc.message), time.monotonic()
        finally:
            first_done.set()

    with ThreadPoolExecutor(24) as pool:
        futures = [pool.submit(ask, i) for i in range(24)]
        assert first_done.wait(WAIT), "no request finished"
        _kill_one_replica()
        killed_at.append(time.monotonic())
        outcomes = [f.result(timeout=WAIT) for f in futures]
    failures = [detail for kind, detail, _ in outcomes if kind != "ok"]
    assert failures, "the killed replica had requests in flight: they must fail, not vanish"
    for status, code, message in failures:
        assert status in (503, "stream") and code == "replica_unavailable", (status, code, message)
        assert ray_proxy.REPLICA_LOST["message"] in message
    assert any(kind == "ok" and at > killed_at[0] for kind, _, at in outcomes), "the other replica stopped"
    for i in range(2):  # afterwards every request is answered (by the survivor or the replacement)
        text, finish = _ask(client, 100 + i, stream=i == 1)
        jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.ray
def test_deleting_the_application_lets_requests_in_flight_finish(replicas: str) -> None:
    """Graceful shutdown: replicas stopped with requests in them (Ray's graceful_shutdown_timeout_s) answer them
    first, then close their engines; new requests are no longer routed. Last in the module: it takes the app away."""
    from ray import serve

    from dllm_constrain.serve.ray_serve import APP_NAME

    client = _client(replicas)
    started = threading.Event()

    def ask(i: int) -> tuple[str, str | None, float]:
        started.set()
        return *_ask(client, 200 + i, stream=i % 2 == 1, max_tokens=768), time.monotonic()

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(ask, i) for i in range(4)]
        assert started.wait(WAIT)
        time.sleep(0.5)  # the requests reach their replicas
        deleting_at = time.monotonic()
        serve.delete(APP_NAME)  # returns once the replicas have drained and stopped
        answers = [f.result(timeout=WAIT) for f in futures]
    assert any(at > deleting_at for *_, at in answers), "no request was in flight when the replicas stopped"
    for text, finish, _ in answers:
        assert finish == "stop"
        jsonschema.validate(json.loads(text), PERSON)
    with pytest.raises(openai.NotFoundError):  # no application behind the proxy any more
        client.models.list()
