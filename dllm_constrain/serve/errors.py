"""HTTP errors in OpenAI's shape: every refusal the server makes becomes `{"error": {message, type, param, code}}`.

The library's typed errors (`dllm_constrain.errors`) say *what* went wrong; this module decides the HTTP status,
OpenAI error type and machine-readable code for each, in one table, so routes never pick statuses ad hoc. Client
libraries (the `openai` package) map the status to their exception classes: 400 -> BadRequestError,
404 -> NotFoundError, 413 / 415 -> APIStatusError, 429 -> RateLimitError, 5xx -> InternalServerError (the
client retries 429 and 503 by itself, after the `Retry-After` the server sends with them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dllm_constrain.errors import (
    CompilationTimeoutError,
    ConstraintError,
    ConstraintTimeoutError,
    ConstraintTooLongError,
    DllmConstrainError,
    GenerationTimeoutError,
    InvalidGrammarError,
    InvalidOptionError,
    InvalidRegexError,
    InvalidRequestError,
    InvalidSchemaError,
    PinnedTokenError,
    PromptTooLongError,
    UnsatisfiableSchemaError,
    UnsupportedSchemaError,
)


class ServeError(Exception):
    """A refusal decided by the server layer itself (not by the library), with its HTTP status and OpenAI fields."""

    status: int = 400
    type: str = "invalid_request_error"
    code: str | None = None
    retry_after: int | None = None  # seconds, sent as the Retry-After header (429 and 503 refusals)

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class BadRequest(ServeError):
    """A request field the server does not accept (malformed body, unsupported option, conflicting fields)."""

    code = "invalid_request"


class GrammarNotAllowed(BadRequest):
    """A grammar field that names a file path, or a name that is neither a shipped grammar nor one in the
    operator's grammar directory: over HTTP a grammar is text or a name, never a path (serve/grammar_access.py).
    The message never says whether a file exists."""

    code = "grammar_not_allowed"


class PayloadTooLarge(ServeError):
    """The request body is over the server's `--max-body-bytes` (HTTP 413)."""

    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(ServeError):
    """A request body declared as something other than JSON (HTTP 415)."""

    status = 415
    code = "unsupported_media_type"


class ModelNotFound(ServeError):
    status = 404
    code = "model_not_found"


class QueueFullError(ServeError):
    """The backend's waiting queue is at its bound: the client should retry later (HTTP 429)."""

    status = 429
    type = "rate_limit_error"
    code = "queue_full"
    retry_after = 1


class QueueTimeoutError(ServeError):
    """The request waited `--max-queue-time` seconds without reaching the engine: dropped, the client should retry
    later or elsewhere (HTTP 503 with Retry-After) rather than wait without bound."""

    status = 503
    type = "server_error"
    code = "queue_timeout"
    retry_after = 5


class ServerDrainingError(ServeError):
    """The server is shutting down: it takes no new request (HTTP 503; retry on another replica)."""

    status = 503
    type = "server_error"
    code = "server_shutting_down"
    retry_after = 1


class RequestTimeoutError(ServeError):
    """The request did not finish within the server's per-request timeout (HTTP 504; its work is dropped)."""

    status = 504
    type = "timeout_error"
    code = "request_timeout"


class RequestAbortedError(ServeError):
    """The request was aborted (client gone, or server shutting down) before it finished."""

    status = 503
    type = "server_error"
    code = "request_aborted"


class EngineUnhealthyError(ServeError):
    """The backend cannot serve: closed, not started, or its engine made no step for too long with requests in it
    (raised by health checks, which a replica manager such as Ray Serve answers by replacing the replica)."""

    status = 503
    type = "server_error"
    code = "engine_unhealthy"


@dataclass(frozen=True)
class ErrorInfo:
    """What the HTTP layer sends for one error."""

    status: int
    type: str
    code: str | None
    message: str
    param: str | None
    retry_after: int | None = None

    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# Library errors, most specific first: (class, status, OpenAI type, code, which request field it concerns).
# "constraint" stands for the field the request's constraint came from (response_format, structured_outputs...);
# "prompt" for messages / prompt.
_LIBRARY_ERRORS: list[tuple[type[BaseException], int, str, str, str | None]] = [
    (PromptTooLongError, 400, "invalid_request_error", "context_length_exceeded", "prompt"),
    (PinnedTokenError, 400, "invalid_request_error", "pinned_token_unfit", "vllm_xargs"),
    (InvalidRequestError, 400, "invalid_request_error", "invalid_request", None),
    (ConstraintTooLongError, 400, "invalid_request_error", "constraint_too_long", "max_tokens"),
    (InvalidSchemaError, 400, "invalid_request_error", "invalid_schema", "constraint"),
    (UnsupportedSchemaError, 400, "invalid_request_error", "unsupported_schema", "constraint"),
    (UnsatisfiableSchemaError, 400, "invalid_request_error", "unsatisfiable_schema", "constraint"),
    (InvalidRegexError, 400, "invalid_request_error", "invalid_regex", "constraint"),
    (InvalidGrammarError, 400, "invalid_request_error", "invalid_grammar", "constraint"),
    (InvalidOptionError, 400, "invalid_request_error", "invalid_option", "constraint"),
    (CompilationTimeoutError, 400, "invalid_request_error", "compilation_timeout", "constraint"),
    # a constraint call ran past the server's per-call limit while the request ran: a server-side time limit
    (ConstraintTimeoutError, 504, "timeout_error", "constraint_timeout", "constraint"),
    (ConstraintError, 400, "invalid_request_error", "constraint_error", "constraint"),
    (GenerationTimeoutError, 500, "server_error", "generation_timeout", None),
    (DllmConstrainError, 500, "server_error", "engine_error", None),
]


def error_info(exc: BaseException, *, constraint_param: str | None = None,
               prompt_param: str | None = None) -> ErrorInfo:
    """The HTTP status and OpenAI error fields for any exception (unknown ones are 500 server_error, with the
    exception's class name only, so internals do not leak into responses)."""
    if isinstance(exc, ServeError):
        return ErrorInfo(exc.status, exc.type, exc.code, exc.message, exc.param, exc.retry_after)
    for cls, status, type_, code, param in _LIBRARY_ERRORS:
        if isinstance(exc, cls):
            where = {"constraint": constraint_param, "prompt": prompt_param}.get(param, param) \
                if param is not None else None
            return ErrorInfo(status, type_, code, str(exc) or cls.__name__, where)
    return ErrorInfo(500, "server_error", "internal_error", f"internal server error ({type(exc).__name__})", None)
