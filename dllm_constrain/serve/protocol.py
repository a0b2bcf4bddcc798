"""The OpenAI wire format: request bodies, their mapping to `GenerationRequest` (the constraint built by the
library's `Processor.output_constraint`), and response / chunk bodies.

Requests are validated with pydantic models that allow unknown fields (clients send fields such as `user` that
do not change what is generated), then every field that would change the output but is not implemented is
refused by name (400), never silently ignored.

Constraints, at most one per request (schema keywords the compiler does not enforce come back as the
X-Constraint-Warnings header, `constraint_warnings`):
  response_format   {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}: that schema
                    (strict true or absent: the library's generation narrowings; false: the JSON Schema spec's
                    semantics); {"type": "json_object"}: any JSON object ({"type": "object"}, spec semantics);
                    {"type": "text"}: no constraint
  structured_outputs vLLM's current names: {"json": schema, "regex": r, "grammar": lark, "choice": [...],
                    "json_object": true}
  guided_json, guided_regex, guided_grammar, guided_choice   vLLM's older names
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dllm_constrain.engine.state import OutputConstraint
from dllm_constrain.errors import InvalidGrammarError
from dllm_constrain.processor import Processor
from dllm_constrain.serve.backend import Completion, GenerationRequest
from dllm_constrain.serve.constraint_fields import JSON_OBJECT_SCHEMA, choice_regex
from dllm_constrain.serve.errors import BadRequest
from dllm_constrain.serve.grammar_access import GrammarAccess
from dllm_constrain.serve.limits import MAX_JSON_DEPTH, json_depth

# ---------------------------------------------------------------------------------------------- request bodies


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class JsonSchemaSpec(_Open):
    name: str | None = None
    description: str | None = None
    schema_: Union[dict[str, Any], bool, None] = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` (only the keys implemented here; others are refused by pydantic)."""

    model_config = ConfigDict(extra="forbid")
    json_: Union[dict[str, Any], bool, str, None] = Field(default=None, alias="json")
    regex: str | None = None
    grammar: str | None = None
    choice: list[str] | None = None
    json_object: bool | None = None
    disable_fallback: bool | None = None  # accepted: there is no fallback to disable


class StreamOptions(_Open):
    include_usage: bool | None = None


class ChatMessage(_Open):
    role: str
    content: Union[str, list[Any], None] = None


class _GenerationBody(_Open):
    """Fields common to chat and text completions."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = None
    n: int | None = None
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: Any = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: Union[dict[str, Any], bool, str, None] = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    guided_choice: list[str] | None = None
    vllm_xargs: dict[str, Any] | None = None  # vLLM's per-request extra_args: the diffusion canvas fields (CANVAS_XARGS)


class ChatCompletionBody(_GenerationBody):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Any] | None = None
    tool_choice: Any = None
    top_logprobs: int | None = None


class CompletionBody(_GenerationBody):
    prompt: Union[str, list[str]]
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None


def parse_body(model: type[_GenerationBody], raw: bytes) -> Any:
    """The request body as `model`, or BadRequest naming the first offending field."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise BadRequest(f"the request body nests arrays/objects more than {MAX_JSON_DEPTH} deep") from None
    except ValueError as exc:  # malformed JSON, bad UTF-8, an integer of more digits than Python converts
        raise BadRequest(f"the request body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    if json_depth(data) > MAX_JSON_DEPTH:
        raise BadRequest(f"the request body nests arrays/objects more than {MAX_JSON_DEPTH} deep")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise BadRequest(f"{where}: {err['msg']}", param=where or None) from None


# ---------------------------------------------------------------------------------------------- mapping
STOP_MAX = 4  # as OpenAI


# vLLM's and OpenAI's extra sampling fields that would change the output, with their neutral values: given with
# any other value they are refused (unknown fields are otherwise ignored, and these must not be silently).
_NEUTRAL_EXTRAS: dict[str, tuple[Any, ...]] = {
    "top_k": (None, 0, -1), "min_p": (None, 0, 0.0), "repetition_penalty": (None, 1, 1.0),
    "min_tokens": (None, 0), "ignore_eos": (None, False), "stop_token_ids": (None, []),
    "include_stop_str_in_output": (None, False), "prompt_logprobs": (None, 0), "prediction": (None,),
    "guided_whitespace_pattern": (None,), "length_penalty": (None, 1, 1.0), "use_beam_search": (None, False),
}


def _is_neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    """Whether `value` is one of `neutral` (a boolean is not a number here: top_k=false is not top_k=0)."""
    return any(value == n and isinstance(value, bool) == isinstance(n, bool) for n in neutral)


def _refuse_unsupported(body: _GenerationBody) -> None:
    """400 for options that would change the output but are not implemented."""
    def no(field: str, why: str) -> None:
        raise BadRequest(f"{field} is not supported by this server ({why})", param=field)

    for name, neutral in _NEUTRAL_EXTRAS.items():
        if not _is_neutral((body.model_extra or {}).get(name), neutral):
            no(name, "it would change the answer and is not implemented")

    if body.n is not None and body.n != 1:
        no("n", "one choice per request: n must be 1")
    if body.top_p is not None and body.top_p != 1:
        no("top_p", "sampling uses the full distribution at the given temperature")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name) not in (None, 0, 0.0):
            no(name, "a diffusion model denoises all positions together; there is no token history to penalise")
    if body.logit_bias:
        no("logit_bias", "use a constraint (response_format, structured_outputs) instead")
    if body.logprobs not in (None, False, 0):
        no("logprobs", "not computed by the engine")
    if isinstance(body, ChatCompletionBody):
        if body.top_logprobs not in (None, 0):
            no("top_logprobs", "log probabilities are not computed by the engine")
        if body.tools or body.tool_choice not in (None, "none"):
            no("tools", "use response_format with a JSON Schema for structured output")
    if isinstance(body, CompletionBody):
        if body.echo:
            no("echo", "not implemented")
        if body.suffix:
            no("suffix", "not implemented")
        if body.best_of not in (None, 1):
            no("best_of", "one choice per request")


