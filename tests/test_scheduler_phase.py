"""The phase-aware scheduler (dLLM-Serve's policy) and its fcfs / static alternatives.

Specifications:
  * a step's phase costs (Refresh: prompt + canvas; Reuse: one block) never exceed the step budget, the running
    requests' KV tokens never exceed the KV budget, and no request is deferred for ever;
  * a request that does not fit a step is deferred without losing its place: it goes first at the next step;
  * a burst's Refreshes are staggered over steps, so the running requests' Reuse steps go on beside them;
  * "static" admits a batch only into an empty running set; "fcfs" runs every running request every step;
  * for any arrival order, policy and budget, every request gets the output it gets alone (same seed);
  * LLM.generate and AsyncLLM schedule through engine.scheduler.
"""
from __future__ import annotations

import asyncio

import pytest
import torch
from conftest import build_tiny_llada, build_tiny_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.scheduler import Scheduler, SchedulerConfig, kv_bytes_per_token
from dllm_constrain.engine.state import Request, SamplingParams
from dllm_constrain.errors import InvalidRequestError, PromptTooLongError

MODEL = build_tiny_llada()
TOKENIZER = build_tiny_tokenizer()

SPECS = [
    ((10, 11, 12), SamplingParams(max_new_tokens=8, block_length=4)),
    ((20,), SamplingParams(max_new_tokens=4, block_length=2, temperature=0.8, seed=7)),
    (tuple(range(30, 45)), SamplingParams(max_new_tokens=12, block_length=4, policy="threshold", threshold=0.2)),
    ((50, 51), SamplingParams(max_new_tokens=6, block_length=3, temperature=1.0, seed=11, policy="entropy")),
    (tuple(range(80, 100)), SamplingParams(max_new_tokens=3, block_length=3, policy="margin")),
]
_SOLO: dict[int, tuple[list[int], int]] = {}


def solo(i: int) -> tuple[list[int], int]:
    if i not in _SOLO:
        prompt, params = SPECS[i]
        (res,) = LLMEngine(MODEL, TOKENIZER).generate([Request(list(prompt), params)])
        _SOLO[i] = (res.canvas_ids, res.nfe)
    return _SOLO[i]


# ---------------------------------------------------------------- the scheduler alone
@settings(max_examples=80, deadline=None)
@given(ops=st.lists(st.one_of(st.tuples(st.just("add"), st.integers(1, 40)),
                              st.tuples(st.just("step"), st.integers(0, 2)),
                              st.tuples(st.just("abort"), st.integers(0, 30))), max_size=60),
       max_num_seqs=st.one_of(st.none(), st.integers(1, 5)), max_num_tokens=st.integers(40, 120),
       max_step_tokens=st.integers(40, 80), reuse=st.integers(1, 8), seed=st.integers(0, 10**6))
def test_steps_hold_their_budgets_and_no_running_request_starves(ops, max_num_seqs, max_num_tokens,
                                                                 max_step_tokens, reuse, seed) -> None:
    """Running requests alternate between Refresh (their whole footprint) and Reuse (`reuse` tokens) at random:
    every step's phase costs fit the step budget, the KV reservation fits the KV budget, and a running request is
    never deferred more than max_num_seqs - 1 (or, unbounded, running - 1) steps in a row."""
    rng = torch.Generator().manual_seed(seed)
    # no overdue arrivals here (they go first on the step budget; tests/test_engine_scheduler.py covers them)
    sched = Scheduler(SchedulerConfig(max_num_seqs, max_num_tokens, 10**6, "phase", max_step_tokens))
    ids: list[int] = []
    streak: dict[int, int] = {}
    refresh = lambda rid: bool(torch.rand((), generator=rng) < 0.3)  # noqa: E731
    for op, arg in ops:
        if op == "add":
            if arg > max_step_tokens:
                with pytest.raises(PromptTooLongError, match="per-step"):
                    sched.add(arg)
                continue
            ids.append(sched.add(arg))
        elif op == "abort" and ids:
            sched.abort(ids[arg % len(ids)])
        elif op == "step":
            for entry in list(sched.running)[:arg]:
                sched.finish(entry.request_id)
            costs = {e.request_id: (e.tokens if refresh(e.request_id) else min(reuse, e.tokens))
                     for e in sched.running}
            sched.schedule(lambda rid: costs[rid])
            assert sched.step_tokens <= max_step_tokens
            assert sum(e.tokens for e in sched.running) == sched.budget.used <= max_num_tokens
            assert max_num_seqs is None or len(sched.running) <= max_num_seqs
            served = {e.request_id for e in sched.scheduled}
            assert served <= {e.request_id for e in sched.running}
            for e in sched.running:
                streak[e.request_id] = 0 if e.request_id in served else streak.get(e.request_id, 0) + 1
                assert streak[e.request_id] <= max(0, len(sched.running) - 1), e
            if sched.running:
                assert served, "a step with running requests serves at least one"


