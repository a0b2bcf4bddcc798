"""`POST /v1/decisions`: typed questions about an input, in the shape vLLM 0.33 serves (its field names: `model`,
`input` (text, or user messages of text parts), `questions` (1-200; `predicate`, `choice` with 2-255 `choices`,
`score` with 2-10 `levels`), `joint` (all questions on one canvas, up to 64), `safety_identifier`, `cache_salt`;
answers `{type, name, probability}` / `{type, name, choice, probabilities, confidence}` /
`{type, name, score, probabilities, confidence}` and OpenAI's `usage`). Answers come from `dllm_constrain.decisions`
(each question a constrained slot; what the probabilities mean is documented there). Extensions: every answer
carries `label`, the label the canvas committed, and `usage.dllm` the forwards spent.

A call runs on a worker thread (the engine loop batches its requests with the server's others); at most
`MAX_CONCURRENT` calls run at once, the next one is refused with 429 (`QueueFullError`), as a full queue is.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Annotated, Any, Literal, Protocol, Union, runtime_checkable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from dllm_constrain.decisions import Decision, DecisionResult, Question
from dllm_constrain.serve.errors import ModelNotFound, QueueFullError, error_info
from dllm_constrain.serve.limits import ServeLimits
from dllm_constrain.serve.protocol import parse_body

MAX_CONCURRENT = 4
ChoiceValue = Union[StrictStr, StrictBool]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputText(_Strict):
    type: Literal["input_text"]
    text: StrictStr


class InputMessage(_Strict):
    role: Literal["user"]
    content: Union[StrictStr, list[InputText]]
    type: Literal["message"] = "message"


class PredicateQuestion(_Strict):
    type: Literal["predicate"]
    instructions: StrictStr
    name: StrictStr | None = None


class ChoiceOption(_Strict):
    value: ChoiceValue
    description: StrictStr = ""


class ChoiceQuestion(_Strict):
    type: Literal["choice"]
    instructions: StrictStr
    name: StrictStr | None = None
    choices: list[ChoiceOption] = Field(min_length=2, max_length=255)


class ScoreLevel(_Strict):
    label: StrictStr
    description: StrictStr = ""


class ScoreQuestion(_Strict):
    type: Literal["score"]
    instructions: StrictStr
    name: StrictStr | None = None
    levels: list[ScoreLevel] = Field(min_length=2, max_length=10)


DecisionQuestion = Annotated[Union[PredicateQuestion, ChoiceQuestion, ScoreQuestion], Field(discriminator="type")]


class DecisionBody(_Strict):
    model: StrictStr | None = None
    input: Union[StrictStr, list[InputMessage]]
    questions: list[DecisionQuestion] = Field(min_length=1, max_length=200)
    joint: StrictBool = False
    safety_identifier: StrictStr | None = Field(default=None, max_length=128)
    cache_salt: StrictStr | None = Field(default=None, min_length=1, max_length=1024)
    seed: int | None = None  # extension: the generation's seed (decisions are greedy unless temperature is given)
    temperature: float | None = Field(default=None, ge=0)  # extension


@runtime_checkable
class DecisionBackend(Protocol):
    """A backend whose LLM answers decisions (EngineBackend)."""

    model_id: str
    llm: Any


def input_text(value: str | list[InputMessage]) -> str:
    """The input as one text (messages joined by blank lines, text parts by line breaks, as vLLM does)."""
    if isinstance(value, str):
        return value
    return "\n\n".join(m.content if isinstance(m.content, str) else "\n".join(p.text for p in m.content)
                       for m in value)


def to_question(q: PredicateQuestion | ChoiceQuestion | ScoreQuestion) -> Question:
    if isinstance(q, PredicateQuestion):
        return Question("predicate", q.instructions, q.name)
    if isinstance(q, ChoiceQuestion):
        return Question("choice", q.instructions, q.name, tuple(c.value for c in q.choices),
                        tuple(c.description for c in q.choices))
    return Question("score", q.instructions, q.name, tuple(lv.label for lv in q.levels),
                    tuple(lv.description for lv in q.levels))


def answer_body(d: Decision) -> dict[str, Any]:
    """One answer in vLLM's shape (+ `label`, the committed label)."""
    q = d.question
    if q.type == "predicate":
        return {"type": "predicate", "name": q.name, "probability": d.probabilities[0], "label": d.label}
    if q.type == "choice":
        return {"type": "choice", "name": q.name, "choice": d.value, "label": d.label,
                "probabilities": [{"value": v, "probability": p} for v, p in zip(q.options, d.probabilities)],
                "confidence": d.confidence}
    return {"type": "score", "name": q.name, "score": d.expected_score, "label": d.label,
            "probabilities": [{"value": i, "label": lv, "probability": p}
                              for i, (lv, p) in enumerate(zip(q.options, d.probabilities))],
            "confidence": d.confidence}


def response_body(model_id: str, result: DecisionResult) -> dict[str, Any]:
    return {
        "model": model_id,
        "answers": [answer_body(d) for d in result.decisions],
        "usage": {"input_tokens": result.input_tokens,
                  "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens": result.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": result.input_tokens + result.output_tokens,
                  "dllm": {"nfe": result.nfe, "wall_time": result.wall_time}},
    }


def register_decisions_route(app: FastAPI, backend: Any, limits: ServeLimits | None = None) -> None:
    """Serve `POST /v1/decisions` on `app` (501 when `backend` has no LLM to answer with); `limits` bounds the input
    text as it bounds a completion's prompt."""
    slots = threading.BoundedSemaphore(MAX_CONCURRENT)

    @app.post("/v1/decisions")
    async def decisions(request: Request) -> Any:
        if not isinstance(backend, DecisionBackend):
            body = {"error": {"message": "this server's backend does not support the Decisions API",
                              "type": "invalid_request_error", "param": None, "code": "not_implemented"}}
            return JSONResponse(body, status_code=501)
        try:
            body = parse_body(DecisionBody, await request.body())
            if body.model is not None and body.model != backend.model_id:
                raise ModelNotFound(f"the model {body.model!r} does not exist; this server serves "
                                    f"{backend.model_id!r}", param="model")
            options: dict[str, Any] = {"seed": body.seed}
            if body.temperature is not None:
                options["temperature"] = body.temperature
            questions = [to_question(q) for q in body.questions]
            text = input_text(body.input)
            if limits is not None:
                limits.check_prompt(text)
            if not slots.acquire(blocking=False):
                raise QueueFullError(f"{MAX_CONCURRENT} decision calls are running; retry later")
            try:
                work = asyncio.get_running_loop().run_in_executor(
                    None, lambda: backend.llm.decide(text, questions, joint=body.joint, **options))
            except BaseException:
                slots.release()
                raise
            # the slot is free when the call ends, not when a client that hung up stops waiting for it
            work.add_done_callback(lambda _: slots.release())
            result = await work
            return JSONResponse(response_body(backend.model_id, result))
        except Exception as exc:
            info = error_info(exc, constraint_param="questions", prompt_param="input")
            return JSONResponse(info.body(), status_code=info.status, headers=info.headers())

