"""The public API from many threads and from asyncio: every call goes through the LLM's engine loop (one thread owns
the engine, calls share its continuous batch), and each result equals the single-threaded one for its seed."""
from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import dllm_constrain as dc
from dllm_constrain.api import generate_options
from dllm_constrain.engine_loop import GenerationAbortedError
from dllm_constrain.errors import DllmConstrainError, InvalidRequestError

WAIT = 120.0  # seconds: every wait is bounded, so a bug fails the test instead of hanging the suite
NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
               "required": ["name", "age"]}
CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
JOBS: list[dict[str, Any]] = [
    dict(prompt="Name Ada, age 36", schema=NAME_SCHEMA, seed=0),
    dict(prompt="What is 3 plus 4?", regex="[0-9]+", seed=1),
    dict(prompt="Bob is 41 years old", schema=NAME_SCHEMA, temperature=0.7, seed=2),
    dict(prompt="Paris is a city", schema=CITY_SCHEMA, seed=3),
    dict(prompt="Give a date", regex="[0-9]{4}-[0-9]{2}-[0-9]{2}", temperature=0.9, seed=4),
    dict(prompt="Say something", seed=5, temperature=0.5),
    dict(prompt="Name Eve, age 22", schema=NAME_SCHEMA, temperature=1.0, seed=6),
    dict(prompt="What is 10 minus 2?", regex="[0-9]+", policy="quota", seed=7),
]
MAX_NEW = 32


@pytest.fixture(scope="module")
def llm() -> dc.LLM:
    return dc.LLM()


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    """Each job run alone through the engine directly (the path before the engine loop existed)."""
    ref = dc.LLM()
    out = []
    for job in JOBS:
        job = dict(job)
        call = ref.processor.build(job.pop("prompt"), **generate_options({"max_new_tokens": MAX_NEW, **job}))
        [result] = ref.engine.generate(call.make_requests(), config=call.config)
        out.append(result.token_ids)
    return out


def _call(llm: dc.LLM, i: int, via: str) -> dc.GenerationResult:
    job = dict(JOBS[i])
    prompt = job.pop("prompt")
    if via == "dc":
        return dc.generate(prompt, model=llm, max_new_tokens=MAX_NEW, return_result=True, **job)
    [result] = llm.generate([prompt], max_new_tokens=MAX_NEW, **job)
    return result


def _run_threads(fns: list[Any]) -> list[Any]:
    """Run the callables on as many threads, started together; every result waited for with a bound."""
    barrier = threading.Barrier(len(fns))

    def run(fn: Any) -> Any:
        barrier.wait(WAIT)
        return fn()

    pool = ThreadPoolExecutor(len(fns))
    try:
        futures = [pool.submit(run, fn) for fn in fns]
        return [f.result(WAIT) for f in futures]
    finally:
        pool.shutdown(wait=False)


def test_eight_threads_get_the_single_threaded_results(llm: dc.LLM, reference: list[list[int]]) -> None:
    fns = [lambda i=i: _call(llm, i, "dc" if i % 2 else "llm") for i in range(len(JOBS))]
    for _ in range(2):  # twice: the second round joins an engine loop that has already run
        results = _run_threads(fns)
        assert [r.token_ids for r in results] == reference
        assert [r.text for r in results] == [llm.engine.decode(ids) for ids in reference]
        assert all(r.finish_reason in ("eos", "length") for r in results)


