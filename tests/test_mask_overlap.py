"""Constraint masks computed beside the forward (EngineConfig.mask_workers) and the forced_tokens switch.

Specifications:
  * under the overlap every constrained output is valid, whatever the worker count and forced_tokens;
  * the masks run on the loop's worker threads, which end with the generate() call that made them;
  * a typed failure of a mask job (its constraint's call deadline firing on the worker included) ends only its
    request; an untyped one is a fault of the step and is raised, as on the serial path;
  * forced_tokens=False commits no forced token and still gives valid output;
  * with forced_tokens=False, mask_workers=0 (serial) and >= 1 give identical results for the same seeds (the
    masks are the same masks of the same canvas, only computed elsewhere) when no mask is cut by the clock
    (exact canvas states); with forced_tokens on, the results do not depend on the number of workers (>= 1) and a run is
    reproducible for its seeds; with a model blind to the canvas, forced tokens on, serial and overlapped
    results are identical too (the forward's context is the only difference between the paths);
  * a canvas the constraint fixes whole still needs no forward: the tokens the committed prefix forces at the
    frontier are committed before the forward, from the constraint's cheap hint, with no mask computed on the
    loop thread (every mask of the step is computed beside the forward).
"""
from __future__ import annotations

import threading
import time

import pytest
import torch
from conftest import build_tiny_llada, build_tiny_tokenizer
from engine_fakes import EOS, DigitsConstraint, ScriptedModel
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.constraints.deadline import CallDeadline, activate, check_active
from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.state import Request, SamplingParams
from dllm_constrain.errors import ConstraintTimeoutError, InvalidRequestError
from dllm_constrain.options import route_options

MODEL = build_tiny_llada()
TOKENIZER = build_tiny_tokenizer()
DIGITS = [TOKENIZER.token_to_id(str(d)) for d in range(10)]
COMPILER = ConstraintCompiler(TokenizerInfo.from_tokenizer(TOKENIZER, eos_id=1, mask_id=3, vocab_size=260))
REGEX = COMPILER.compile_regex("[ab]+(c|dd)?")
SCHEMA = COMPILER.compile_json_schema({"type": "object", "properties": {"n": {"type": "integer"}},
                                      "required": ["n"]}, additional_properties="forbid")
POLICIES = ("quota", "threshold", "entropy", "margin")


def _exact(compiled, n: int):
    """A canvas state whose masks no clock cuts: no per-call exploration budget nor time limit. (A bounded call
    answers from what it computed in its time, soundly: its masks then depend on the wall clock, on any path.)"""
    return compiled.new_canvas_state(n, expand_budget=None, timeout_s=None)


def _requests(seed: int, forced: bool, policy: str = "quota", exact: bool = True) -> list[Request]:
    """A mixed batch: two requests sharing one compiled regex, a JSON schema, a hand-built constraint and an
    unconstrained request, sampled with their own seeds, with exact masks (`_exact`) or the engine's default
    canvas states (exact=False: per-call budgets and time limits)."""
    state = _exact if exact else (lambda compiled, n: compiled)
    def params(n: int, block: int, offset: int) -> SamplingParams:
        return SamplingParams(max_new_tokens=n, block_length=block, temperature=0.9, seed=seed + offset,
                              policy=policy, threshold=0.3, forced_tokens=forced)
    return [
        Request([60, 61, 62], params(8, 4, 0), state(REGEX, 8)),
        Request([70, 71], params(12, 6, 1), state(SCHEMA, 12)),
        Request([80], params(6, 3, 2), state(REGEX, 6)),
        Request([90, 91], params(6, 2, 3), DigitsConstraint(digits=DIGITS, vocab_size=260)),
        Request([100, 101], params(6, 3, 4)),
    ]


def _generate(workers: int, requests: list[Request]):
    return LLMEngine(MODEL, TOKENIZER).generate(requests, config=EngineConfig(mask_workers=workers))


def _assert_valid(results) -> None:
    assert REGEX.accepts_tokens(results[0].token_ids) and REGEX.accepts_tokens(results[2].token_ids)
    assert SCHEMA.accepts_tokens(results[1].token_ids)
    assert results[3].token_ids and all(t in DIGITS for t in results[3].token_ids)
    assert all(r.finish_reason in ("eos", "length") for r in results)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("forced", [True, False])
@pytest.mark.parametrize("exact", [True, False])
def test_constrained_outputs_are_valid_with_masks_beside_the_forward(workers: int, forced: bool, exact: bool) -> None:
    results = _generate(workers, _requests(5, forced, exact=exact))
    _assert_valid(results)
    if not forced:
        assert all(r.forced_tokens == 0 for r in results)


