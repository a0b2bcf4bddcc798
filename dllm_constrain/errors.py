"""Typed errors. Every way a request can be refused has its own class, so callers can catch precisely."""
from __future__ import annotations


class DllmConstrainError(Exception):
    """Base class for every error this package raises on purpose."""


class InvalidRequestError(DllmConstrainError, ValueError):
    """A generation request is malformed (empty prompt, max_new_tokens <= 0, bad option value, ...)."""


class PromptTooLongError(InvalidRequestError):
    """The prompt plus the canvas does not fit in the model's context window."""


class PinnedTokenError(InvalidRequestError):
    """A template's pinned token cannot be part of any valid output (under the request's constraint, or the canvas
    conventions: specials the model may not write, text after a pinned EOS). `position` is the first such canvas
    position, `token` the id pinned there."""

    def __init__(self, message: str, *, position: int, token: int) -> None:
        super().__init__(message)
        self.position = position
        self.token = token


class CheckpointError(DllmConstrainError):
    """A checkpoint folder cannot be loaded: missing files, unknown config fields, wrong tensor names or shapes."""


class UnsupportedModelError(CheckpointError):
    """The checkpoint's model family is not one the engine implements."""


class ConstraintError(DllmConstrainError):
    """Base class for errors raised while compiling or applying a constraint."""


class InvalidSchemaError(ConstraintError, ValueError):
    """The JSON Schema itself is malformed (not an object, bad keyword value, unresolvable $ref, ...)."""


class UnsupportedSchemaError(ConstraintError):
    """The schema uses a keyword or keyword value the compiler cannot honour; the message names it."""

    def __init__(self, keyword: str, path: str = "#", detail: str = "") -> None:
        self.keyword = keyword
        self.path = path
        msg = f"unsupported JSON Schema keyword {keyword!r} at {path}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class UnknownKeywordError(UnsupportedSchemaError):
    """A schema keyword outside the JSON Schema vocabularies (`x-*`, `nullable`, a typo such as `maxLenght`)
    while compiling with `unknown_keywords="error"`; `.keyword` and `.path` name it."""


class UnknownKeywordWarning(UserWarning):
    """A schema keyword outside the JSON Schema vocabularies was not enforced (`unknown_keywords="warn"`,
    the default); `compiled.ignored_keywords` lists every such (path, keyword)."""


class UnsatisfiableSchemaError(ConstraintError):
    """No JSON value satisfies the schema (e.g. minimum > maximum)."""


class InvalidOptionError(ConstraintError, ValueError):
    """A compile option is unknown or has an invalid value; the message names it."""


class InvalidRegexError(ConstraintError, ValueError):
    """The regular expression does not parse, or uses a feature the compiler cannot honour."""


class InvalidGrammarError(ConstraintError, ValueError):
    """A Lark grammar does not parse, or uses a feature the compiler cannot honour."""


class ConstraintTooLongError(ConstraintError):
    """The shortest output the constraint admits does not fit in the canvas (max_new_tokens)."""

    NO_OUTPUT = 1 << 30  # min_tokens at or past this: the automata found no completion at all (their "infinity")

    def __init__(self, min_tokens: int, max_new_tokens: int) -> None:
        self.min_tokens = min_tokens
        self.max_new_tokens = max_new_tokens
        if min_tokens >= self.NO_OUTPUT:
            msg = (f"the constraint admits no output that any canvas can hold (no completion was found; it may "
                   f"accept no text at all), max_new_tokens is {max_new_tokens}")
        else:
            msg = (f"the shortest output the constraint admits needs at least {min_tokens} tokens, "
                   f"but max_new_tokens is {max_new_tokens}")
        super().__init__(msg)


class CompilationTimeoutError(ConstraintError):
    """Compiling a constraint exceeded its time limit."""


class CompilationWorkLimitError(CompilationTimeoutError):
    """Compiling a constraint exceeded its work limit (a count of compiler steps, the same on any machine: unlike the
    time limit, it refuses the same constraints on an idle and on a loaded machine). A CompilationTimeoutError, so
    callers that catch that (the server's `compilation_timeout`) refuse it alike."""


class ConstraintTimeoutError(ConstraintError):
    """A constraint call (allowed_tokens, select_commits, is_completable, min_tokens, ...) ran past its per-call
    deadline (`constraint_timeout`) and could not answer soundly with what it had computed. `.kind` is the
    constraint's kind ("json_schema", "regex", ...), `.operation` what was being computed, `.location` where
    (the DFA state being expanded and, for JSON, the instance location at the canvas frontier), `.timeout_s`
    the limit. Only the request that made the call ends; the compiled constraint stays intact for the others."""

    def __init__(self, message: str = "", *, kind: str = "constraint", operation: str = "",
                 location: str = "", timeout_s: float | None = None) -> None:
        self.kind = kind
        self.operation = operation
        self.location = location
        self.timeout_s = timeout_s
        if not message:
            message = f"{kind} constraint: {operation or 'a constraint call'} exceeded its time limit"
            if timeout_s is not None:
                message += f" of {timeout_s:g} s"
            if location:
                message += f" (at {location})"
        super().__init__(message)


class StepFailedError(DllmConstrainError):
    """The model failed on this request's rows (its forward or head pass raised with it alone in the step); the
    other requests of the step went on."""


class GenerationTimeoutError(DllmConstrainError):
    """Constrained generation exceeded its time or step bound."""
