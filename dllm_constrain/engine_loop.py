"""One thread that owns an `LLMEngine` and runs its continuous-batching loop for callers on any thread.

The engine is not thread-safe; `EngineLoop` makes it usable from many threads (and from asyncio) without a lock
around whole calls: `submit` puts a *call* (a build function, e.g. `EngineCall.make_requests`, and its callbacks) on
a thread-safe queue and returns a `CallHandle`. The loop thread (started lazily, a daemon, stopped by `close`):

  - idle: blocks on the queue (no polling);
  - builds each call's requests (compiles, encodes) on one builder thread beside it, so a slow compilation never
    holds the batch; calls are built, hence admitted, in submission order, and keep their requests (prompt ids);
  - admits them (`engine.add_request`): calls with different options and constraints share the continuous batch;
  - steps while anything is unfinished; resolves each call's future with its results in request order, or with its
    typed error (its other requests are aborted);
  - after every step: `on_start()` once for a call the engine first served, then each live call's progress event
    and committed-prefix stream updates (`on_stream(index, update)`); aborts calls by id (`CallHandle.abort`).

A call whose `EngineConfig` differs from the engine's (or any call on a block-diffusion model) runs alone through
`engine.generate` between two steps. Callbacks run on the loop thread: quick, and never waiting for another call
of the same loop (`EngineLoop.on_loop_thread` tells).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine, is_block_diffusion
from dllm_constrain.engine.outputs import (
    CanvasSnapshot,
    GenerationResult,
    ProgressCallback,
    RequestOutput,
    StepEvent,
    StreamUpdate,
)
from dllm_constrain.engine.state import Request, RequestState
from dllm_constrain.errors import DllmConstrainError

__all__ = ["EngineLoop", "CallHandle", "GenerationAbortedError", "StreamCallback"]

log = logging.getLogger(__name__)

StreamCallback = Callable[[int, StreamUpdate], None]  # (index of the request in its call, update)


class GenerationAbortedError(DllmConstrainError):
    """The call was aborted (`CallHandle.abort`, or the loop was closed) before it finished."""


@dataclass(eq=False)
class _Call:
    build: Callable[[], Sequence[Request]]  # runs on the loop's builder thread (compiles constraints, makes requests)
    config: EngineConfig | None
    progress: ProgressCallback | None
    on_stream: StreamCallback | None
    on_start: Callable[[], None] | None = None  # once, after the first step that served one of its requests
    future: Future = field(default_factory=Future)
    requests: list[Request] = field(default_factory=list)  # what build() made (prompt ids: token counts)
    rids: list[int] = field(default_factory=list)
    states: list[RequestState] = field(default_factory=list)
    results: dict[int, GenerationResult] = field(default_factory=dict)
    aborted: bool = False
    started: bool = False  # one of its requests took an engine step (the scheduler admitted it)

    @property
    def done(self) -> bool:
        return self.future.done()


class CallHandle:
    """The caller's side of one submitted call: `future` (list[GenerationResult] or the call's error), `abort()`.
    `future.cancel()` succeeds only while the call is still queued (the loop then skips it); once the loop took the
    call its future is running, cancel() returns False, and `abort()` is what stops it."""

    def __init__(self, loop: "EngineLoop", call: _Call) -> None:
        self._loop = loop
        self._call = call
        self.future: Future = call.future

    def result(self, timeout: float | None = None) -> list[GenerationResult]:
        """Wait for the results (in request order); an interrupted wait (KeyboardInterrupt, timeout) aborts."""
        try:
            return self.future.result(timeout)
        except BaseException:
            if not self.future.done():
                self.abort()
            raise

    def abort(self) -> None:
        """Stop the call: its waiting and running requests are removed from the engine at the loop's next turn;
        the future fails with GenerationAbortedError (unless it already ended)."""
        self._loop._command(("abort", self._call))

    def done(self) -> bool:
        return self.future.done()

    @property
    def started(self) -> bool:
        """Whether one of the call's requests took an engine step (the scheduler admitted it)."""
        return self._call.started

    @property
    def requests(self) -> list[Request]:
        """The call's requests once built (empty before): the prompt ids the engine got."""
        return self._call.requests


