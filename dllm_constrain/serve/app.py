"""The HTTP routes: `build_app(backend, ...)` returns a FastAPI app serving OpenAI's completion endpoints.

Everything the app uses is passed to the factory (the backend, the chat formatter, the timeout); the app holds no
module-level state, so tests and embedders can run several apps side by side. The app owns its backend's life:
started with the app, closed at shutdown.

Flow of a request: parse and map the body (protocol.py; 400 on anything not supported; the constraint built by
the library's `Processor.output_constraint`, a refused one a 400 naming its field) -> `backend.submit`
(429 when the queue is full) -> wait for the first event (the request passed compilation and its first step
ran; until then every failure is still an HTTP error status, also for `stream: true`) -> a JSON body, or a
server-sent event stream of final text. Client disconnects abort the request; so does the per-request timeout
(504, or an error event once a stream has started). In front of the routes, `RequestGuard` (admission.py) refuses
oversized and non-JSON bodies and, while the server drains for shutdown, every request (limits.py, shutdown.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dllm_constrain.serve.admission import Drain, RequestGuard
from dllm_constrain.errors import DllmConstrainError
from dllm_constrain.serve.backend import Backend, Delta, Done, Event, GenerationRequest, RequestHandle, Started
from dllm_constrain.serve.chat import ChatFormatter
from dllm_constrain.serve.decisions import register_decisions_route
from dllm_constrain.serve.errors import ModelNotFound, ServeError, error_info
from dllm_constrain.serve.grammar_access import GrammarAccess
from dllm_constrain.serve.limits import ServeLimits
from dllm_constrain.serve.protocol import (
    ChatCompletionBody,
    CompletionBody,
    ResponseBuilder,
    completion_prompt,
    constraint_of,
    constraint_warnings,
    output_constraint,
    parse_body,
    sse,
    to_generation_request,
    warnings_header,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
DISCONNECT_POLL = 0.25  # seconds between client-disconnect checks while a non-streamed request runs


class _ClientGone(Exception):
    pass


def error_response(exc: BaseException, *, constraint_param: str | None = None,
                   prompt_param: str | None = None) -> JSONResponse:
    info = error_info(exc, constraint_param=constraint_param, prompt_param=prompt_param)
    if info.status >= 500 and not isinstance(exc, ServeError):
        log.error("request failed", exc_info=exc)
    return JSONResponse(info.body(), status_code=info.status, headers=info.headers())


async def _unless_disconnected(request: Request, awaitable: Awaitable[T]) -> T:
    """Await `awaitable`, raising _ClientGone if the client disconnects first."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise _ClientGone()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


@dataclass(frozen=True)
class _Completions:
    """The completion routes' handler: everything it uses, passed to `build_app`."""

    backend: Backend
    chat: ChatFormatter
    limits: ServeLimits
    grammars: GrammarAccess
    request_timeout: float | None

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.backend.model_id:
            raise ModelNotFound(f"the model {name!r} does not exist; this server serves {self.backend.model_id!r}",
                                param="model")

    def generation_request(self, body: Any, kind: str) -> tuple[GenerationRequest, str | None]:
        """(the backend request of a parsed body, the request field its constraint came from). The constraint
        is built here, through the library's Processor, before anything is queued."""
        self.check_model(body.model)
        prompt = self.chat.render([m.model_dump() for m in body.messages]) if kind == "chat" \
            else completion_prompt(body)
        self.limits.check_prompt(prompt)
        fields, param = constraint_of(body)
        try:
            constraint = output_constraint(fields, param, self.grammars)
        except DllmConstrainError as exc:
            raise _ConstraintRefused(exc, param) from None
        gen = to_generation_request(body, prompt, constraint, timeout=self.request_timeout,
                                    queue_time=self.limits.max_queue_time)
        return gen, param

    async def __call__(self, request: Request, kind: str) -> Any:
        constraint_param: str | None = None
        prompt_param = "messages" if kind == "chat" else "prompt"
        handle: RequestHandle | None = None
        try:
            body: Any = parse_body(ChatCompletionBody if kind == "chat" else CompletionBody, await request.body())
            gen, constraint_param = self.generation_request(body, kind)
            warnings = constraint_warnings(gen.constraint)
            handle = self.backend.submit(gen)
            first = await _unless_disconnected(request, handle.next_event())
            builder = ResponseBuilder("chat" if kind == "chat" else "text", self.backend.model_id)
            if gen.stream:
                include_usage = bool(body.stream_options and body.stream_options.include_usage)
                stream = _event_stream(handle, first, builder, include_usage, constraint_param, prompt_param)
                return StreamingResponse(stream, media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                                  **warnings_header(warnings)})
            completion = first.completion if isinstance(first, Done) else \
                await _unless_disconnected(request, handle.result())
            full = builder.full(completion)
            if warnings:
                full["constraint_warnings"] = warnings
            return JSONResponse(full, headers=warnings_header(warnings))
        except _ClientGone:
            if handle is not None:
                handle.abort()
            return JSONResponse({}, status_code=499)  # nobody reads it
        except _ConstraintRefused as refused:
            return error_response(refused.error, constraint_param=refused.param, prompt_param=prompt_param)
        except Exception as exc:
            if handle is not None:
                handle.abort()
            return error_response(exc, constraint_param=constraint_param, prompt_param=prompt_param)


