"""`AsyncLLM.stream` left early (break, aclose, cancellation): its request is aborted and its outcome (the abort's
error) is read, so asyncio never reports "Future exception was never retrieved"."""
from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

import dllm_constrain as dc

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.fixture(scope="module")
def allm() -> Any:
    return dc.AsyncLLM()


def _unretrieved(run: Any) -> list[str]:
    """The asyncio error reports made while `run()` runs on a fresh loop (the leftovers collected before it ends)."""
    reports: list[str] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reports.append(ctx.get("message", "")))
        await run()
        await asyncio.sleep(0.5)  # the abort's outcome arrives from the engine loop thread
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(main())
    return reports


def test_a_stream_left_after_its_first_delta_leaves_no_unretrieved_exception(allm: Any) -> None:
    async def run() -> None:
        for _ in range(2):
            stream = allm.stream("Name Ada, age 36", schema=SCHEMA, max_new_tokens=48)
            async for _delta in stream:
                break
            await stream.aclose()

    assert _unretrieved(run) == []


def test_a_cancelled_stream_leaves_no_unretrieved_exception(allm: Any) -> None:
    async def consume() -> None:
        async for _delta in allm.stream("Name Ada, age 36", schema=SCHEMA, max_new_tokens=48):
            await asyncio.sleep(10)

    async def run() -> None:
        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    assert _unretrieved(run) == []


def test_a_stream_read_to_the_end_still_gives_the_whole_answer(allm: Any) -> None:
    async def run() -> tuple[str, str]:
        text = "".join([d async for d in allm.stream("Name Ada, age 36", schema=SCHEMA, max_new_tokens=48, seed=1)])
        result = await allm.generate("Name Ada, age 36", schema=SCHEMA, max_new_tokens=48, seed=1)
        return text, result.text

    streamed, whole = asyncio.run(run())
    assert streamed == whole