def _choice_regex(choices: list[str], param: str) -> str:
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise BadRequest(f"{param} must be a non-empty list of non-empty strings", param=param)
    return choice_regex(choices)


# A constraint as the request gives it: the OutputConstraint fields it sets (normalised later, in one place:
# Processor.output_constraint, where a bad schema is a 400 naming the request field it came from).
ConstraintFields = dict[str, Any]
ANY_JSON_OBJECT: ConstraintFields = {"schema": JSON_OBJECT_SCHEMA, "strict": False}


def constraint_of(body: _GenerationBody) -> tuple[ConstraintFields | None, str | None]:
    """(the request's constraint fields, the request field it came from); BadRequest when several are given."""
    found: list[tuple[ConstraintFields, str]] = []
    rf = body.response_format
    if rf is not None and rf.type == "json_object":
        found.append((ANY_JSON_OBJECT, "response_format"))
    elif rf is not None and rf.type == "json_schema":
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise BadRequest("response_format.json_schema.schema is required for type json_schema",
                             param="response_format.json_schema")
        found.append(({"schema": rf.json_schema.schema_, "strict": rf.json_schema.strict is not False},
                      "response_format"))
    so = body.structured_outputs
    if so is not None:
        if so.json_ is not None:
            found.append(({"schema": so.json_}, "structured_outputs.json"))
        if so.regex is not None:
            found.append(({"regex": so.regex}, "structured_outputs.regex"))
        if so.grammar is not None:
            found.append(({"grammar": so.grammar}, "structured_outputs.grammar"))
        if so.choice is not None:
            found.append(({"regex": _choice_regex(so.choice, "structured_outputs.choice")},
                          "structured_outputs.choice"))
        if so.json_object:
            found.append((ANY_JSON_OBJECT, "structured_outputs.json_object"))
    for name, kind in (("guided_json", "schema"), ("guided_regex", "regex"), ("guided_grammar", "grammar")):
        if getattr(body, name) is not None:
            found.append(({kind: getattr(body, name)}, name))
    if body.guided_choice is not None:
        found.append(({"regex": _choice_regex(body.guided_choice, "guided_choice")}, "guided_choice"))
    if len(found) > 1:
        raise BadRequest("give at most one constraint; got " + ", ".join(p for _, p in found), param=found[1][1])
    return found[0] if found else (None, None)


