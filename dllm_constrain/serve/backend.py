"""The seam between the HTTP layer and the engine: `Backend.submit(GenerationRequest) -> RequestHandle`.

The HTTP layer only knows this interface: a request goes in, the handle yields events (`Started`, `Delta` text that
is final, then `Done` with the `Completion`; or raises the request's error) and can be aborted. Another
scheduler can replace `EngineBackend` without touching the routes: it has to accept requests from the
event loop (`submit`, non-blocking, raising QueueFullError when it will not take more), publish events to each
handle from whatever thread runs the engine (`RequestHandle.publish`, thread-safe), and honour `aborted`.

`EngineBackend` hands each request straight to the LLM's engine loop (`LLM.submit`, dllm_constrain.engine_loop),
whose scheduler is the one queue and the one admission limit (its `max_num_seqs`, the server's --max-batch-size):
the backend holds nothing back. It only counts the requests the scheduler has not admitted yet (at most
`max_queue` of them; more get QueueFullError) and marks a request admitted when the engine serves it a step
(`on_start`), which ends its queue time. Each request's progress events announce Started; a streaming request
also takes the engine's committed-prefix updates (`on_stream`), turned into final-text deltas by `CommittedText`
(as in `AsyncLLM.stream`). An aborted or timed-out request leaves the engine at its next step (`CallHandle.abort`):
its neighbours go on. Prompt tokens are counted from the ids the request was built with (`CallHandle.requests`).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Union

from dllm_constrain.engine_loop import CallHandle, GenerationAbortedError
from dllm_constrain.errors import DllmConstrainError
from dllm_constrain.serve.errors import (
    EngineUnhealthyError,
    QueueFullError,
    QueueTimeoutError,
    RequestAbortedError,
    RequestTimeoutError,
    ServerDrainingError,
)
from dllm_constrain.serve.streaming import CommittedText

if TYPE_CHECKING:  # only for annotations: the engine's result, progress and constraint types
    from dllm_constrain.api import GenerationResult
    from dllm_constrain.engine.state import OutputConstraint
    from dllm_constrain.engine.llm_engine import StepEvent
    from dllm_constrain.engine.outputs import StreamUpdate

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class GenerationRequest:
    """What the HTTP layer asks of a backend, free of any wire format."""

    prompt: Any  # handed to LLM.submit (which applies the checkpoint's prompt format): text or a conversation
    constraint: OutputConstraint | None = None  # built by the HTTP layer through Processor.output_constraint
    max_new_tokens: int | None = None  # None: the checkpoint's default canvas
    temperature: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False  # publish Delta events while denoising
    timeout: float | None = None  # seconds from submission after which the request is dropped (504)
    queue_time: float | None = None  # seconds it may wait for the engine before it is dropped (503, Retry-After)
    # template options from vllm_xargs (seed_canvas, pinned, max_new_tokens, steps, template, hole_length)
    canvas: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Completion:
    """A finished request: the answer text (cut at a stop string), why it ended, token counts, engine counters."""

    text: str
    finish_reason: str  # "stop" (EOS or a stop string) | "length" (the canvas filled up)
    prompt_tokens: int
    completion_tokens: int
    result: GenerationResult  # the engine's full result (token ids, nfe, forced_tokens, remasks, backtracks, ...)


@dataclass(frozen=True)
class Started:
    """The request passed validation and compilation and its first step ran (errors can no longer be 400s
    raised before a stream starts)."""


@dataclass(frozen=True)
class Delta:
    text: str  # new final text (append-only)


@dataclass(frozen=True)
class Done:
    completion: Completion


@dataclass(frozen=True)
class Failed:
    error: BaseException


Event = Union[Started, Delta, Done, Failed]


# ---------------------------------------------------------------------------------------------- handle
class RequestHandle:
    """The consumer's side of one request. Created on the event loop by `Backend.submit`; the engine side calls
    `publish` from any thread. Consumers iterate `events()` (which applies the request's timeout) or await
    `result()`; `abort()` says the result is no longer wanted."""

    def __init__(self, request_id: str, request: GenerationRequest, loop: asyncio.AbstractEventLoop,
                 on_abort: Callable[["RequestHandle"], None] | None = None) -> None:
        self.request_id = request_id
        self.request = request
        now = time.monotonic()
        self.deadline = now + request.timeout if request.timeout is not None else None
        self.queue_deadline = now + request.queue_time if request.queue_time is not None else None
        self.admitted = False  # set by the backend when the request leaves the queue for the engine
        self._loop = loop
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._on_abort = on_abort
        self._aborted = False
        self._finished = False

    # -- engine side (any thread)
    def publish(self, event: Event) -> None:
        """Thread-safe: hand one event to the consumer's event loop (dropped if that loop is gone)."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    @property
    def aborted(self) -> bool:
        return self._aborted

    def expired(self, now: float | None = None) -> bool:
        now = now if now is not None else time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            return True
        return not self.admitted and self.queue_deadline is not None and now >= self.queue_deadline

    def wanted(self, now: float | None = None) -> bool:
        """Whether the engine should still spend work on this request."""
        return not self._aborted and not self.expired(now)

    # -- consumer side (event loop)
    def abort(self) -> None:
        """Drop the request: removed from the queue if it waits, its work stopped or discarded if it runs."""
        if self._aborted or self._finished:
            return
        self._aborted = True
        if self._on_abort is not None:
            self._on_abort(self)

    def _wait_bound(self) -> float | None:
        """Seconds until the nearer of the deadline and (while queued) the queue deadline; None: no bound."""
        bounds = [d for d in (self.deadline, None if self.admitted else self.queue_deadline) if d is not None]
        return max(0.0, min(bounds) - time.monotonic()) if bounds else None

    async def next_event(self) -> Event:
        """The next event; raises RequestTimeoutError past the deadline, QueueTimeoutError past the queue
        deadline while still queued (aborting the request either way), the request's own error for Failed."""
        while True:
            try:
                event = await asyncio.wait_for(self._queue.get(), self._wait_bound())
                self.admitted = True  # a request that has an event has left any queue
                break
            except asyncio.TimeoutError:
                now = time.monotonic()
                if self.deadline is not None and now >= self.deadline:
                    self.abort()
                    raise RequestTimeoutError(f"the request did not finish within {self.request.timeout:g} s "
                                              "(the server's --request-timeout)") from None
                if not self.admitted and self.queue_deadline is not None and now >= self.queue_deadline:
                    self.abort()
                    raise QueueTimeoutError(f"the request waited {self.request.queue_time:g} s without reaching "
                                            "the engine (the server's --max-queue-time); retry later") from None
        if isinstance(event, Failed):
            self._finished = True
            raise event.error
        if isinstance(event, Done):
            self._finished = True
        return event

    async def events(self) -> AsyncIterator[Event]:
        """Started, Deltas, then Done (the last event); raises the request's error instead of Failed."""
        while True:
            event = await self.next_event()
            yield event
            if isinstance(event, Done):
                return

    async def result(self) -> Completion:
        async for event in self.events():
            if isinstance(event, Done):
                return event.completion
        raise AssertionError("events() ended without Done")  # pragma: no cover


class Backend(Protocol):
    """What the HTTP layer needs from an engine (see the module docstring)."""

    model_id: str

    def start(self) -> None: ...

    def close(self) -> None: ...

    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Queue a request (call on the event loop); raises QueueFullError when the backend is at capacity.
        Set `handle.admitted` when the request leaves the backend's queue for the engine: until then, or until its
        first event, its `queue_time` counts."""
        ...


# ---------------------------------------------------------------------------------------------- engine worker
class _RequestStopped(Exception):
    """Raised from a request's progress callback to end it at once (its consumer is gone or the server closes)."""


@dataclass(eq=False)
class _Job:
    handle: RequestHandle
    text: CommittedText
    started: bool = False  # Started was published
    admitted: bool = False  # the engine served it a step (the scheduler admitted it)
    drained: bool = False  # stopped by a drain before the engine admitted it
    call: CallHandle | None = None  # the engine loop's handle once submitted


_DRAINED = "the server is shutting down; the request did not start"


class EngineBackend:
    """Requests of an `LLM` through its engine loop (continuous batching): each request goes to the engine at once;
    at most `max_queue` of them may wait for the scheduler to admit them (see the module docstring)."""

    def __init__(self, llm: Any, *, model_id: str | None = None, max_queue: int = 64) -> None:
        from dllm_constrain.api import bundled_model_path

        if max_queue < 1:
            raise ValueError("max_queue must be >= 1")
        self.llm = llm
        path = getattr(llm, "path", None)
        bundled = path is None or Path(path).resolve() == bundled_model_path().resolve()
        self.model_id = model_id or ("dllm-constrain-bundled" if bundled else Path(path).name)
        self.max_queue = max_queue
        # the engine scheduler's running-request limit (the one admission limit), read to tell whether a request
        # will wait in the scheduler's queue; None: no limit (an LLM stand-in without an engine)
        engine = getattr(llm, "engine", None)
        self._engine_limit: int | None = engine.scheduler_config.max_num_seqs if engine is not None else None
        self._jobs: list[_Job] = []  # every request not finished yet, in arrival order
        # reentrant: a call that ends at once runs its done-callback inside _launch, under the lock
        self._cond = threading.Condition(threading.RLock())
        self._closing = False
        self._draining = False
        self._started = False
        self._ids = itertools.count(1)
        self._aborted = 0  # requests aborted by their consumer (client gone, timeout), waiting or running
        self._last_step = time.monotonic()  # when the engine last advanced one of our requests (or one joined)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        info = getattr(self.llm, "tokenizer_info", None)
        if callable(info):  # the per-tokenizer tables of the constraint layer now, not in the first constrained request
            info().prepare()
        with self._cond:
            if self._started:
                return
            self._started = True
            self._closing = False
            self._draining = False
            for job in list(self._jobs):  # submitted before the start: they go to the engine now
                if not job.handle.wanted():
                    self._jobs.remove(job)  # timed out while held (aborted ones already left)
                elif job.call is None:
                    self._enter(job)

    def _stop_waiting(self) -> None:
        """Fail every request the engine has not admitted (call with the lock held): one not submitted yet at
        once, one in the engine's queue once its abort reaches the engine loop."""
        for job in [j for j in self._jobs if not j.admitted and not j.drained]:
            job.drained = True
            if job.call is None:
                self._jobs.remove(job)
                job.handle.publish(Failed(ServerDrainingError(_DRAINED)))
            else:
                job.call.abort()

    def drain(self) -> None:
        """Stop admitting: refuse new requests and fail the waiting ones (503 server_shutting_down); the running
        ones go on until they finish or `close` stops them."""
        with self._cond:
            self._draining = True
            self._stop_waiting()

    def close(self, timeout: float = 10.0) -> None:
        """Refuse new requests, fail the waiting ones, stop the running ones at their next step, wait for them."""
        with self._cond:
            self._closing = True
            self._stop_waiting()
            for job in list(self._jobs):  # an abort may end a call (and drop its job) at once
                job.handle._aborted = True  # stopped at its next step
                if job.call is not None and not job.drained:
                    job.call.abort()
            self._cond.wait_for(lambda: not self._jobs, timeout)
            self._started = False

    def stats(self) -> dict[str, int]:
        """Requests waiting for admission and running now, aborted ones so far (for monitoring and tests)."""
        with self._cond:
            running = sum(job.admitted for job in self._jobs)
            return {"waiting": len(self._jobs) - running, "running": running, "aborted": self._aborted}

    def check_health(self, stall_timeout: float) -> None:
        """Raise EngineUnhealthyError unless this backend takes requests and its engine advances: started, neither
        draining nor closing, and, while requests are in the engine, a step of one of them within the last
        `stall_timeout` seconds. An idle engine is healthy (its loop thread ends when idle and the next request
        starts one; a loop that failed has failed its calls and restarts the same way), so only a wedged step is a
        fault."""
        with self._cond:
            if not self._started or self._closing or self._draining:
                raise EngineUnhealthyError("the backend is not serving (not started, or shutting down)")
            in_engine = sum(job.call is not None for job in self._jobs)
            quiet = time.monotonic() - self._last_step
        if in_engine and quiet > stall_timeout:
            raise EngineUnhealthyError(f"the engine made no step for {quiet:.0f} s with {in_engine} request(s) "
                                       f"in it (stall limit {stall_timeout:g} s)")

    # ------------------------------------------------------------------ submission (event loop)
    def submit(self, request: GenerationRequest) -> RequestHandle:
        handle = RequestHandle(f"req-{next(self._ids)}", request, asyncio.get_running_loop(), self._forget)
        with self._cond:
            if self._closing or self._draining:
                raise ServerDrainingError("the server is shutting down; retry on another replica")
            waiting = sum(not job.admitted for job in self._jobs)
            if waiting >= self.max_queue:
                raise QueueFullError(f"the server's queue is full ({self.max_queue} requests waiting); "
                                     "retry later")
            job = _Job(handle, CommittedText(request.stop))
            self._jobs.append(job)
            if self._started:
                self._enter(job)
        return handle

    def _enter(self, job: _Job) -> None:
        """Hand a request to the engine (call with the lock held). One the scheduler will admit at its next step
        (a running slot is free and nobody waits ahead of it) is admitted now: it has no queue time to count;
        any other one is admitted when the engine first serves it (`on_start`)."""
        ahead = self._jobs[:self._jobs.index(job)]
        running = sum(j.admitted for j in self._jobs)
        if all(j.admitted for j in ahead) and (self._engine_limit is None or running < self._engine_limit):
            self._admit(job)
        self._launch(job)

    def _forget(self, handle: RequestHandle) -> None:
        """An aborted request leaves at once if it was not submitted yet, else the engine at its next step."""
        with self._cond:
            self._aborted += 1
            for job in self._jobs:
                if job.handle is handle:
                    if job.call is None:
                        self._jobs.remove(job)
                    else:
                        job.call.abort()
                    return

    # ------------------------------------------------------------------ engine loop
    def _launch(self, job: _Job) -> None:
        """Submit the request through `LLM.submit` (call with the lock held), whose Processor routes each field
        onto its object (SamplingParams: max_new_tokens, None being the checkpoint's canvas, temperature, seed,
        the canvas fields; the OutputConstraint the HTTP layer built)."""
        request = job.handle.request
        if all(j.call is None for j in self._jobs if j is not job):
            self._last_step = time.monotonic()  # the engine was idle: its quiet time starts now, not at its last step
        on_stream = (lambda index, update: self._stream(job, update)) if request.stream else None
        options: dict[str, Any] = {"max_new_tokens": request.max_new_tokens, "temperature": request.temperature,
                                   "seed": request.seed, **dict(request.canvas)}
        try:
            job.call = self.llm.submit(request.prompt, constraint=request.constraint, on_stream=on_stream,
                                       on_start=lambda: self._served(job),
                                       progress=lambda event: self._progress(job, event), **options)
        except BaseException as exc:  # refused before it reached the engine (bad options)
            self._jobs.remove(job)
            job.handle.publish(Failed(exc))
            return
        job.call.future.add_done_callback(lambda future, job=job: self._finished(job, future))

    @staticmethod
    def _admit(job: _Job) -> None:
        """The request is the scheduler's to run (any thread): its queue time ends."""
        job.admitted = True
        job.handle.admitted = True

    def _served(self, job: _Job) -> None:
        """The engine served the request its first step (engine loop thread)."""
        self._last_step = time.monotonic()
        self._admit(job)

    def _finished(self, job: _Job, future: Any) -> None:
        """The request's call ended (on the engine loop thread): publish its answer or error."""
        try:
            exc = future.exception()
            if job.drained and not job.admitted:
                job.handle.publish(Failed(ServerDrainingError(_DRAINED)))
            elif exc is None:
                if job.handle.wanted():
                    [result] = future.result()
                    job.handle.publish(self._complete(job, result))
                else:  # aborted or expired as it ended (e.g. by close()): no consumer may be left waiting
                    job.handle.publish(Failed(self._abort_error()))
            elif isinstance(exc, (_RequestStopped, GenerationAbortedError)):
                job.handle.publish(Failed(self._abort_error()))
            else:
                if not isinstance(exc, DllmConstrainError):  # typed errors are the request's answer, not a fault
                    log.error("engine loop: request failed", exc_info=exc)
                job.handle.publish(Failed(exc))
        except BaseException as exc:  # never leave a consumer waiting
            log.exception("engine backend: finishing a request failed")
            job.handle.publish(Failed(exc))
        finally:
            with self._cond:
                if job in self._jobs:
                    self._jobs.remove(job)
                self._cond.notify_all()

    def _abort_error(self) -> RequestAbortedError:
        if self._closing:
            return RequestAbortedError("the server is shutting down: the request was stopped before it finished "
                                       "(the server's --shutdown-timeout)")
        return RequestAbortedError("the request was aborted")

    def _progress(self, job: _Job, event: StepEvent) -> None:
        """After every engine step while the request is in the engine: stop it when it is no longer wanted; once
        it is admitted (waiting in the scheduler's queue it has not started) and its constraint has compiled
        (until then a compilation error is still a 400), announce it started."""
        self._last_step = time.monotonic()
        if not job.handle.wanted() or self._closing:
            raise _RequestStopped()
        if job.admitted and all(snapshot.constraint_ready for snapshot in event.snapshots):
            self._start(job)

    def _stream(self, job: _Job, update: StreamUpdate) -> None:
        """A streaming request's committed left prefix grew (engine loop thread, before that step's progress
        event): publish its new final text. The finished update's text is published by _complete."""
        if not update.finished:
            self._start(job)
            delta = job.text.advance(self.llm.engine.decode(update.token_ids))
            if delta:
                job.handle.publish(Delta(delta))

    @staticmethod
    def _start(job: _Job) -> None:
        if not job.started:
            job.started = True
            job.handle.publish(Started())

    def _complete(self, job: _Job, result: GenerationResult) -> Event:
        request = job.handle.request
        self._start(job)  # a request can finish without a progress event (e.g. the engine needed no step)
        text, delta, stopped = job.text.finish(result.text)
        if request.stream and delta:
            job.handle.publish(Delta(delta))
        assert job.call is not None
        prompt_tokens = len(job.call.requests[0].prompt_ids)  # the ids the engine got, not a second encoding
        completion_tokens = len(result.token_ids)  # what the model produced, before any stop string cut it
        finish = "stop" if stopped or result.finish_reason == "eos" else "length"
        return Done(Completion(text, finish, prompt_tokens, completion_tokens, result))
