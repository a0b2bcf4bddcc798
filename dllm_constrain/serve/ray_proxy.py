"""Ray's HTTP proxy, told to answer a request whose replica died in OpenAI's error shape.

When a replica dies with requests in flight (killed, out of memory, a crashed process), Ray's proxy sends nothing
for them, and its HTTP server then answers a bare `500 Internal Server Error` in plain text; a stream that had
started just stops. Neither tells an OpenAI client what happened. `ReplicaLossMiddleware`, an ASGI middleware
around the proxy, finishes such a response itself: a request that got no response at all gets HTTP 503 with an
OpenAI error body (code `replica_unavailable`, `Retry-After: 1`; the `openai` client retries 503 by default, and
the retry goes to a live replica), and a stream that ended without its last chunk gets an error event (what our
server sends when a request fails after its stream started), so the client raises instead of reading a truncated
answer as complete.

Ray loads proxy middlewares from the callback named by RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH in the proxy's
environment (Ray Serve's HTTP proxy callback); `RayServeRunner` sets it to `proxy_middlewares` before it starts a
Ray instance. A cluster it joins must have it set on its nodes (docs/scale-out.md).
"""
from __future__ import annotations

import json
from typing import Any

from starlette.middleware import Middleware

CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
CALLBACK_PATH = "dllm_constrain.serve.ray_proxy:proxy_middlewares"
REPLICA_LOST = {"message": "the replica serving this request stopped before it answered (it died or was "
                           "replaced); retry the request", "type": "server_error", "param": None,
                "code": "replica_unavailable"}


def proxy_middlewares() -> list[Middleware]:
    """Ray Serve's HTTP proxy callback: the middlewares its proxy applies."""
    return [Middleware(ReplicaLossMiddleware)]


class ReplicaLossMiddleware:
    """Finishes a response the proxy left unfinished (see the module docstring); others pass through unchanged."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        progress = {"started": False, "ended": False, "stream": False}

        async def tracking_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                progress["started"] = True
                headers = dict(message.get("headers") or [])
                progress["stream"] = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                progress["ended"] = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            if not progress["ended"]:
                await _finish(send, started=progress["started"], stream=progress["stream"])


async def _finish(send: Any, *, started: bool, stream: bool) -> None:
    """The end of a response the proxy left unfinished; a client already gone makes sending fail quietly."""
    try:
        if not started:
            body = json.dumps({"error": REPLICA_LOST}).encode()
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body, "more_body": False})
        elif stream:
            event = f"data: {json.dumps({'error': REPLICA_LOST})}\n\n".encode()
            await send({"type": "http.response.body", "body": event, "more_body": False})
        else:  # a JSON body cut short cannot be mended: end it, the client sees invalid JSON and fails
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    except Exception:  # noqa: BLE001 - the client disconnected; nobody is left to tell
        pass