class _ConstraintRefused(Exception):
    """The library refused the request's constraint while it was built: its error and the field it came from."""

    def __init__(self, error: DllmConstrainError, param: str | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.param = param


def build_app(backend: Backend, *, chat: ChatFormatter | None = None, request_timeout: float | None = None,
              manage_backend: bool = True, limits: ServeLimits | None = None, grammars: GrammarAccess | None = None,
              drain: Drain | None = None) -> FastAPI:
    """The OpenAI-compatible app over `backend`.

    chat: how chat messages become a prompt (default: the user messages joined; see ChatFormatter.for_llm).
    request_timeout: seconds a request may take from arrival, queueing included (None: no limit).
    manage_backend: start the backend with the app and close it at shutdown.
    limits: body size, prompt characters, queue time (default: ServeLimits(), whose queue time is bounded).
    grammars: what grammar fields may name (default: shipped names and grammar text only, never a file).
    drain: set when the server shuts down; from then on every request gets 503 (shutdown.py sets it)."""
    limits = limits if limits is not None else ServeLimits()
    drain = drain if drain is not None else Drain()
    serve = _Completions(backend, chat if chat is not None else ChatFormatter(), limits,
                         grammars if grammars is not None else GrammarAccess(), request_timeout)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_backend:
            backend.start()
        try:
            yield
        finally:
            if manage_backend:
                await asyncio.get_running_loop().run_in_executor(None, backend.close)

    app = FastAPI(title="dllm-constrain", lifespan=lifespan)
    app.add_middleware(RequestGuard, max_body_bytes=limits.max_body_bytes,  # type: ignore[arg-type]
                       drain=drain)
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]

    def model_card() -> dict[str, Any]:
        return {"id": backend.model_id, "object": "model", "created": 0, "owned_by": "dllm-constrain"}

    @app.get("/health")
    async def health() -> Any:
        """200 while the server takes requests; 503 once it drains for shutdown (load balancers stop routing)."""
        if drain.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> Any:
        if model_id != backend.model_id:
            return error_response(ModelNotFound(f"the model {model_id!r} does not exist", param="model"))
        return model_card()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await serve(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await serve(request, "text")

    register_decisions_route(app, backend, limits)
    return app


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """The framework's own refusals (unknown route 404, wrong method 405) in OpenAI's error shape too."""
    body = {"error": {"message": str(exc.detail), "type": "invalid_request_error", "param": None, "code": None}}
    return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def _event_stream(handle: RequestHandle, first: Event, builder: ResponseBuilder, include_usage: bool,
                        constraint_param: str | None, prompt_param: str) -> AsyncIterator[str]:
    """OpenAI chunks of final text, then `[DONE]`; an error after the stream started is sent as an error event
    (the status is already 200). The request is aborted if the client goes away (the generator is closed)."""
    try:
        if builder.kind == "chat":
            yield sse(builder.chunk(role=True))
        event = first
        while True:
            if isinstance(event, Delta) and event.text:
                yield sse(builder.chunk(event.text))
            elif isinstance(event, Done):
                yield sse(builder.chunk(None if builder.kind == "chat" else "",
                                        finish_reason=event.completion.finish_reason))
                if include_usage:
                    yield sse(builder.usage_chunk(event.completion))
                yield sse("[DONE]")
                return
            elif not isinstance(event, Started):
                raise AssertionError(f"unexpected event {event!r}")
            event = await handle.next_event()
    except Exception as exc:
        info = error_info(exc, constraint_param=constraint_param, prompt_param=prompt_param)
        yield sse(info.body())
    finally:
        handle.abort()  # a no-op once finished; otherwise the client left or the request failed