class ThreadRecording(DigitsConstraint):
    """Records the thread of every mask call."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.threads: list[threading.Thread] = []

    def allowed_tokens(self, canvas, positions):
        self.threads.append(threading.current_thread())
        return super().allowed_tokens(canvas, positions)


def test_masks_run_on_the_loops_worker_threads_which_end_with_the_call() -> None:
    constraint = ThreadRecording(digits=DIGITS, vocab_size=260)
    params = SamplingParams(max_new_tokens=6, block_length=6, forced_tokens=False)
    (res,) = _generate(1, [Request([40, 41], params, constraint)])
    assert constraint.accepts(res.token_ids)
    assert constraint.threads and all(t.name.startswith("dllm-masks") for t in constraint.threads)
    assert not any(t.is_alive() for t in constraint.threads)
    serial = ThreadRecording(digits=DIGITS, vocab_size=260)
    _generate(0, [Request([40, 41], params, serial)])
    assert set(serial.threads) == {threading.current_thread()}


def test_by_default_a_model_on_the_cpu_computes_its_masks_serially() -> None:
    """The default (mask_workers=None) picks the serial path on CPU, where the overlap measured slower, and one
    worker on CUDA."""
    constraint = ThreadRecording(digits=DIGITS, vocab_size=260)
    params = SamplingParams(max_new_tokens=6, block_length=6, forced_tokens=False)
    assert EngineConfig().mask_workers is None
    (res,) = LLMEngine(MODEL, TOKENIZER).generate([Request([40, 41], params, constraint)])
    assert constraint.accepts(res.token_ids)
    assert set(constraint.threads) == {threading.current_thread()}


class SlowMasks(DigitsConstraint):
    """Every mask call runs under a 1 ms call deadline (as compiled constraints do with constraint_timeout) and
    takes longer than that: the deadline, activated on the thread that makes the call, fires there."""

    def allowed_tokens(self, canvas, positions):
        with activate(CallDeadline(1e-3, kind="digits", operation="allowed tokens")):
            time.sleep(0.005)
            check_active()
        return super().allowed_tokens(canvas, positions)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_call_deadline_firing_on_a_worker_ends_only_its_request(workers: int) -> None:
    params = SamplingParams(max_new_tokens=6, block_length=3, forced_tokens=False, seed=1, temperature=0.5)
    others = [Request([50, 51], params, _exact(REGEX, 6)), Request([52], params, DigitsConstraint(digits=DIGITS,
                                                                                                  vocab_size=260))]
    alone = _generate(workers, others)
    bad = Request([40, 41], params, SlowMasks(digits=DIGITS, vocab_size=260))
    results = LLMEngine(MODEL, TOKENIZER).generate([others[0], bad, others[1]], raise_errors=False,
                                                   config=EngineConfig(mask_workers=workers))
    assert isinstance(results[1].error, ConstraintTimeoutError) and results[1].finish_reason == "error"
    assert results[1].error.operation == "allowed tokens"
    # the failed call left no deadline behind on its worker: the requests after it ran unbounded, as alone
    assert [(r.canvas_ids, r.nfe) for r in (results[0], results[2])] == [(r.canvas_ids, r.nfe) for r in alone]
    with pytest.raises(ConstraintTimeoutError):
        LLMEngine(MODEL, TOKENIZER).generate([bad], config=EngineConfig(mask_workers=workers))


class BrokenMasks(DigitsConstraint):
    def allowed_tokens(self, canvas, positions):
        raise RuntimeError("a bug in a constraint")


def test_an_untyped_failure_on_a_worker_is_a_fault_of_the_step() -> None:
    engine = LLMEngine(MODEL, TOKENIZER, config=EngineConfig(mask_workers=1))
    engine.add_request(Request([40], SamplingParams(max_new_tokens=4, block_length=4, forced_tokens=False)))
    engine.add_request(Request([41], SamplingParams(max_new_tokens=4, block_length=4, forced_tokens=False),
                               BrokenMasks(digits=DIGITS, vocab_size=260)))
    with pytest.raises(RuntimeError, match="a bug in a constraint"):
        engine.step()
    assert not engine.has_unfinished()


@pytest.mark.parametrize("workers", [0, 1])
def test_forced_tokens_off_commits_none_and_still_gives_valid_output(workers: int) -> None:
    """One digit token only: with forced tokens every position would be forced; off, the policy commits them."""
    seven = 11
    script = [{4: 0.99}, {seven: 0.9}, {EOS: 0.99}, {4: 0.9}]
    model = ScriptedModel(script, prompt_len=1)
    constraint = DigitsConstraint(digits=[seven])
    params = SamplingParams(max_new_tokens=4, block_length=4, steps=4, forced_tokens=False)
    (res,) = LLMEngine(model).generate([Request([0], params, constraint)], config=EngineConfig(mask_workers=workers))
    assert res.forced_tokens == 0 and res.forwards_saved == 0
    assert constraint.accepts(res.token_ids) and res.nfe == model.forwards >= 1


@pytest.mark.parametrize("workers", [0, 1])
def test_blocks_the_constraint_fixes_whole_still_need_no_forward(workers: int) -> None:
    """"abc" on a canvas of 3 blocks of 1: each block is fixed as soon as it is entered, a cascade."""
    params = SamplingParams(max_new_tokens=3, block_length=1)
    (res,) = _generate(workers, [Request([40, 41], params, COMPILER.compile_regex("abc"))])
    assert TOKENIZER.decode(res.token_ids) == "abc"
    assert res.nfe == 0 and res.forced_tokens == 3 and res.forwards_saved == 3


def test_the_prefix_forced_chain_is_committed_before_the_forward_and_no_mask_is_computed_serially() -> None:
    """"ab" then a free choice: the chain a, b is committed from the hint before the first forward (which sees
    it); every mask call runs on a worker thread."""
    state = _exact(COMPILER.compile_regex("ab[cd]+"), 6)
    loop_thread = threading.get_ident()
    threads: list[int] = []
    fill = state.fill_token_bitmask

    def recorded(canvas, positions, out):
        threads.append(threading.get_ident())
        fill(canvas, positions, out)

    state.fill_token_bitmask = recorded
    params = SamplingParams(max_new_tokens=6, block_length=6, seed=0)
    (res,) = _generate(1, [Request([40, 41], params, state)])
    text = TOKENIZER.decode(res.token_ids)
    assert text.startswith("ab") and set(text[2:]) <= set("cd") and len(text) > 2
    assert res.forced_tokens >= 2 and res.nfe >= 1
    assert threads and loop_thread not in threads


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(POLICIES))
def test_without_forced_tokens_serial_and_overlapped_masks_give_identical_results(seed: int, policy: str) -> None:
    serial = _generate(0, _requests(seed, False, policy))
    for workers in (1, 2):
        overlapped = _generate(workers, _requests(seed, False, policy))
        assert [(r.canvas_ids, r.nfe, r.remasks, r.backtracks) for r in overlapped] == \
               [(r.canvas_ids, r.nfe, r.remasks, r.backtracks) for r in serial]
    _assert_valid(serial)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(POLICIES))
def test_with_forced_tokens_the_results_do_not_depend_on_the_worker_count(seed: int, policy: str) -> None:
    one = _generate(1, _requests(seed, True, policy))
    assert [r.canvas_ids for r in _generate(2, _requests(seed, True, policy))] == [r.canvas_ids for r in one]
    assert [r.canvas_ids for r in _generate(1, _requests(seed, True, policy))] == [r.canvas_ids for r in one]
    _assert_valid(one)


def _scripted_run(workers: int, seed: int, n: int, block: int, policy: str, digits: list[int]):
    gen = torch.Generator().manual_seed(seed)
    script = []
    for _ in range(n):  # per position a few of: digits, EOS, a non-digit, with random confidences
        toks = torch.randperm(12, generator=gen)[:3] + 1
        probs = 0.95 * torch.softmax(torch.rand(3, generator=gen) * 4, 0)
        script.append({int(t): float(p) for t, p in zip(toks, probs) if int(t) not in (2, 3)})
    model = ScriptedModel(script, prompt_len=1)
    params = SamplingParams(max_new_tokens=n, block_length=block, policy=policy, threshold=0.5)
    (res,) = LLMEngine(model).generate([Request([0], params, DigitsConstraint(digits=digits))],
                                       config=EngineConfig(mask_workers=workers))
    return res


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 10), block=st.integers(1, 10),
       policy=st.sampled_from(POLICIES), few_digits=st.booleans())
def test_with_a_model_blind_to_the_canvas_overlapped_forced_tokens_change_nothing(seed, n, block, policy,
                                                                                  few_digits) -> None:
    """Beside the forward, forced tokens off the frontier are committed after the forward instead of before:
    the forward's context is the only difference, so a model that ignores the canvas gives the serial results,
    forward counts and saved forwards included (a forced frontier keeps the step serial)."""
    digits = [11] if few_digits else list(range(4, 14))
    serial = _scripted_run(0, seed, n, block, policy, digits)
    overlapped = _scripted_run(1, seed, n, block, policy, digits)
    assert (overlapped.canvas_ids, overlapped.nfe, overlapped.forced_tokens, overlapped.forwards_saved) == \
           (serial.canvas_ids, serial.nfe, serial.forced_tokens, serial.forwards_saved)


def test_the_continuous_loop_overlaps_too_and_each_result_is_its_solo_one() -> None:
    engine = LLMEngine(MODEL, TOKENIZER, config=EngineConfig(mask_workers=2))
    requests = _requests(9, True)
    ids = [engine.add_request(r) for r in requests]
    outs = {}
    while engine.has_unfinished():
        outs.update({o.request_id: o.result for o in engine.step()})
    for rid, req in zip(ids, _requests(9, True)):
        (alone,) = _generate(2, [req])
        assert outs[rid].canvas_ids == alone.canvas_ids
    assert engine.mask_timing.mask_calls > 0 and engine.mask_timing.forwards > 0


def test_bad_values_of_the_new_options_are_typed_errors() -> None:
    with pytest.raises(InvalidRequestError, match="mask_workers"):
        EngineConfig(mask_workers=-1).validate()
    with pytest.raises(InvalidRequestError, match="forced_tokens"):
        SamplingParams(forced_tokens=1).validate()  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="forced_tokens"):
        route_options({"forced_tokens": "no"}, SamplingParams())
    routed = route_options({"forced_tokens": False, "mask_workers": 0}, SamplingParams())
    assert routed.sampling.forced_tokens is False and routed.engine == {"mask_workers": 0}