def test_a_deferred_request_keeps_its_place_and_goes_first_at_the_next_step() -> None:
    sched = Scheduler(SchedulerConfig(max_num_seqs=None, max_step_tokens=100))
    a, b, c = sched.add(60), sched.add(60), sched.add(30)
    assert [e.request_id for e in sched.schedule()] == [a, c]  # b's Refresh does not fit beside a's
    assert [e.request_id for e in sched.waiting] == [b]
    reuse = {a: 10, c: 10}
    sched.schedule(lambda rid: reuse[rid])
    assert [e.request_id for e in sched.scheduled] == [a, c, b]  # the Reuse steps leave room for b's Refresh
    costs = {a: 60, b: 10, c: 10}
    sched.schedule(lambda rid: costs[rid])  # a refreshes (a new block): 60 + 10 + 10 fit
    costs = {a: 60, b: 60, c: 10}
    sched.schedule(lambda rid: costs[rid])
    assert [e.request_id for e in sched.scheduled] == [a, c]  # least recently served first; b deferred
    assert sched.get(b).deferred == 1
    sched.schedule(lambda rid: costs[rid])
    assert sched.scheduled[0].request_id == b  # the deferred request goes first


def test_an_overdue_arrival_goes_before_the_running_requests_on_the_step_budget() -> None:
    sched = Scheduler(SchedulerConfig(max_num_seqs=None, max_wait_steps=2, max_step_tokens=100))
    a = sched.add(60)
    sched.schedule()
    w = sched.add(60)
    refresh = lambda rid: 60  # noqa: E731  (a refreshes every step: w never fits beside it)
    sched.schedule(refresh)
    sched.schedule(refresh)
    assert sched.get(w) in sched.waiting
    assert [e.request_id for e in sched.schedule(refresh)] == [w]  # w is overdue: it takes the step's room first
    assert [e.request_id for e in sched.scheduled] == [w] and sched.get(a).deferred == 1
    sched.schedule(refresh)
    assert sched.scheduled[0].request_id == a  # the deferred request goes first at the next step


def test_a_stream_of_overdue_arrivals_cannot_hold_a_running_request_back_past_the_wait_bound() -> None:
    """Every step a new arrival turns overdue and would fill the step budget on its own: the running request still
    takes a step at least once every max_wait_steps + 1 steps."""
    sched = Scheduler(SchedulerConfig(max_num_seqs=None, max_wait_steps=2, max_step_tokens=100))
    a = sched.add(60)
    sched.schedule()
    refresh = lambda rid: 60  # noqa: E731  (every request refreshes every step: two never fit together)
    served = []
    for step in range(40):
        sched.add(60)
        sched.schedule(refresh)
        if a in {e.request_id for e in sched.scheduled}:
            served.append(step)
    gaps = [b - a_ for a_, b in zip([-1] + served, served)]
    assert served and max(gaps) <= 3 and 40 - served[-1] <= 3


def test_a_burst_of_refreshes_is_staggered_and_running_reuse_steps_go_on() -> None:
    """Four running requests in Reuse (8 tokens each) and a burst of six 100-token arrivals under a 300-token step
    budget: every step serves the running ones and admits only the Refreshes that fit (2 per step)."""
    sched = Scheduler(SchedulerConfig(max_num_seqs=None, max_step_tokens=300))
    old = [sched.add(40) for _ in range(4)]
    sched.schedule()
    burst = [sched.add(100) for _ in range(6)]
    cost = lambda rid: 8  # noqa: E731  (the admitted burst requests are in Reuse from their second step on)
    for k in range(3):
        admitted = sched.schedule(cost)
        assert [e.request_id for e in admitted] == burst[2 * k:2 * k + 2]
        assert set(old) <= {e.request_id for e in sched.scheduled}
        assert sched.step_tokens <= 300
    unbounded = Scheduler(SchedulerConfig(max_num_seqs=None, policy="fcfs"))
    for _ in range(4):
        unbounded.add(40)
    unbounded.schedule()
    for _ in range(6):
        unbounded.add(100)
    unbounded.schedule()
    assert unbounded.step_tokens == 4 * 40 + 6 * 100  # without a step budget the whole burst lands in one step