def test_concurrent_errors_are_typed_and_leave_the_others_alone(llm: dc.LLM, reference: list[list[int]]) -> None:
    def too_long() -> Any:
        return dc.generate("x", model=llm, regex="[0-9]{50}", max_new_tokens=8)

    def bad_schema() -> Any:
        return dc.generate("x", model=llm, schema="{not json", max_new_tokens=8)

    def huge_prompt() -> Any:
        return dc.generate("word " * 3000, model=llm, max_new_tokens=8)

    def catch(fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - the test checks the type
            return exc

    fns = [lambda fn=fn: catch(fn) for fn in (too_long, bad_schema, huge_prompt)]
    fns += [lambda i=i: _call(llm, i, "llm") for i in range(4)]
    out = _run_threads(fns)
    assert all(isinstance(e, DllmConstrainError) for e in out[:3]), out[:3]
    assert [r.token_ids for r in out[3:]] == reference[:4]


def test_a_call_with_its_own_engine_settings_runs_correctly_beside_the_batch(llm: dc.LLM) -> None:
    job = dict(JOBS[0])
    prompt = job.pop("prompt")
    alone = llm.generate(prompt, max_new_tokens=MAX_NEW, kv_cache="none", **job)[0].token_ids
    fns = [lambda: llm.generate(prompt, max_new_tokens=MAX_NEW, kv_cache="none", **job)[0].token_ids]
    fns += [lambda i=i: _call(llm, i, "llm").token_ids for i in range(1, 4)]
    out = _run_threads(fns)
    assert out[0] == alone
    assert out[1:] == [_call(llm, i, "llm").token_ids for i in range(1, 4)]


def test_progress_is_routed_to_its_own_call(llm: dc.LLM) -> None:
    events: dict[str, list[Any]] = {"a": [], "b": []}

    def ask(key: str, prompts: list[str]) -> list[Any]:
        return llm.generate(prompts, regex="[0-9]+", max_new_tokens=16, seed=1,
                            progress=lambda ev: events[key].append(ev))

    a, b = _run_threads([lambda: ask("a", ["What is 1 plus 1?"]), lambda: ask("b", ["Two?", "Three?", "Four?"])])
    assert len(a) == 1 and len(b) == 3
    for key, n in (("a", 1), ("b", 3)):
        assert events[key], key
        assert all([s.index for s in ev.snapshots] == list(range(n)) for ev in events[key])
        assert all(s.done for s in events[key][-1].snapshots)


def test_generate_inside_a_progress_callback_is_a_typed_error(llm: dc.LLM) -> None:
    seen: list[Any] = []

    def progress(event: Any) -> None:
        if not seen:
            try:
                llm.generate("again", max_new_tokens=8)
            except InvalidRequestError as exc:
                seen.append(exc)

    llm.submit("What is 3 plus 4?", regex="[0-9]+", max_new_tokens=8, progress=progress).result(WAIT)
    assert len(seen) == 1 and "loop thread" in str(seen[0])


def _submit_holding_the_loop(llm: dc.LLM) -> tuple[threading.Event, Any]:
    """Submit JOBS[1] with a progress hook that holds the loop thread at its first step until the returned gate
    is set; returns once the loop is held."""
    gate = threading.Event()
    held = threading.Event()

    def hold(event: Any) -> None:
        if not gate.is_set():
            held.set()
            assert gate.wait(WAIT)

    job = dict(JOBS[1])
    handle = llm.submit(job.pop("prompt"), max_new_tokens=MAX_NEW, progress=hold, **job)
    assert held.wait(WAIT)
    return gate, handle


def test_abort_of_a_pending_and_of_a_running_request(llm: dc.LLM, reference: list[list[int]]) -> None:
    gate, first = _submit_holding_the_loop(llm)
    pending = llm.submit("What is 5 plus 5?", regex="[0-9]+", max_new_tokens=MAX_NEW)
    pending.abort()
    started = threading.Event()
    running_handle: list[Any] = []

    def abort_self(event: Any) -> None:
        started.set()
        running_handle[0].abort()

    running_handle.append(llm.submit("What is 6 plus 6?", regex="[0-9]+", max_new_tokens=MAX_NEW,
                                     progress=abort_self))
    gate.set()
    with pytest.raises(GenerationAbortedError):
        pending.result(WAIT)
    with pytest.raises(GenerationAbortedError):
        running_handle[0].result(WAIT)
    assert started.is_set()
    assert first.result(WAIT)[0].token_ids == reference[1]
    # the engine is empty again and still serves new calls
    assert _call(llm, 3, "dc").token_ids == reference[3]


def test_cancelling_a_future_skips_a_queued_call_and_cannot_race_a_taken_one(llm: dc.LLM,
                                                                             reference: list[list[int]]) -> None:
    gate, taken = _submit_holding_the_loop(llm)
    queued = llm.submit("What is 5 plus 5?", regex="[0-9]+", max_new_tokens=MAX_NEW)
    assert not taken.future.cancel() and taken.future.running()  # the loop took it: abort() stops it, not cancel()
    assert queued.future.cancel()
    gate.set()
    assert taken.result(WAIT)[0].token_ids == reference[1]
    assert queued.future.cancelled()
    assert _call(llm, 3, "dc").token_ids == reference[3]  # the loop skipped the cancelled call and still serves


def test_async_generate_equals_sync_and_stream_concatenates_to_the_text(llm: dc.LLM) -> None:
    allm = dc.AsyncLLM(llm)

    async def scenario() -> tuple[list[Any], list[list[str]]]:
        results = await asyncio.wait_for(asyncio.gather(*(
            allm.generate(j["prompt"], max_new_tokens=MAX_NEW, **{k: v for k, v in j.items() if k != "prompt"})
            for j in JOBS[:4])), WAIT)

        async def collect(j: dict[str, Any]) -> list[str]:
            return [d async for d in allm.stream(j["prompt"], max_new_tokens=MAX_NEW,
                                                 **{k: v for k, v in j.items() if k != "prompt"})]

        deltas = await asyncio.wait_for(asyncio.gather(*(collect(j) for j in JOBS[:4])), WAIT)
        return list(results), list(deltas)

    results, deltas = asyncio.run(scenario())
    sync = [_call(llm, i, "llm") for i in range(4)]
    assert [r.token_ids for r in results] == [r.token_ids for r in sync]
    assert ["".join(d) for d in deltas] == [r.text for r in sync]
    assert any(len(d) > 1 for d in deltas)  # the text arrives in pieces, not only at the end


def test_async_errors_are_typed_and_cancel_aborts(llm: dc.LLM) -> None:
    allm = dc.AsyncLLM(llm)

    async def scenario() -> None:
        with pytest.raises(dc.api.ConstraintTooLongError):
            await asyncio.wait_for(allm.generate("x", regex="[0-9]{50}", max_new_tokens=8), WAIT)
        task = asyncio.ensure_future(allm.generate("What is 3 plus 4?", max_new_tokens=MAX_NEW))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        r = await asyncio.wait_for(allm.generate("What is 3 plus 4?", regex="[0-9]+", max_new_tokens=8), WAIT)
        assert r.text.isdigit()

    asyncio.run(scenario())


def test_closing_the_loop_fails_unfinished_calls_and_a_later_call_starts_it_again(llm: dc.LLM,
                                                                                 reference: list[list[int]]) -> None:
    gate = threading.Event()
    held = threading.Event()

    def hold(event: Any) -> None:
        held.set()
        assert gate.wait(WAIT)

    running = llm.submit("What is 3 plus 4?", max_new_tokens=MAX_NEW, progress=hold)
    assert held.wait(WAIT)
    queued = llm.submit("What is 5 plus 5?", regex="[0-9]+", max_new_tokens=MAX_NEW)
    closer = threading.Thread(target=llm.close, daemon=True)
    closer.start()
    gate.set()
    closer.join(WAIT)
    assert not closer.is_alive()
    for handle in (running, queued):
        with pytest.raises(GenerationAbortedError):
            handle.result(WAIT)
    assert not llm.engine.has_unfinished()
    assert _call(llm, 2, "llm").token_ids == reference[2]


def test_a_failure_of_the_loop_itself_fails_its_calls_instead_of_leaving_them_waiting(reference: list[list[int]]) -> None:
    own = dc.LLM()  # its own loop: the fault below must not touch the shared fixture's
    loop = own._engine_loop()

    def broken_step() -> None:
        raise RuntimeError("a fault inside the loop")

    loop._step = broken_step  # type: ignore[method-assign]
    handle = own.submit("What is 3 plus 4?", max_new_tokens=MAX_NEW)
    with pytest.raises(GenerationAbortedError, match="engine loop failed"):
        handle.result(WAIT)
    del loop._step  # the instance attribute goes, the method is back: a new thread serves the next call
    own.close()  # the failed thread is gone: nothing to stop, and no stop left queued for the next one
    assert _call(own, 2, "llm").token_ids == reference[2]
    own.close()


@contextlib.contextmanager
def _llm_with_a_held_compile(gated_regex: str) -> Iterator[tuple[dc.LLM, threading.Event, threading.Event]]:
    """An LLM of its own whose compilation of `gated_regex` waits for the yielded gate (a compile of seconds); the
    second event is set once that compilation started. On exit the gate opens and the LLM's loop is closed."""
    own = dc.LLM()
    gate, compiling = threading.Event(), threading.Event()
    real = own.compile_constraint

    def held_compile(constraint: Any) -> Any:
        if getattr(constraint, "regex", None) == gated_regex:
            compiling.set()
            assert gate.wait(WAIT)
        return real(constraint)

    own.compile_constraint = held_compile  # type: ignore[method-assign]
    try:
        yield own, gate, compiling
    finally:
        gate.set()
        own.close()


def test_a_slow_compilation_does_not_hold_the_requests_already_running(reference: list[list[int]]) -> None:
    with _llm_with_a_held_compile("[0-9]{3}") as (own, gate, compiling):
        stepping = threading.Event()
        job = dict(JOBS[1])
        running = own.submit(job.pop("prompt"), max_new_tokens=MAX_NEW, progress=lambda e: stepping.set(), **job)
        assert stepping.wait(WAIT)
        slow = own.submit("Give three digits", regex="[0-9]{3}", max_new_tokens=8)
        assert compiling.wait(WAIT)
        assert running.result(WAIT)[0].token_ids == reference[1]  # finished while the compilation was held
        assert not slow.done()
        gate.set()
        [r] = slow.result(WAIT)
        assert len(r.text) == 3 and r.text.isdigit()


def test_a_call_aborted_while_its_constraint_compiles_fails_and_never_joins_the_batch() -> None:
    with _llm_with_a_held_compile("[a-z]{4}") as (own, gate, compiling):
        slow = own.submit("Give a word", regex="[a-z]{4}", max_new_tokens=8)
        assert compiling.wait(WAIT)
        slow.abort()
        with pytest.raises(GenerationAbortedError):
            slow.result(WAIT)  # at once: the build is still held
        gate.set()
        [r] = own.generate(["What is 3 plus 4?"], regex="[0-9]+", max_new_tokens=8)
        assert r.text.isdigit()
        assert not own.engine.has_unfinished()


def test_closing_the_loop_fails_a_call_whose_constraint_is_compiling() -> None:
    with _llm_with_a_held_compile("[a-z]{5}") as (own, _gate, compiling):
        slow = own.submit("Give a word", regex="[a-z]{5}", max_new_tokens=8)
        assert compiling.wait(WAIT)
        own.close()
        with pytest.raises(GenerationAbortedError):
            slow.result(WAIT)
