"""asyncio front end: `AsyncLLM` awaits generations and streams committed text, on the LLM's engine loop.

    llm = dc.AsyncLLM()                                   # the bundled model (or a path, an LLM, a loaded model)
    result = await llm.generate("Name Ada, age 36", schema={...}, max_new_tokens=32)
    async for delta in llm.stream("Name Ada, age 36", schema={...}):
        print(delta, end="")                               # final text only: the committed left prefix grows

Requests are submitted to the same engine loop as `LLM.generate` (dllm_constrain.engine_loop), so coroutines,
threads and the synchronous API share one continuous batch; results reach the event loop through
`loop.call_soon_threadsafe`. Cancelling a coroutine (or leaving a stream early) aborts its request.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from dllm_constrain.api import LLM, GenerationResult, _resolve_llm
from dllm_constrain.engine.outputs import StreamUpdate
from dllm_constrain.engine.state import SamplingParams
from dllm_constrain.engine_loop import CallHandle
from dllm_constrain.errors import InvalidRequestError
from dllm_constrain.options import is_single_prompt

__all__ = ["AsyncLLM"]

_DONE = object()


def _await_handle(handle: CallHandle, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
    """An asyncio future resolved (through call_soon_threadsafe) with the handle's outcome."""
    fut: asyncio.Future = loop.create_future()

    def settle(done: Any) -> None:
        if fut.cancelled():
            return
        exc = done.exception()
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(done.result())

    def on_done(done: Any) -> None:  # runs on the engine loop thread
        try:
            loop.call_soon_threadsafe(settle, done)
        except RuntimeError:  # the event loop is closed: nobody is waiting any more
            pass

    handle.future.add_done_callback(on_done)
    return fut


class AsyncLLM:
    """An `LLM` for asyncio code. `model`: None (the bundled checkpoint), a checkpoint folder, an `LLM` or a
    loaded checkpoint, as for `dc.generate`."""

    def __init__(self, model: Any = None) -> None:
        self.llm: LLM = _resolve_llm(model)

    @staticmethod
    def _single(prompt: Any) -> Any:
        if not is_single_prompt(prompt):
            raise InvalidRequestError(f"AsyncLLM takes one prompt (a string or one conversation), got a "
                                      f"{type(prompt).__name__} (gather several generate() calls for many)")
        return prompt

    async def generate(self, prompt: str, sampling_params: SamplingParams | None = None,
                       **options: Any) -> GenerationResult:
        """The GenerationResult for one prompt (sampling_params and options as for `LLM.generate`, routed the
        same way; `progress` is called on the engine loop thread). Raises the same typed errors."""
        handle = self.llm.submit(self._single(prompt), sampling_params, **options)
        try:
            [result] = await _await_handle(handle, asyncio.get_running_loop())
        except asyncio.CancelledError:
            handle.abort()
            raise
        return result

    async def stream(self, prompt: str, sampling_params: SamplingParams | None = None,
                     **options: Any) -> AsyncIterator[str]:
        """Text deltas of the answer's committed left prefix as it grows (only complete UTF-8 characters, never
        revised); their concatenation is the final `GenerationResult.text`. Raises the request's error."""
        from dllm_constrain.serve.streaming import CommittedText

        loop = asyncio.get_running_loop()
        updates: asyncio.Queue[Any] = asyncio.Queue()

        def on_stream(index: int, update: StreamUpdate) -> None:  # engine loop thread
            try:
                loop.call_soon_threadsafe(updates.put_nowait, list(update.token_ids))
            except RuntimeError:
                pass

        handle = self.llm.submit(self._single(prompt), sampling_params, on_stream=on_stream, **options)
        done = _await_handle(handle, loop)
        done.add_done_callback(lambda _: updates.put_nowait(_DONE))
        text = CommittedText()
        decode = self.llm.engine.decode
        finished = False
        try:
            while True:
                item = await updates.get()
                if item is _DONE:
                    break
                delta = text.advance(decode(item))
                if delta:
                    yield delta
            [result] = done.result()  # raises the request's error
            _, delta, _ = text.finish(result.text)
            finished = True
            if delta:
                yield delta
        finally:
            if not finished:
                if not handle.done():
                    handle.abort()
                _settle_unread(done)


def _settle_unread(done: asyncio.Future) -> None:
    """A stream left early never reads its request's outcome (the abort's GenerationAbortedError, or an error that
    arrived meanwhile): mark it read, so asyncio does not log "Future exception was never retrieved". A future not
    resolved yet is cancelled: `settle` then drops the outcome when it arrives."""
    if done.done():
        if not done.cancelled():
            done.exception()
    else:
        done.cancel()
