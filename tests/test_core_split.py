"""Cores for the GIL-free forward and for the Python threads beside it (EngineConfig.core_split, engine.core_split).

Specifications:
  * the plan: the helper threads get the highest-numbered usable core and the forward the others; by default
    (None) only when a core is left over beside torch's intra-op threads, with True whenever there are two cores,
    with False or a single core never;
  * a split's two core sets are non-empty and disjoint;
  * in a loop with the GIL-free forward on the CPU, torch's pool threads end on the forward cores, and the mask
    workers and a compilation the loop starts beside its forward run on the helper cores; the outputs are those of
    the same loop without the split;
  * a loop without the GIL-free forward, or with core_split=False, has no split, and a compile thread that an
    earlier loop's split pinned goes back to every core;
  * a bad value is a typed error.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import build_tiny_llada, build_tiny_tokenizer
from hypothesis import given
from hypothesis import strategies as st

from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.core_split import FORWARD_THREAD_NAME, CoreSplit, plan_core_split
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.placement import usable_cpus
from dllm_constrain.engine.state import PendingConstraint, Request, SamplingParams
from dllm_constrain.errors import InvalidRequestError

needs_two_cores = pytest.mark.skipif(len(usable_cpus()) < 2 or not hasattr(os, "sched_setaffinity"),
                                     reason="a core split needs two usable cores and per-thread affinity (Linux)")
MODEL = build_tiny_llada()
TOKENIZER = build_tiny_tokenizer()
COMPILER = ConstraintCompiler(TokenizerInfo.from_tokenizer(TOKENIZER, eos_id=1, mask_id=3, vocab_size=260))
SCHEMA = COMPILER.compile_json_schema({"type": "object", "properties": {"n": {"type": "integer"}},
                                      "required": ["n"], "additionalProperties": False})


@pytest.fixture(autouse=True)
def _thread_cores_restored():
    """Every thread of the process gets back the cores it had: a split outlives the engine that made it."""
    before = {}
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
        try:
            before[int(tid)] = os.sched_getaffinity(int(tid))
        except OSError:
            pass
    yield
    for tid, cores in before.items():
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:
            pass


@given(cores=st.frozensets(st.integers(0, 63), min_size=2, max_size=16), threads=st.integers(1, 16))
def test_the_helpers_get_the_highest_core_and_the_forward_the_others(cores, threads) -> None:
    split = plan_core_split(cores, threads, True)
    assert split is not None
    assert split.helpers == {max(cores)} and split.forward == cores - {max(cores)}


@given(cores=st.frozensets(st.integers(0, 63), min_size=2, max_size=16), threads=st.integers(1, 16))
def test_by_default_a_core_is_split_off_only_when_torch_threads_leave_one_over(cores, threads) -> None:
    split = plan_core_split(cores, threads, None)
    assert (split is not None) == (threads <= len(cores) - 1)


@pytest.mark.parametrize("mode", [None, True, False])
def test_one_core_or_false_never_splits(mode) -> None:
    assert plan_core_split(frozenset({3}), 1, mode) is None
    assert plan_core_split(frozenset({0, 1, 2}), 1, False) is None


def test_a_split_needs_two_disjoint_non_empty_sets() -> None:
    for forward, helpers in (({0, 1}, {1}), (set(), {1}), ({0}, set())):
        with pytest.raises(ValueError, match="disjoint"):
            CoreSplit(frozenset(forward), frozenset(helpers))


def test_a_bad_value_is_a_typed_error() -> None:
    with pytest.raises(InvalidRequestError, match="core_split"):
        EngineConfig(core_split="yes").validate()


def _requests(compile_executor: ThreadPoolExecutor, seen: dict[str, set[int]]) -> list[Request]:
    """A constrained request whose constraint compiles beside the first forward (recording the cores it compiled
    on), and an unconstrained one."""
    def compile_schema():
        seen["compile"] = os.sched_getaffinity(0)
        return SCHEMA

    params = SamplingParams(max_new_tokens=12, block_length=6, temperature=0.0, policy="threshold", threshold=0.3,
                            forced_tokens=False)
    return [Request([70, 71], params, PendingConstraint(compile_executor, compile_schema)),
            Request([100, 101], SamplingParams(max_new_tokens=8, block_length=4, temperature=0.0))]


def _record_mask_cores(engine: LLMEngine, seen: dict[str, set[int]]) -> None:
    allowed = engine.structured.allowed

    def recorded(s, view, positions):
        if threading.current_thread().name.startswith("dllm-masks"):
            seen["masks"] = os.sched_getaffinity(0)
        return allowed(s, view, positions)

    engine.structured.allowed = recorded


def _forward_thread_cores() -> list[set[int]]:
    cores = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == FORWARD_THREAD_NAME:
                    cores.append(os.sched_getaffinity(int(tid)))
        except OSError:
            pass
    return cores


@needs_two_cores
def test_the_forward_and_the_helpers_run_on_their_own_cores() -> None:
    engine = LLMEngine(MODEL, TOKENIZER)
    seen: dict[str, set[int]] = {}
    _record_mask_cores(engine, seen)
    with ThreadPoolExecutor(1) as compile_executor:
        results = engine.generate(_requests(compile_executor, seen), config=EngineConfig(mask_workers=1,
                                                                                           core_split=True))
    split = engine.core_split
    assert split is not None and split.helpers == {max(usable_cpus())}
    assert seen["compile"] == split.helpers and seen["masks"] == split.helpers
    forward_threads = _forward_thread_cores()
    assert forward_threads and all(cores == split.forward for cores in forward_threads)
    assert SCHEMA.accepts_tokens(results[0].token_ids)


@needs_two_cores
def test_the_outputs_are_those_without_the_split() -> None:
    engine = LLMEngine(MODEL, TOKENIZER)
    outputs = []
    for split in (True, False):
        with ThreadPoolExecutor(1) as compile_executor:
            results = engine.generate(_requests(compile_executor, {}),
                                      config=EngineConfig(mask_workers=1, core_split=split))
        outputs.append([(r.canvas_ids, r.nfe) for r in results])
    assert outputs[0] == outputs[1]


@needs_two_cores
@pytest.mark.parametrize("config", [EngineConfig(mask_workers=1, core_split=False),
                                    EngineConfig(mask_workers=0),
                                    EngineConfig(mask_workers=1, gil_free_forward=False, core_split=True)])
def test_without_a_split_a_pinned_compile_thread_goes_back_to_every_core(config) -> None:
    engine = LLMEngine(MODEL, TOKENIZER)
    with ThreadPoolExecutor(1) as compile_executor:
        pinned: dict[str, set[int]] = {}
        engine.generate(_requests(compile_executor, pinned), config=EngineConfig(mask_workers=1, core_split=True))
        assert pinned["compile"] == engine.core_split.helpers
        seen: dict[str, set[int]] = {}
        engine.generate(_requests(compile_executor, seen), config=config)
    assert engine.core_split is None
    assert seen["compile"] == usable_cpus()
