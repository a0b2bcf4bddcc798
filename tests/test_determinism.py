"""The same request and seed give the same answer whatever the clock, the load, the thread, the compile cache and the
batch-mates: every allowance that decides which tokens a constraint allows (or whether it compiles) counts work, and
the wall clock only ends a request with a typed timeout error (docs/constraints.md, "Reproducibility")."""
from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

import dllm_constrain as dc
from dllm_constrain.constraints.compiler import ConstraintCompiler
from dllm_constrain.errors import CompilationWorkLimitError, ConstraintTimeoutError

ONE_OF = {"oneOf": [{"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                     "required": ["city"], "additionalProperties": False},
                    {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
                     "required": ["n", "ok"], "additionalProperties": False}]}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}}},
          "required": ["name", "age", "tags"]}
GRAMMAR = 'start: "(" item ("," item)* ")"\nitem: /[a-z]+/ | NUMBER\n%import common.NUMBER\n'
JOBS = [dict(prompt="Which city is the capital of Norway?", schema=ONE_OF, seed=0),
        dict(prompt="Name Ada, age 36", schema=PERSON, seed=1, temperature=0.8),
        dict(prompt="A tuple of words", grammar=GRAMMAR, seed=2),
        dict(prompt="Paris is a city", schema=PERSON, seed=3)]
MAX_NEW = 24


@contextmanager
def jumping_clock(step_s: float = 5.0) -> Iterator[None]:
    """time.perf_counter / time.monotonic jump `step_s` forward at every read: any allowance still read off the clock
    would run out at once."""
    real_pc, real_mono = time.perf_counter, time.monotonic
    ticks = itertools.count()
    time.perf_counter = lambda: real_pc() + step_s * next(ticks)  # type: ignore[assignment]
    time.monotonic = lambda: real_mono() + step_s * next(ticks)  # type: ignore[assignment]
    try:
        yield
    finally:
        time.perf_counter, time.monotonic = real_pc, real_mono  # type: ignore[assignment]


@contextmanager
def cpu_hog(threads: int = 3) -> Iterator[None]:
    """Busy threads spinning beside the test (a loaded machine)."""
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x = (x * 31 + 7) % 1_000_003

    ts = [threading.Thread(target=spin, daemon=True) for _ in range(threads)]
    for t in ts:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in ts:
            t.join(timeout=10)


def walk_masks(compiled, seed: int, n: int = 24, steps: int = 10) -> list[bytes]:
    """A seeded walk on a canvas: at each step the masks of every open position, then a few commits chosen by the
    seed among the allowed tokens (verified by select_commits). Returns the masks' bytes, step by step."""
    rng = random.Random(seed)
    mask_id = compiled.mask_id
    st = compiled.new_canvas_state(n, timeout_s=None)
    canvas = [mask_id] * n
    out = []
    for _ in range(steps):
        open_pos = [i for i, t in enumerate(canvas) if t == mask_id]
        if not open_pos:
            break
        rows = st.allowed_tokens(canvas, open_pos)
        out.append(rows.numpy().tobytes())
        proposals = []
        for j, p in enumerate(open_pos):
            toks = rows[j].nonzero().flatten().tolist()
            if toks:
                proposals.append((p, rng.choice(toks), rng.random()))
        for p, t in st.select_commits(canvas, proposals[:3]):
            canvas[p] = t
    return out


@pytest.fixture(scope="module")
def llm() -> dc.LLM:
    return dc.LLM()


@pytest.fixture(scope="module")
def info(llm):
    return llm.tokenizer_info()


def test_regular_masks_are_the_same_cold_warm_and_under_a_jumping_clock(info) -> None:
    cold = ConstraintCompiler(info, cache=False).compile_json_schema(PERSON)
    reference = walk_masks(cold, seed=7)
    warm = ConstraintCompiler(info, cache=False).compile_json_schema(PERSON)
    for s in range(4):  # other requests explore (and number) the automaton's states first
        walk_masks(warm, seed=100 + s)
    assert walk_masks(warm, seed=7) == reference
    fresh = ConstraintCompiler(info, cache=False).compile_json_schema(PERSON)  # compiled on the real clock
    with jumping_clock():
        assert walk_masks(fresh, seed=7) == reference


