"""Shared by the server's test modules: an in-process server on a free 127.0.0.1 port that stops by itself."""
from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import uvicorn

from dllm_constrain.serve.backend import Completion, Done, GenerationRequest, RequestHandle

WAIT = 30.0  # bound on every wait of the server tests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(app: Any, server: uvicorn.Server | None = None, *, wait: float = WAIT) -> Iterator[str]:
    """Serve `app` (or run `server`, already configured) in a background thread; yields the base URL (…/v1);
    stops the server at exit. Starting and stopping are each bounded by `wait` seconds."""
    if server is None:
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning",
                                               timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + wait
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}/v1"
    finally:
        server.should_exit = True
        thread.join(wait)
        assert not thread.is_alive(), "the server did not stop"


class InstantBackend:
    """Answers every request at once with "7" and remembers what it was asked (no model)."""

    model_id = "instant"

    def __init__(self) -> None:
        self.requests: list[GenerationRequest] = []

    def start(self) -> None:
        pass

    def close(self, timeout: float = 10.0) -> None:
        pass

    def submit(self, request: GenerationRequest) -> RequestHandle:
        self.requests.append(request)
        handle = RequestHandle(f"i-{len(self.requests)}", request, asyncio.get_running_loop())
        result = SimpleNamespace(nfe=0, forced_tokens=0, remasks=0, backtracks=0, steps=0, tokens_per_forward=0.0,
                                 wall_time=0.0, finish_reason="eos")
        handle.publish(Done(Completion("7", "stop", 1, 1, result)))  # type: ignore[arg-type]
        return handle


def post(url: str, body: bytes | dict | None, *, headers: dict[str, str] | None = None, chunked: bool = False,
         timeout: float = WAIT) -> tuple[int, dict[str, str], str]:
    """POST to `url` (a full URL) with the standard library: (status, headers lower-cased, body text). A dict body
    is sent as JSON; `chunked` sends the body with chunked transfer encoding (no Content-Length)."""
    import http.client
    import json
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    raw = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")
    send_headers = {"Content-Type": "application/json"} if isinstance(body, dict) else {}
    send_headers.update(headers or {})
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        if chunked:
            def pieces() -> Iterator[bytes]:
                for i in range(0, len(raw), 1 << 16):
                    yield raw[i:i + (1 << 16)]
            conn.request("POST", parts.path, body=pieces(), headers=send_headers, encode_chunked=True)
        else:
            conn.request("POST", parts.path, body=raw, headers=send_headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()