def output_constraint(fields: ConstraintFields | None, param: str | None,
                      grammars: GrammarAccess | None = None) -> OutputConstraint | None:
    """The request's OutputConstraint, built (checked, normalised) by `Processor.output_constraint`. A grammar
    field is resolved by `grammars` first (default: shipped names and grammar text only), so the constraint
    carries grammar text, never a file name. Raises the library's typed error of a bad value (error_info maps it
    onto `param`)."""
    if fields is None:
        return None
    if "grammar" in fields:
        try:
            text = (grammars or GrammarAccess()).resolve(fields["grammar"], param or "grammar")
        except InvalidGrammarError as exc:  # bad parameters of a shipped name (csv:x)
            raise BadRequest(str(exc), param=param, code="invalid_grammar") from None
        fields = {"grammar": text}
    return Processor.output_constraint(**fields)


# What the server tells a client about its constraint besides accepting it: schema keywords that are not enforced.
# A keyword outside the JSON Schema vocabularies (`x-*`, `nullable`, a typo such as `maxLenght`) is never enforced;
# the library reports it (UnknownKeywordWarning, `compiled.ignored_keywords`) rather than fail, and over HTTP that
# report has to reach the client. The walk is the compiler's own (`json_schema.unknown.unknown_keywords`), run on
# the request's schema before it is queued, so the warnings are known before the response headers go out (for
# streams too): the `X-Constraint-Warnings` header (a JSON array of strings) and, in a non-streamed body,
# `constraint_warnings`.
WARNINGS_HEADER = "X-Constraint-Warnings"
MAX_WARNINGS = 32  # listed in full up to this many; the rest are counted
MAX_HEADER_CHARS = 4096


def constraint_warnings(constraint: OutputConstraint | None) -> list[str]:
    """One line per schema keyword the compiler will not enforce (empty for other constraints, or for a schema
    the compiler will refuse anyway: its error is the answer then)."""
    if constraint is None or not isinstance(constraint.schema, dict):  # normalised: a dict, or a bool schema
        return []
    from dllm_constrain.constraints.json_schema.options import SchemaOptions
    from dllm_constrain.constraints.json_schema.refs import RefResolver
    from dllm_constrain.constraints.json_schema.unknown import unknown_keywords
    from dllm_constrain.errors import DllmConstrainError

    try:
        found = unknown_keywords(RefResolver(constraint.schema, SchemaOptions().max_recursion_depth))
    except (DllmConstrainError, ValueError, RecursionError):
        return []
    lines = [f"JSON Schema keyword {_short(kw)!r} at {_short(path)} is not enforced (outside the JSON Schema "
             "vocabularies)" for path, kw in found[:MAX_WARNINGS]]
    if len(found) > MAX_WARNINGS:
        lines.append(f"... and {len(found) - MAX_WARNINGS} more keywords not enforced")
    return lines


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def warnings_header(warnings: list[str]) -> dict[str, str]:
    """The response header for `warnings` (none when empty): a JSON array, ASCII-escaped, at most
    MAX_HEADER_CHARS long (later entries dropped and counted)."""
    if not warnings:
        return {}
    shown = list(warnings)
    value = json.dumps(shown, ensure_ascii=True)
    while len(value) > MAX_HEADER_CHARS and len(shown) > 1:
        shown.pop()
        value = json.dumps(shown + [f"... and {len(warnings) - len(shown)} more"], ensure_ascii=True)
    return {WARNINGS_HEADER: value[:MAX_HEADER_CHARS]}


def _stop_of(body: _GenerationBody) -> tuple[str, ...]:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stop) > STOP_MAX or not all(stop):
        raise BadRequest(f"stop takes up to {STOP_MAX} non-empty strings", param="stop")
    return tuple(stop)


# vLLM's diffusion `extra_args` (`vllm_xargs` over REST) -> our option names (the template fields of
# SamplingParams); `template` / `hole_length` are ours (text with holes, dllm_constrain.templates)
CANVAS_XARGS = {"diffusion_seed_canvas": "seed_canvas", "diffusion_pinned": "pinned",
                "diffusion_canvas_length": "max_new_tokens", "diffusion_max_steps": "steps",
                "template": "template", "hole_length": "hole_length"}
REFUSED_XARGS = {
    "diffusion_read_only": "a read-only canvas is not served; POST /v1/decisions reads label probabilities",
    "diffusion_constrained": "give a constraint instead (response_format, structured_outputs): it masks every "
                             "open position exactly",
}