def test_static_batches_are_admitted_only_into_an_empty_running_set() -> None:
    sched = Scheduler(SchedulerConfig(max_num_seqs=2, policy="static"))
    a, b, c = sched.add(5), sched.add(5), sched.add(5)
    assert [e.request_id for e in sched.schedule()] == [a, b]
    sched.finish(a)
    assert sched.schedule() == [] and [e.request_id for e in sched.scheduled] == [b]
    sched.finish(b)
    assert [e.request_id for e in sched.schedule()] == [c]


def test_fcfs_slots_run_every_running_request_every_step() -> None:
    sched = Scheduler(SchedulerConfig(max_num_seqs=3, policy="fcfs", max_step_tokens=10))
    ids = [sched.add(50) for _ in range(4)]  # no step budget under fcfs: 50 > 10 is accepted
    sched.schedule()
    assert [e.request_id for e in sched.scheduled] == ids[:3]


def test_the_kv_byte_budget_admits_by_the_model_shape() -> None:
    per_token = kv_bytes_per_token(MODEL)
    cfg = MODEL.config
    assert per_token == 2 * cfg.n_layers * cfg.kv_heads * cfg.head_dim * 4
    engine = LLMEngine(MODEL, TOKENIZER, config=EngineConfig(kv_budget_bytes=per_token * 20))
    with pytest.raises(PromptTooLongError, match="token budget of 20"):
        engine.add_request(Request(list(range(10, 30)), SamplingParams(max_new_tokens=4)))
    engine.add_request(Request([10, 11], SamplingParams(max_new_tokens=8, block_length=4)))
    engine.add_request(Request([12, 13], SamplingParams(max_new_tokens=8, block_length=4)))
    engine.step()
    assert len(engine._loop.scheduler.running) == 2 and engine._loop.scheduler.budget.used == 20
    with pytest.raises(InvalidRequestError, match="scheduler"):
        EngineConfig(scheduler="lifo").validate()


# ---------------------------------------------------------------- outputs
@settings(max_examples=15, deadline=None)
@given(picks=st.lists(st.tuples(st.integers(0, len(SPECS) - 1), st.integers(0, 6)), min_size=1, max_size=5),
       scheduler=st.sampled_from(["phase", "fcfs", "static"]), step_tokens=st.sampled_from([None, 28, 48]),
       max_num_seqs=st.integers(1, 4))
def test_any_arrival_order_and_policy_gives_every_request_its_solo_output(picks, scheduler, step_tokens,
                                                                          max_num_seqs) -> None:
    """Requests arrive at different steps; under a tight step budget Refreshes are deferred beside Reuse steps:
    each request's canvas and forward count are those it gets alone, and no step's rows exceed the budget."""
    engine = LLMEngine(MODEL, TOKENIZER, config=EngineConfig(scheduler=scheduler, step_tokens=step_tokens),
                       scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs))
    pending = sorted(enumerate(picks), key=lambda x: x[1][1])
    ids, outputs, step = {}, {}, 0
    rows_before = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][1][1] <= step:
            k, (i, _) = pending.pop(0)
            prompt, params = SPECS[i]
            ids[k] = engine.add_request(Request(list(prompt), params))
        for out in engine.step():
            outputs[out.request_id] = out
        rows = engine.forward_stats.token_rows
        if scheduler == "phase" and step_tokens is not None:
            assert rows - rows_before <= max(step_tokens, 4)  # 4: the packed forward's fewest rows
        rows_before = rows
        step += 1
        assert step < 600
    for k, (i, _) in enumerate(picks):
        res = outputs[ids[k]].result
        assert res.error is None and (res.canvas_ids, res.nfe) == solo(i), (k, i)


# ---------------------------------------------------------------- every front end goes through the scheduler
def test_llm_generate_and_async_llm_schedule_through_the_scheduler(tiny_checkpoint, monkeypatch) -> None:
    from dllm_constrain.api import LLM
    from dllm_constrain.async_llm import AsyncLLM

    calls: list[str] = []
    real = Scheduler.schedule

    def counting(self, cost=None):
        calls.append(self.config.policy)
        return real(self, cost)

    monkeypatch.setattr(Scheduler, "schedule", counting)
    llm = LLM(tiny_checkpoint)
    llm.generate(["ab"], max_new_tokens=4, block_length=4)
    assert calls and set(calls) == {"phase"}
    calls.clear()
    llm.generate(["ab"], max_new_tokens=4, block_length=4, scheduler="static")  # a call with its own settings
    assert calls and set(calls) == {"static"}
    calls.clear()
    asyncio.run(AsyncLLM(llm).generate("ab", max_new_tokens=4, block_length=4))
    assert calls
