"""Which HTTP requests reach the routes at all: an ASGI guard in front of the app.

It answers, before any route code runs and before the body is read in full:
- 503 `server_shutting_down` (with Retry-After) once the server drains for shutdown (`Drain.begin`);
- 415 `unsupported_media_type` for a POST body declared as anything but JSON (`text/plain`, a form, ...); a body
  without a Content-Type is read as JSON, as curl users expect;
- 413 `payload_too_large` for a body over the limit, from its Content-Length or, for a chunked body, as soon as
  the bytes read pass it.
Bodies within the limit are read once and replayed to the app; what the client sends after (its disconnect) still
reaches the app, which watches for it.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from dllm_constrain.serve.errors import PayloadTooLarge, ServeError, ServerDrainingError, UnsupportedMediaType, \
    error_info

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass
class Drain:
    """Whether the server has stopped admitting requests (set once, from a signal handler or any thread)."""

    _event: threading.Event = field(default_factory=threading.Event)
    since: float | None = None

    def begin(self) -> None:
        if not self._event.is_set():
            self.since = time.monotonic()
            self._event.set()

    @property
    def draining(self) -> bool:
        return self._event.is_set()


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media in ("application/json", "") or media.endswith("+json")


class RequestGuard:
    """The ASGI guard (see the module docstring) around `app`, for bodies of at most `max_body_bytes`."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, drain: Drain) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.drain.draining and scope.get("path", "") != "/health":
            await _refuse(send, ServerDrainingError("the server is shutting down; retry on another replica"))
            return
        if scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        if not _is_json(headers.get("content-type", "")):
            await _refuse(send, UnsupportedMediaType(
                f"the request body must be JSON (Content-Type: application/json), got "
                f"{headers['content-type'][:64]!r}"))
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await _refuse(send, self._too_large())
            return
        try:
            body = await self._read_body(receive)
        except _ClientLeft:
            return  # nobody to answer
        if body is None:
            await _refuse(send, self._too_large())
            return
        await self.app(scope, _replay(body, receive), send)

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"the request body is over the server's limit of {self.max_body_bytes} bytes "
                               "(--max-body-bytes)")

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None as soon as it passes the limit; _ClientLeft if the client disconnects."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise _ClientLeft()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


class _ClientLeft(Exception):
    pass


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(send: Send, error: ServeError) -> None:
    info = error_info(error)
    payload = json.dumps(info.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (info.headers() or {}).items()]
    if info.status == 413:
        headers.append((b"connection", b"close"))  # the rest of the body is not read
    await send({"type": "http.response.start", "status": info.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