class EngineLoop:
    """The engine's owner thread (see the module docstring). Thread-safe: `submit`, `CallHandle.abort`, `close`."""

    def __init__(self, engine: LLMEngine, *, name: str = "dllm-engine-loop", idle_exit: float = 30.0) -> None:
        """idle_exit: seconds without work after which the thread ends (so an unused LLM can be freed)."""
        self.engine = engine
        self.name = name
        self.idle_exit = idle_exit
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        # loop-thread state
        self._owner: dict[int, tuple[_Call, int]] = {}  # engine request id -> (call, index in the call)
        self._live: list[_Call] = []  # calls with requests in the engine, in submission order
        self._building: list[_Call] = []  # calls handed to the builder thread, not back yet
        self._builder: ThreadPoolExecutor | None = None  # one thread: builds run one at a time, in order

    # ------------------------------------------------------------------ any thread
    @property
    def on_loop_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def submit(self, build: Callable[[], Sequence[Request]], *, config: EngineConfig | None = None,
               progress: ProgressCallback | None = None, on_stream: StreamCallback | None = None,
               on_start: Callable[[], None] | None = None) -> CallHandle:
        """Queue a call; `build()` runs on the loop thread and returns its requests (its exceptions fail the call).
        `config`: engine settings for this call (None or the engine's own: the continuous batch). `on_start()`:
        called once, on the loop thread, after the first step that served one of the call's requests."""
        call = _Call(build, config, progress, on_stream, on_start)
        self._command(("submit", call))
        return CallHandle(self, call)

    def _command(self, command: tuple[Any, ...]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._queue.put(command)

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the loop thread: calls still running or queued fail with GenerationAbortedError. A later submit
        starts a new thread."""
        with self._lock:
            thread = self._thread
            if thread is None or not thread.is_alive():  # nothing to stop (a stop left queued would fail a later call)
                self._thread = None
                return
            self._queue.put(("stop",))
        if thread is not threading.current_thread():
            thread.join(timeout)
        with self._lock:
            if self._thread is thread:
                self._thread = None

    # ------------------------------------------------------------------ loop thread
    def _run(self) -> None:
        """The thread's body; should the loop itself fail (a bug, not a request's error: those end their own call),
        every live and queued call fails with GenerationAbortedError instead of waiting forever."""
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - the callers must hear of it
            error = GenerationAbortedError(f"the engine loop failed: {exc!r}")
            error.__cause__ = exc
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None
                for call in list(self._live):
                    try:
                        self._abort(call, error)
                    except BaseException:  # noqa: BLE001 - the engine may be the broken part
                        self._fail(call, error)
                self._stop_builder(error)
                self._drain(error)

    def _serve(self) -> None:
        engine = self.engine
        while True:
            busy = engine.has_unfinished()
            try:
                command = self._queue.get_nowait() if busy else self._queue.get(timeout=self.idle_exit)
            except queue.Empty:
                command = None
                if not busy and not self._building:
                    with self._lock:  # idle for idle_exit seconds: end the thread (a later submit starts one)
                        if self._queue.empty():
                            if self._thread is threading.current_thread():
                                self._thread = None
                            if self._builder is not None:
                                self._builder.shutdown(wait=False)
                                self._builder = None
                            return
            while command is not None:
                if command[0] == "stop":
                    self._shutdown()
                    with self._lock:  # commands that raced with the stop fail too; later ones start a new thread
                        if self._thread is threading.current_thread():
                            self._thread = None
                        self._drain(GenerationAbortedError("the engine loop was closed"))
                    return
                self._handle(command)
                try:
                    command = self._queue.get_nowait()
                except queue.Empty:
                    command = None
            if engine.has_unfinished():
                self._step()
            elif self._live:  # cannot happen: every admitted request ends with an output of step()
                for call in list(self._live):
                    self._abort(call, GenerationAbortedError("the engine lost the call's requests"))

    def _handle(self, command: tuple[Any, ...]) -> None:
        kind, call = command[0], command[1]
        if kind == "abort":
            self._abort(call, GenerationAbortedError("the generation was aborted"))
        elif kind == "submit" and not call.aborted and call.future.set_running_or_notify_cancel():
            # its future is running now: `future.cancel()` no longer races the loop (use abort)
            self._start_build(call)
        elif kind == "built":
            if call in self._building:
                self._building.remove(call)
            if call.aborted or call.done:
                return  # aborted (or the loop closed) while it was being built: its requests never join
            requests, error = command[2], command[3]
            if error is not None:
                self._fail(call, error)
            else:
                call.requests = requests
                self._admit(call, requests)

    def _start_build(self, call: _Call) -> None:
        """Hand the call's build to the builder thread; its result comes back through the queue as "built"."""
        if self._builder is None:
            self._builder = ThreadPoolExecutor(1, thread_name_prefix=f"{self.name}-build")
        self._building.append(call)
        self._builder.submit(self._build, call)

    def _build(self, call: _Call) -> None:
        """On the builder thread: the call's requests, or the error that is its answer (typed or not)."""
        try:
            requests, error = list(call.build()), None
        except BaseException as exc:  # noqa: BLE001 - the call's own failure is its answer
            requests, error = None, exc
        self._queue.put(("built", call, requests, error))

    def _admit(self, call: _Call, requests: list[Request]) -> None:
        engine = self.engine
        try:
            if (call.config is not None and call.config != engine.config) or is_block_diffusion(engine.model):
                self._run_alone(call, requests)
                return
            for request in requests:
                rid = engine.add_request(request)
                self._owner[rid] = (call, len(call.rids))
                call.rids.append(rid)
                call.states.append(engine.request_state(rid))  # the live state (for progress snapshots)
        except BaseException as exc:  # noqa: BLE001 - the call's own failure (typed or not) is its answer
            self._abort(call, exc)
            return
        if not call.rids:
            call.future.set_result([])
            return
        self._live.append(call)

    def _run_alone(self, call: _Call, requests: list[Request]) -> None:
        """A call with its own engine settings: `engine.generate` now, the continuous batch paused meanwhile."""
        engine = self.engine
        progress, seen = call.progress, {}
        if call.on_stream is not None:
            progress = self._streaming_progress(call, engine.special.eos_id, seen)
        if call.on_start is not None:
            progress = self._starting_progress(call, progress)
        results = engine.generate(requests, progress=progress, config=call.config)  # the batch keeps its own machinery
        if call.on_stream is not None:
            for i, r in enumerate(results):
                new = r.token_ids[min(seen.get(i, 0), len(r.token_ids)):]
                self._safe_stream(call, i, StreamUpdate(i, r.token_ids, new, True))
        call.future.set_result(results)

    def _starting_progress(self, call: _Call, progress: ProgressCallback | None) -> ProgressCallback:
        """The call's progress callback, calling on_start before the first event."""

        def starting(event: StepEvent) -> None:
            self._mark_started(call)
            if progress is not None:
                progress(event)
        return starting

    def _mark_started(self, call: _Call) -> None:
        if not call.started:
            call.started = True
            if call.on_start is not None:
                try:
                    call.on_start()
                except Exception:  # a consumer's bug must not stop the loop
                    log.exception("engine loop: start callback failed")

    def _streaming_progress(self, call: _Call, eos_id: int, seen: dict[int, int]) -> ProgressCallback:
        """The call's progress callback, also streaming each request's committed prefix (`seen`: lengths sent)."""

        def progress(event: StepEvent) -> None:
            for snap in event.snapshots:
                prefix: list[int] = []
                for tok, done in zip(snap.canvas, snap.committed):
                    if not done or tok == eos_id:
                        break
                    prefix.append(tok)
                if len(prefix) > seen.get(snap.index, 0):
                    old, seen[snap.index] = seen.get(snap.index, 0), len(prefix)
                    self._safe_stream(call, snap.index, StreamUpdate(snap.index, prefix, prefix[old:], False))
            if call.progress is not None:
                call.progress(event)
        return progress

    def _safe_stream(self, call: _Call, index: int, update: StreamUpdate) -> None:
        try:
            call.on_stream(index, update)  # type: ignore[misc]
        except Exception:  # a consumer's bug must not stop the loop
            log.exception("engine loop: stream callback failed")

    def _on_stream(self, updates: list[StreamUpdate]) -> None:
        for update in updates:
            owner = self._owner.get(update.request_id)
            if owner is not None and owner[0].on_stream is not None and not owner[0].done:
                self._safe_stream(owner[0], owner[1], update)

    def _step(self) -> None:
        try:
            outputs = self.engine.step(self._on_stream)
        except BaseException as exc:  # noqa: BLE001 - a fault of the step itself (the engine dropped every request)
            log.exception("engine loop: step failed")
            for call in list(self._live):
                self._fail(call, exc)
            self._owner.clear()
            return
        ended: list[_Call] = []
        for out in outputs:
            owner = self._owner.pop(out.request_id, None)
            if owner is None:
                continue  # a request of an aborted call
            call, index = owner
            if call.done:
                continue
            if out.error is not None:
                self._abort(call, out.error)
                continue
            if out.result.finish_reason == "aborted":
                continue
            call.results[index] = out.result
            if len(call.results) == len(call.rids):
                ended.append(call)
        for call in list(self._live):
            if not call.started and not call.done and any(s.step > 0 for s in call.states):
                self._mark_started(call)
        for call in list(self._live):
            if call.progress is not None and not call.done:
                try:
                    call.progress(self._event(call))
                except BaseException as exc:  # noqa: BLE001 - the progress callback stops its own call
                    self._abort(call, exc)
                    continue
        for call in ended:
            if not call.done:
                self._live.remove(call)
                call.future.set_result([call.results[i] for i in range(len(call.rids))])

    def _event(self, call: _Call) -> StepEvent:
        mask_id = self.engine.special.mask_id
        snaps = [CanvasSnapshot(i, s.canvas_view(mask_id), s.committed.tolist(), s.done, s.pending is None)
                 for i, s in enumerate(call.states)]
        return StepEvent(step=max(s.step for s in call.states), snapshots=snaps, mask_id=mask_id)

    def _abort(self, call: _Call, error: BaseException) -> None:
        """End a call with `error`: its requests still in the engine are aborted."""
        call.aborted = True
        for rid in call.rids:
            if self._owner.pop(rid, None) is not None:
                self.engine.abort(rid)
        self._fail(call, error)

    def _fail(self, call: _Call, error: BaseException) -> None:
        if call in self._live:
            self._live.remove(call)
        try:
            call.future.set_exception(error)
        except InvalidStateError:  # it already ended, or a queued call's future was cancelled meanwhile
            pass

    def _stop_builder(self, error: BaseException) -> None:
        """Fail the calls still being built (their builds finish on the builder thread and are dropped) and let the
        builder thread end."""
        for call in list(self._building):
            call.aborted = True
            self._fail(call, error)
        self._building.clear()
        if self._builder is not None:
            self._builder.shutdown(wait=False)
            self._builder = None

    def _drain(self, error: BaseException) -> None:
        """Fail the calls still queued."""
        while True:
            try:
                command = self._queue.get_nowait()
            except queue.Empty:
                return
            if command[0] == "submit":
                self._fail(command[1], error)

    def _shutdown(self) -> None:
        error = GenerationAbortedError("the engine loop was closed")
        for call in list(self._live):
            self._abort(call, error)
        self._stop_builder(error)
        self._drain(error)
        while self.engine.has_unfinished():  # deliver the aborted requests' outputs, freeing their slots
            try:
                self.engine.step()
            except BaseException:  # noqa: BLE001 - the engine dropped its requests
                break


def wait_all(handles: Sequence[CallHandle], timeout: float | None = None) -> list[list[GenerationResult]]:
    """Results of several handles (for tests and scripts): raises the first error, TimeoutError past `timeout`."""
    deadline = None if timeout is None else time.monotonic() + timeout
    out = []
    for h in handles:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        out.append(h.result(left))
    return out