def canvas_options(xargs: dict[str, Any] | None, max_tokens: int | None) -> tuple[tuple[str, Any], ...]:
    """The generation options of `vllm_xargs` (a seed canvas without a length takes its own length; a length that
    disagrees with max_tokens is refused). Unknown or unsupported keys are a 400 naming them."""
    if not xargs:
        return ()
    out: dict[str, Any] = {}
    for key, value in xargs.items():
        if key in REFUSED_XARGS:
            raise BadRequest(f"vllm_xargs.{key} is not supported: {REFUSED_XARGS[key]}", param=f"vllm_xargs.{key}")
        if key not in CANVAS_XARGS:
            raise BadRequest(f"vllm_xargs.{key} is not supported (known: {', '.join(sorted(CANVAS_XARGS))})",
                             param=f"vllm_xargs.{key}")
        out[CANVAS_XARGS[key]] = value
    length = out.get("max_new_tokens")
    if length is not None and max_tokens is not None and length != max_tokens:
        raise BadRequest("vllm_xargs.diffusion_canvas_length and max_tokens differ; give one", param="max_tokens")
    seed = out.get("seed_canvas")
    if length is None and max_tokens is None and isinstance(seed, list):
        out["max_new_tokens"] = len(seed)
    if "template" in out and ("seed_canvas" in out or length is not None):
        raise BadRequest("vllm_xargs.template sets the canvas; give it without diffusion_seed_canvas / "
                         "diffusion_canvas_length", param="vllm_xargs.template")
    return tuple(out.items())


def to_generation_request(body: _GenerationBody, prompt: Any, constraint: OutputConstraint | None, *,
                          timeout: float | None, queue_time: float | None = None) -> GenerationRequest:
    """The backend request for `body` with the already rendered `prompt` and built `constraint`
    (`output_constraint`); BadRequest for fields this server does not implement."""
    _refuse_unsupported(body)
    max_tokens = body.max_tokens
    if isinstance(body, ChatCompletionBody) and body.max_completion_tokens is not None:
        if max_tokens is not None and max_tokens != body.max_completion_tokens:
            raise BadRequest("max_tokens and max_completion_tokens differ; give one", param="max_tokens")
        max_tokens = body.max_completion_tokens
    return GenerationRequest(
        prompt=prompt, constraint=constraint, max_new_tokens=max_tokens,
        temperature=0.0 if body.temperature is None else float(body.temperature), seed=body.seed,
        stop=_stop_of(body), stream=body.stream, timeout=timeout, queue_time=queue_time,
        canvas=canvas_options(body.vllm_xargs, max_tokens))


def completion_prompt(body: CompletionBody) -> str:
    if isinstance(body.prompt, list):
        if len(body.prompt) != 1:
            raise BadRequest("one prompt per request (a list must hold exactly one string)", param="prompt")
        return body.prompt[0]
    return body.prompt


# ---------------------------------------------------------------------------------------------- responses
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(c: Completion) -> dict[str, Any]:
    """OpenAI's usage plus the engine's counters under "dllm" (forwards, forced tokens, remasks, backtracks)."""
    r = c.result
    return {
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
        "dllm": {"nfe": r.nfe, "forced_tokens": r.forced_tokens, "remasks": r.remasks,
                 "backtracks": r.backtracks, "steps": r.steps, "tokens_per_forward": r.tokens_per_forward,
                 "wall_time": r.wall_time, "engine_finish_reason": r.finish_reason},
    }


class ResponseBuilder:
    """Bodies for one request: the same id, creation time and model name in every chunk."""

    def __init__(self, kind: Literal["chat", "text"], model: str) -> None:
        self.kind = kind
        self.model = model
        self.id = new_id("chatcmpl" if kind == "chat" else "cmpl")
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices,
                "system_fingerprint": None}

    def full(self, c: Completion) -> dict[str, Any]:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": c.text, "refusal": None},
                      "finish_reason": c.finish_reason, "logprobs": None}
            body = self._envelope("chat.completion", [choice])
        else:
            body = self._envelope("text_completion",
                                  [{"index": 0, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}])
        body["usage"] = usage(c)
        return body

    def chunk(self, text: str | None = None, *, finish_reason: str | None = None, role: bool = False
              ) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
            return self._envelope("chat.completion.chunk", [choice])
        return self._envelope("text_completion",
                              [{"index": 0, "text": text or "", "finish_reason": finish_reason, "logprobs": None}])

    def usage_chunk(self, c: Completion) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk" if self.kind == "chat" else "text_completion", [])
        body["usage"] = usage(c)
        return body


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"
