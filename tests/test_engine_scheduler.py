"""Continuous batching: the scheduler's admission rules, and the engine loop that refills slots every step.

Specifications:
  * a request's output does not depend on who else runs: for any arrival order, any slot limit and any mix of
    Refresh/Reuse rows in a step, it equals its output alone (greedy, sampled with its own seed, constrained);
    the packed forward's hidden states are bitwise those of the request alone;
  * abort removes a request and frees its slot; a failing request ends with its own typed error, the others go on;
  * admission never exceeds the budget; FCFS with backfill; a request waiting past the bound goes first;
  * continuous batching spends fewer forwards than static batches on a mixed-length workload.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from conftest import build_tiny_llada, build_tiny_tokenizer
from engine_fakes import DigitsConstraint
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.model_runner import ModelRunner
from dllm_constrain.engine.scheduler import Scheduler, SchedulerConfig
from dllm_constrain.engine.state import Request, SamplingParams
from dllm_constrain.errors import (
    ConstraintError,
    GenerationTimeoutError,
    InvalidRequestError,
    PromptTooLongError,
)

MODEL = build_tiny_llada()
TOKENIZER = build_tiny_tokenizer()
DIGITS = [TOKENIZER.token_to_id(str(d)) for d in range(10)]
REGEX = ConstraintCompiler(TokenizerInfo.from_tokenizer(TOKENIZER, eos_id=1, mask_id=3, vocab_size=260)) \
    .compile_regex("[ab]+(c|dd)?")


# ---------------------------------------------------------------- request specs and their solo outputs
@dataclass(frozen=True)
class Spec:
    prompt: tuple[int, ...]
    params: SamplingParams
    constraint: str | None = None  # "digits" | "regex"

    def request(self) -> Request:
        constraint = None
        if self.constraint == "digits":
            constraint = DigitsConstraint(digits=DIGITS, vocab_size=260)
        elif self.constraint == "regex":
            constraint = REGEX.new_canvas_state(self.params.max_new_tokens)
        return Request(list(self.prompt), self.params, constraint)


SPECS = [
    Spec((10, 11, 12), SamplingParams(max_new_tokens=8, block_length=4)),
    Spec((20,), SamplingParams(max_new_tokens=4, block_length=2, temperature=0.8, seed=7)),
    Spec(tuple(range(30, 45)), SamplingParams(max_new_tokens=12, block_length=4, policy="threshold", threshold=0.2)),
    Spec((50, 51), SamplingParams(max_new_tokens=6, block_length=3, temperature=1.0, seed=11, policy="entropy")),
    Spec((60, 61, 62, 63), SamplingParams(max_new_tokens=6, block_length=6, temperature=0.7, seed=3),
         constraint="regex"),
    Spec((70, 71), SamplingParams(max_new_tokens=5, block_length=2), constraint="digits"),
    Spec(tuple(range(80, 100)), SamplingParams(max_new_tokens=3, block_length=3, policy="margin")),
]
CONFIGS = {
    "dual": EngineConfig(),
    "steps2": EngineConfig(refresh="steps", refresh_steps=2),
    "none": EngineConfig(kv_cache="none"),
    "sparse": EngineConfig(keep_ratio=0.5),
}
_SOLO: dict[tuple[int, str], tuple[list[int], int]] = {}


def solo(spec_index: int, config: str) -> tuple[list[int], int]:
    """(canvas, nfe) of the request run alone."""
    key = (spec_index, config)
    if key not in _SOLO:
        (res,) = LLMEngine(MODEL, TOKENIZER, config=CONFIGS[config]).generate([SPECS[spec_index].request()])
        _SOLO[key] = (res.canvas_ids, res.nfe)
    return _SOLO[key]


def run_continuous(engine: LLMEngine, arrivals: list[tuple[int, Request]], max_steps: int = 500) -> dict:
    """Add each request at its arrival step, step until everything ended; {request_id: RequestOutput}, and the
    arrival -> request id map."""
    outputs, ids = {}, {}
    pending = sorted(enumerate(arrivals), key=lambda x: x[1][0])
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][1][0] <= step:
            k, (_, req) = pending.pop(0)
            ids[k] = engine.add_request(req)
        for out in engine.step():
            assert out.request_id not in outputs
            outputs[out.request_id] = out
        if engine._loop is not None:
            sched, limits = engine._loop.scheduler, engine.scheduler_config
            assert limits.max_num_seqs is None or len(sched.running) <= limits.max_num_seqs
            assert limits.max_num_tokens is None or sched.budget.used <= limits.max_num_tokens
        step += 1
        assert step < max_steps
    return {k: outputs[rid] for k, rid in ids.items()}


# ---------------------------------------------------------------- outputs do not depend on the mix
@settings(max_examples=20, deadline=None)
@given(picks=st.lists(st.tuples(st.integers(0, len(SPECS) - 1), st.integers(0, 6)), min_size=1, max_size=5),
       max_num_seqs=st.integers(1, 4), max_num_tokens=st.sampled_from([None, 30, 60]),
       config=st.sampled_from(sorted(CONFIGS)))
def test_any_arrival_order_gives_every_request_its_solo_output(picks, max_num_seqs, max_num_tokens, config) -> None:
    """Requests join at different steps (so a step mixes Refresh and Reuse rows, and rows of different lengths and
    blocks), slots are refilled as others leave, within the slot and token limits: each request's canvas and forward
    count are those it gets alone."""
    engine = LLMEngine(MODEL, TOKENIZER, config=CONFIGS[config],
                       scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_tokens=max_num_tokens))
    outs = run_continuous(engine, [(arrival, SPECS[i].request()) for i, arrival in picks])
    for k, (i, _) in enumerate(picks):
        res = outs[k].result
        assert res.finish_reason in ("eos", "length") and res.error is None
        assert (res.canvas_ids, res.nfe) == solo(i, config), (k, i)
    for k, (i, _) in enumerate(picks):
        if SPECS[i].constraint == "regex":
            assert set(outs[k].result.text) <= set("abcd") and outs[k].result.text[:1] in ("a", "b")


def test_the_packed_forward_gives_bitwise_the_hidden_states_of_a_request_alone() -> None:
    """Refresh and Reuse rows of different requests in one forward: each row's hidden states equal, bit for bit,
    those the request gets in a forward of its own (spans of 2 rows: the GEMM row-count floor matters here)."""
    engine = LLMEngine(MODEL)

    def state(i, prompt):
        return engine._new_state(i, Request(prompt, SamplingParams(max_new_tokens=6, block_length=2)))

    prompts = {0: [10, 11, 12], 1: [20], 2: [5, 6, 7, 8, 9]}
    alone = {}
    with torch.inference_mode():
        for i, prompt in prompts.items():
            runner = ModelRunner(MODEL, MODEL.special.pad_id, EngineConfig())
            s = state(i, prompt)
            refresh, reuse = runner.forward_rows([s])[0], runner.forward_rows([s])[0]
            alone[i] = [r.hidden[r.offset:r.offset + 2].clone() for r in (refresh, reuse)]
        runner = ModelRunner(MODEL, MODEL.special.pad_id, EngineConfig())
        s0, s1, s2 = (state(i, p) for i, p in prompts.items())
        runner.forward_rows([s0])
        mixed = [runner.forward_rows([s0, s1]), runner.forward_rows([s2, s1])]
    got = {(r.state.index, n): r.hidden[r.offset:r.offset + 2] for n, rows in enumerate(mixed) for r in rows}
    assert torch.equal(got[(0, 0)], alone[0][1])  # reuse, next to a refresh
    assert torch.equal(got[(1, 0)], alone[1][0])  # refresh, next to a reuse
    assert torch.equal(got[(1, 1)], alone[1][1])  # reuse, next to another request's refresh
    assert torch.equal(got[(2, 1)], alone[2][0])
    assert runner.stats.forwards == 3  # one forward per step, whatever the mix


# ---------------------------------------------------------------- abort, isolation, streaming
def test_abort_removes_a_request_and_its_slot_goes_to_the_next_one() -> None:
    engine = LLMEngine(MODEL, TOKENIZER, scheduler_config=SchedulerConfig(max_num_seqs=2))
    ids = [engine.add_request(SPECS[i].request()) for i in (0, 2, 1, 3)]
    engine.step()
    loop = engine._loop
    assert [e.request_id for e in loop.scheduler.running] == ids[:2]
    assert engine.abort(ids[0]) and engine.abort(ids[3])  # one running, one still waiting
    assert not engine.abort(ids[0]) and not engine.abort(999)
    assert ids[0] not in loop.runner.cache and loop.scheduler.budget.used == len(SPECS[2].prompt) + 12
    outs = engine.step()
    aborted = {o.request_id: o.result for o in outs if o.result.finish_reason == "aborted"}
    assert set(aborted) == {ids[0], ids[3]}
    assert aborted[ids[3]].nfe == 0 and aborted[ids[0]].nfe == 1
    assert [e.request_id for e in loop.scheduler.running][:2] == [ids[1], ids[2]]  # the freed slot was refilled
    rest = {}
    while engine.has_unfinished():
        rest.update({o.request_id: o.result for o in engine.step()})
    assert (rest[ids[1]].canvas_ids, rest[ids[1]].nfe) == solo(2, "dual")
    assert (rest[ids[2]].canvas_ids, rest[ids[2]].nfe) == solo(1, "dual")
    assert loop.runner.cache.owned == {} and loop.scheduler.budget.used == 0


def test_a_generate_call_between_two_steps_leaves_the_continuous_loop_its_own_logits_path() -> None:
    engine = LLMEngine(MODEL, TOKENIZER)
    rid = engine.add_request(SPECS[0].request())
    engine.step()
    (between,) = engine.generate([SPECS[2].request()], config=EngineConfig(max_logit_rows=1))
    assert (between.canvas_ids, between.nfe) == solo(2, "dual")
    call_path, chunks = engine.logits_path, engine.logits_path.chunks  # the generate() call's
    outs = {}
    while engine.has_unfinished():
        outs.update({o.request_id: o.result for o in engine.step()})
    assert (outs[rid].canvas_ids, outs[rid].nfe) == solo(0, "dual")
    assert call_path.chunks == chunks  # the loop's later steps never went through the call's logits path


class FailingConstraint(DigitsConstraint):
    """The digits language, until its `fail_at`-th mask request, which raises ConstraintError."""

    def __init__(self, fail_at: int) -> None:
        super().__init__(digits=DIGITS, vocab_size=260)
        self.fail_at = fail_at

    def allowed_tokens(self, canvas, positions):
        if self.calls["allowed_tokens"] + 1 >= self.fail_at:
            raise ConstraintError("the canvas cannot be completed")
        return super().allowed_tokens(canvas, positions)


@pytest.mark.parametrize("kind", ["constraint", "timeout"])
def test_a_failing_request_ends_with_its_own_typed_error_and_the_others_go_on(kind) -> None:
    if kind == "constraint":
        bad = Request([40, 41], SamplingParams(max_new_tokens=8, block_length=4), FailingConstraint(fail_at=3))
        expected = ConstraintError
    else:
        bad = Request([40, 41], SamplingParams(max_new_tokens=8, block_length=4, timeout=1e-9))
        expected = GenerationTimeoutError
    engine = LLMEngine(MODEL, TOKENIZER)
    outs = run_continuous(engine, [(0, SPECS[0].request()), (0, bad), (1, SPECS[4].request()),
                                   (2, SPECS[5].request())])
    assert outs[1].result.finish_reason == "error" and isinstance(outs[1].error, expected)
    assert not outs[1].finished_ok and 3 not in outs[1].result.token_ids
    for k, i in ((0, 0), (2, 4), (3, 5)):
        assert outs[k].finished_ok and (outs[k].result.canvas_ids, outs[k].result.nfe) == solo(i, "dual")
    # generate() keeps its contract (the error is raised), or returns it per request
    reqs = [SPECS[0].request(), bad if kind == "timeout" else
            Request([40, 41], SamplingParams(max_new_tokens=8, block_length=4), FailingConstraint(fail_at=3))]
    with pytest.raises(expected):
        LLMEngine(MODEL, TOKENIZER).generate(reqs)
    reqs[1] = bad if kind == "timeout" else \
        Request([40, 41], SamplingParams(max_new_tokens=8, block_length=4), FailingConstraint(fail_at=3))
    good, failed = LLMEngine(MODEL, TOKENIZER).generate(reqs, raise_errors=False)
    assert good.error is None and good.canvas_ids == solo(0, "dual")[0]
    assert isinstance(failed.error, expected) and failed.finish_reason == "error"


class BrokenConstraint(DigitsConstraint):
    """A constraint with a bug: its masks raise an untyped error (a fault of the step, not of the request)."""

    def allowed_tokens(self, canvas, positions):
        raise RuntimeError("a bug in a constraint")


def test_a_step_that_raises_drops_the_loop_and_the_next_request_starts_a_new_one() -> None:
    engine = LLMEngine(MODEL, TOKENIZER)
    good = engine.add_request(SPECS[0].request())
    state = engine.request_state(good)
    assert state is not None and not state.done and engine.request_state(999) is None
    engine.add_request(Request([40, 41], SamplingParams(max_new_tokens=8, block_length=4), BrokenConstraint(
        digits=DIGITS, vocab_size=260)))
    with pytest.raises(RuntimeError, match="a bug in a constraint"):
        engine.step()
    assert not engine.has_unfinished() and engine.request_state(good) is None and engine.step() == []
    rid = engine.add_request(SPECS[0].request())
    outs = {}
    while engine.has_unfinished():
        outs.update({o.request_id: o.result for o in engine.step()})
    assert (outs[rid].canvas_ids, outs[rid].nfe) == solo(0, "dual")
    assert engine.request_state(rid) is None  # ended


def test_step_streams_growing_committed_prefixes_and_each_result_as_soon_as_it_ends() -> None:
    engine = LLMEngine(MODEL, TOKENIZER, scheduler_config=SchedulerConfig(max_num_seqs=3))
    updates = []
    ids = [engine.add_request(SPECS[i].request()) for i in (2, 1, 0, 6)]
    ended_at = {}
    step = 0
    while engine.has_unfinished():
        for out in engine.step(stream=updates.append):
            ended_at[out.request_id] = (step, out.result)
        step += 1
    nfe = {rid: res.nfe for rid, (_, res) in ended_at.items()}
    assert ended_at[ids[1]][0] == nfe[ids[1]] - 1  # delivered at the step it finished, not with the batch
    assert ended_at[ids[1]][0] < ended_at[ids[2]][0]
    seen: dict[int, list[int]] = {}
    for batch in updates:
        for u in batch:
            prev = seen.get(u.request_id, [])
            assert u.token_ids[:len(prev)] == prev and u.token_ids[len(prev):] == u.new_token_ids
            seen[u.request_id] = u.token_ids
            if u.finished:
                assert u.token_ids == ended_at[u.request_id][1].token_ids
    assert {u.request_id for batch in updates for u in batch if u.finished} == set(ids)


# ---------------------------------------------------------------- admission
def test_requests_that_can_never_run_are_refused_with_typed_errors() -> None:
    engine = LLMEngine(MODEL, TOKENIZER, scheduler_config=SchedulerConfig(max_num_tokens=20))
    with pytest.raises(PromptTooLongError, match="token budget"):
        engine.add_request(Request(list(range(10, 30)), SamplingParams(max_new_tokens=4)))
    with pytest.raises(PromptTooLongError, match="context"):
        LLMEngine(MODEL).add_request(Request([5] * 250, SamplingParams(max_new_tokens=64)))
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.add_request(Request([], SamplingParams(max_new_tokens=4)))
    with pytest.raises(InvalidRequestError, match="timeout"):
        engine.add_request(Request([5], SamplingParams(max_new_tokens=4, timeout=0)))
    with pytest.raises(InvalidRequestError, match="max_num_seqs"):
        SchedulerConfig(max_num_seqs=0).validate()
    assert not engine.has_unfinished()


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.one_of(st.tuples(st.just("add"), st.integers(1, 40)),
                              st.tuples(st.just("step"), st.integers(0, 3)),
                              st.tuples(st.just("abort"), st.integers(0, 30))), max_size=60),
       max_num_seqs=st.one_of(st.none(), st.integers(1, 4)), max_num_tokens=st.integers(40, 100),
       max_wait_steps=st.integers(0, 5))
def test_admission_respects_the_budget_fcfs_and_the_wait_bound(ops, max_num_seqs, max_num_tokens,
                                                                max_wait_steps) -> None:
    """After every schedule(): running requests fit both limits and the planner's count is exact; requests of one
    step are admitted in arrival order; no overdue request is left waiting behind a newer admitted one; a request
    that fits and is not blocked by an overdue one is admitted (no idle room while something fits)."""
    sched = Scheduler(SchedulerConfig(max_num_seqs, max_num_tokens, max_wait_steps))
    ids: list[int] = []
    for op, arg in ops:
        if op == "add":
            ids.append(sched.add(arg))
        elif op == "abort" and ids:
            sched.abort(ids[arg % len(ids)])
        elif op == "step":
            for entry in list(sched.running)[:arg]:  # some running requests end
                sched.finish(entry.request_id)
            now = sched.step_count
            admitted = sched.schedule()
            running_tokens = sum(e.tokens for e in sched.running)
            assert running_tokens == sched.budget.used <= max_num_tokens
            assert max_num_seqs is None or len(sched.running) <= max_num_seqs
            assert [e.request_id for e in admitted] == sorted(e.request_id for e in admitted)
            for entry in admitted:
                older_overdue = [w for w in sched.waiting
                                 if w.request_id < entry.request_id and w.waited(now) >= max_wait_steps]
                assert not older_overdue, (entry, older_overdue)
            slots_left = max_num_seqs is None or len(sched.running) < max_num_seqs
            blocked = False
            for w in sched.waiting:
                if w.waited(now) >= max_wait_steps:
                    blocked = True  # an overdue request that did not fit holds everything newer back
                    break
                assert not (slots_left and w.tokens <= max_num_tokens - running_tokens), w
            assert blocked or not slots_left or all(w.tokens > max_num_tokens - running_tokens for w in sched.waiting)


def test_a_request_waiting_past_the_bound_is_admitted_before_newer_smaller_ones() -> None:
    sched = Scheduler(SchedulerConfig(max_num_seqs=None, max_num_tokens=100, max_wait_steps=2))
    long_runner = sched.add(60)
    sched.schedule()  # step 0: the 60-token request runs
    big = sched.add(70)  # cannot fit while the first one runs
    small = [sched.add(10)]
    assert [e.request_id for e in sched.schedule()] == small  # step 1: backfill, big has waited 1 step
    small.append(sched.add(10))
    assert [e.request_id for e in sched.schedule()] == small[1:]  # step 2: big has waited 1 step
    small.append(sched.add(10))
    assert sched.schedule() == []  # step 3: big is overdue and does not fit: the newer small one must wait
    sched.finish(long_runner)
    sched.finish(small[0])
    # the overdue request first, then the newer one in the room left (70 + 10 + 10 of 100)
    assert [e.request_id for e in sched.schedule()] == [big, small[2]]


# ---------------------------------------------------------------- occupancy
def test_continuous_batching_spends_fewer_forwards_than_static_batches_on_mixed_lengths() -> None:
    """Counted, not timed: 8 requests with canvases of 4..24 tokens (threshold policy, so lengths in forwards
    differ a lot), 4 slots. Static batches of 4 run until their slowest request ends; the continuous loop refills
    a slot as soon as one frees. Every request's output is the same either way."""
    lengths = [24, 4, 6, 20, 4, 8, 16, 4]
    reqs = [Request([10 + i, 11 + i], SamplingParams(max_new_tokens=n, block_length=4, policy="threshold",
                                                      threshold=0.5)) for i, n in enumerate(lengths)]
    static_forwards, static_results = 0, []
    for b in range(0, len(reqs), 4):
        engine = LLMEngine(MODEL, TOKENIZER)
        static_results += engine.generate(reqs[b:b + 4])
        static_forwards += engine.runner.stats.forwards
    engine = LLMEngine(MODEL, TOKENIZER, scheduler_config=SchedulerConfig(max_num_seqs=4))
    outs = run_continuous(engine, [(0, r) for r in reqs])
    stats = engine.forward_stats
    request_steps = sum(r.nfe for r in static_results)
    assert [outs[k].result.canvas_ids for k in range(len(reqs))] == [r.canvas_ids for r in static_results]
    assert stats.request_rows == request_steps
    assert stats.forwards < static_forwards
    assert request_steps / (4 * stats.forwards) > request_steps / (4 * static_forwards)