def test_masks_from_several_threads_equal_the_serial_ones(info) -> None:
    compiled = ConstraintCompiler(info, cache=False).compile_json_schema(ONE_OF)
    serial = {s: walk_masks(ConstraintCompiler(info, cache=False).compile_json_schema(ONE_OF), seed=s)
              for s in range(4)}
    with cpu_hog(), ThreadPoolExecutor(4) as pool:
        got = dict(zip(range(4), pool.map(lambda s: walk_masks(compiled, seed=s), range(4))))
    assert got == serial


def test_a_compilation_past_its_work_limit_fails_the_same_way_under_load(info, monkeypatch) -> None:
    from dllm_constrain.constraints import compiler as compiler_mod

    big = {"type": "object", "properties": {f"k{i}": {"type": "string", "maxLength": 20} for i in range(30)}}
    monkeypatch.setattr(compiler_mod, "COMPILE_WORK", 5)

    def attempt() -> str:
        with pytest.raises(CompilationWorkLimitError) as e:
            ConstraintCompiler(info, cache=False).compile_json_schema(big)
        return str(e.value)

    first = attempt()
    assert "exceeded its work limit of 5 steps" in first
    with cpu_hog():
        assert attempt() == first
    monkeypatch.setattr(compiler_mod, "COMPILE_WORK", 200_000)
    assert ConstraintCompiler(info, cache=False).compile_json_schema(big) is not None


def test_a_lark_frontier_row_past_its_deadline_raises_and_is_counted(llm) -> None:
    compiled = llm.compile(grammar=GRAMMAR)
    st = compiled.new_canvas_state(16, timeout_s=1.0)
    canvas = [compiled.mask_id] * 16
    with jumping_clock():
        with pytest.raises(ConstraintTimeoutError):
            st.allowed_tokens(canvas, list(range(16)))
    assert st.stats["deadline_hits"] == 1


def _run(llm: dc.LLM, job: dict) -> list[int]:
    job = dict(job)
    [r] = llm.generate([job.pop("prompt")], max_new_tokens=MAX_NEW, **job)
    return r.token_ids


def test_generations_are_the_same_from_threads_under_load_cold_and_warm_and_in_any_batch(llm) -> None:
    reference = [_run(dc.LLM(), job) for job in JOBS]  # each alone, on a fresh LLM
    with cpu_hog(), ThreadPoolExecutor(len(JOBS)) as pool:
        threaded = list(pool.map(lambda job: _run(llm, job), JOBS))
    assert threaded == reference
    warm = [_run(llm, job) for job in JOBS]  # every constraint compiled and explored by now
    assert warm == reference
    for job, ref in zip(JOBS, reference):
        results = llm.generate([j["prompt"] for j in JOBS], max_new_tokens=MAX_NEW,
                               **{k: v for k, v in job.items() if k != "prompt"})
        assert results[JOBS.index(job)].token_ids == ref  # the same request beside three batch-mates


def _engine_run(llm: dc.LLM, job: dict, **config_changes) -> list[int]:
    from dataclasses import replace

    from dllm_constrain.api import generate_options

    job = dict(job)
    call = llm.processor.build(job.pop("prompt"), **generate_options({"max_new_tokens": MAX_NEW, **job}))
    [result] = llm.engine.generate(call.make_requests(), config=replace(call.config, **config_changes))
    return result.token_ids


def test_masks_on_a_worker_thread_give_the_serial_tokens_when_no_token_is_forced(llm) -> None:
    # with forced_tokens=True a worker step commits forced tokens after the forward instead of before it (another,
    # valid path: engine.llm_engine, "Forced tokens"); without them both paths commit through the same masks
    for job in JOBS:
        job = dict(job, forced_tokens=False)
        assert _engine_run(llm, job, mask_workers=1) == _engine_run(llm, job, mask_workers=0)


def test_a_work_limit_refusal_is_cached_since_the_same_constraint_meets_it_again(info, monkeypatch) -> None:
    from dllm_constrain.constraints import compiler as compiler_mod
    from dllm_constrain.constraints.compile_cache import CompileCache

    big = {"type": "object", "properties": {f"k{i}": {"type": "string", "maxLength": 20} for i in range(30)}}
    monkeypatch.setattr(compiler_mod, "COMPILE_WORK", 5)
    cache = CompileCache()
    compiler = ConstraintCompiler(info, cache=cache)
    messages = []
    for _ in range(2):
        with pytest.raises(CompilationWorkLimitError) as e:
            compiler.compile_json_schema(big)
        messages.append(str(e.value))
    assert messages[0] == messages[1] and len(cache) == 1 and cache.misses == 1
