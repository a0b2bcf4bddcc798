"""One serving harness for every policy: the same arrivals, the same engine, in-process, on a virtual or a wall clock.

`serve(...)` adds each request when the clock reaches its arrival and steps the engine while anything is
unfinished. On the virtual clock (`VirtualClock`) every step advances time by its modelled cost (the step's counted
work priced by a `CostModel`, dllm_constrain.sim.cost), and an idle engine jumps to the next arrival; on the wall
clock (`WallClock`, the real CPU run) time is time. The three policies differ only in `EngineConfig.scheduler`:
continuous phase-aware ("phase"), continuous FCFS slots ("fcfs") and static batches ("static").

Per request it records arrival, the end of its first forward (TTFT: a dLLM commits its first tokens there) and its
end (latency); per run the makespan, the device-busy time, the largest step's phase cost and the peak KV memory.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.scheduler import SchedulerConfig
from dllm_constrain.engine.state import Request, SamplingParams
from dllm_constrain.sim.behaviour import RequestBehaviour, SimEngine, real_engine, sim_engine
from dllm_constrain.sim.cost import CostModel, Kernels, ModelShape, step_features
from dllm_constrain.sim.workloads import SimRequest, json_answer, plain_answer

BLOCK = 32
THRESHOLD = 0.9  # Fast-dLLM's confidence-aware parallel decoding threshold


@dataclass
class RequestRecord:
    arrival: float
    first_forward: float | None = None
    finish: float | None = None
    tokens: int = 0
    finish_reason: str = ""

    @property
    def latency(self) -> float:
        assert self.finish is not None
        return self.finish - self.arrival

    @property
    def ttft(self) -> float:
        return (self.first_forward if self.first_forward is not None else self.finish) - self.arrival


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))
    return ordered[k]


@dataclass
class RunResult:
    """One policy's run over one workload."""

    policy: str
    records: list[RequestRecord]
    makespan: float
    device_busy: float
    steps: int
    forwards: int
    peak_step_tokens: int
    peak_kv_bytes: int
    request_steps: int = 0  # request rows summed over forwards

    @property
    def throughput(self) -> float:
        """Requests per second over the makespan (first arrival to last end)."""
        return len(self.records) / self.makespan if self.makespan > 0 else float("inf")

    @property
    def token_throughput(self) -> float:
        return sum(r.tokens for r in self.records) / self.makespan if self.makespan > 0 else float("inf")

    def latency(self, q: float) -> float:
        return _percentile([r.latency for r in self.records], q)

    def ttft(self, q: float) -> float:
        return _percentile([r.ttft for r in self.records], q)

    def summary(self) -> dict[str, Any]:
        return {"policy": self.policy, "requests": len(self.records), "throughput_rps": self.throughput,
                "tokens_per_s": self.token_throughput, "p50_s": self.latency(50), "p99_s": self.latency(99),
                "ttft_p50_s": self.ttft(50), "ttft_p99_s": self.ttft(99), "makespan_s": self.makespan,
                "device_busy_s": self.device_busy, "steps": self.steps, "forwards": self.forwards,
                "peak_step_tokens": self.peak_step_tokens, "peak_kv_gb": self.peak_kv_bytes / 1e9,
                "request_steps": self.request_steps}


class Clock(Protocol):
    def now(self) -> float: ...

    def advance(self, work: list, wall: float) -> float:
        """Account one step (its recorded work, its wall seconds); returns its device-busy seconds."""
        ...

    def idle_until(self, t: float) -> None: ...


@dataclass
class VirtualClock:
    """Time moves by each step's modelled cost."""

    cost: CostModel
    shape: ModelShape
    kernels: Kernels = Kernels()  # how the engine issues the work (what-ifs: dllm_constrain.sim.cost.Kernels)
    t: float = 0.0

    def now(self) -> float:
        return self.t

    def advance(self, work: list, wall: float) -> float:
        if not work:
            self.t += 1e-6  # a forward-free step (forced tokens only): host work
            return 0.0
        st = self.cost.step_time(step_features(self.shape, work[0], self.kernels))
        self.t += st.seconds
        return st.device_s

    def idle_until(self, t: float) -> None:
        self.t = max(self.t, t)


@dataclass
class WallClock:
    """Real time (the in-process CPU run): a step takes what it takes; busy time is the steps' wall time."""

    start: float = field(default_factory=time.perf_counter)

    def now(self) -> float:
        return time.perf_counter() - self.start

    def advance(self, work: list, wall: float) -> float:
        return wall

    def idle_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)


@dataclass(frozen=True)
class ServingSetup:
    """What every policy of a comparison shares: slots, KV budget, step budget, decode behaviour."""

    max_num_seqs: int = 64
    kv_budget_bytes: int | None = None
    step_tokens: int | None = None
    tokens_per_forward: float = 2.5
    kernels: Kernels = Kernels()  # the engine's kernels as today, or a what-if (dllm_constrain.sim.cost.Kernels)

    def engine_config(self, policy: str) -> EngineConfig:
        return EngineConfig(scheduler=policy, step_tokens=self.step_tokens, kv_budget_bytes=self.kv_budget_bytes)

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(max_num_seqs=self.max_num_seqs)


def _prompt_ids(req: SimRequest, vocab: int, special: set[int]) -> list[int]:
    """Deterministic ordinary tokens for the prompt (their values do not change a simulated step's cost)."""
    out, x = [], req.seed % 9973 + 17
    while len(out) < req.prompt_len:
        x = (x * 1103515245 + 12345) % (1 << 31)
        tok = 4 + x % (vocab - 4)
        if tok not in special:
            out.append(tok)
    return out


@dataclass
class RequestFactory:
    """Turns a SimRequest into the engine's Request (and, simulated, its decode behaviour)."""

    tokenizer: Any
    compiled: Any = None  # the SCHEMA compiled for the tokenizer (None: constrained requests run unconstrained)

    def request(self, req: SimRequest, prompt: list[int] | None = None) -> Request:
        tok = self.tokenizer
        params = SamplingParams(max_new_tokens=req.canvas, block_length=BLOCK, policy="threshold",
                                threshold=THRESHOLD, seed=req.seed)
        special = {tok.bos_id, tok.eos_id, tok.pad_id, tok.mask_id}
        ids = prompt if prompt is not None else _prompt_ids(req, tok.vocab_size, special)
        constraint = None
        if req.constrained and self.compiled is not None:
            # an exact canvas state (no time allowance): its masks do not follow the clock, so runs are reproducible
            constraint = self.compiled.new_canvas_state(req.canvas, expand_budget=None, timeout_s=None)
        return Request(ids, params, constraint)

    def behaviour(self, req: SimRequest, tokens_per_forward: float) -> RequestBehaviour:
        encode = self.tokenizer.encode
        make = json_answer if req.constrained and self.compiled is not None else plain_answer
        answer = make(encode, req.answer_len, req.seed)[: req.canvas - 1]
        return RequestBehaviour(tuple(answer), req.seed, tokens_per_forward)


def serve(engine: SimEngine, workload: list[SimRequest], factory: RequestFactory, clock: Clock, policy: str,
          behaviours: dict[int, RequestBehaviour] | None = None, tokens_per_forward: float = 2.5,
          kv_bytes_per_token: int = 0, prompts: Callable[[SimRequest], list[int]] | None = None,
          max_steps: int = 10_000_000) -> RunResult:
    """Run `workload` through `engine` on `clock` (see the module docstring). `behaviours`: the SimRunner's table,
    filled here as requests are added (None for a real model)."""
    pending = deque(sorted(workload, key=lambda r: r.arrival))
    records: dict[int, RequestRecord] = {}
    waiting_first: set[int] = set()
    busy, steps = 0.0, 0
    forwards_before = len(engine.work_log)
    while pending or engine.has_unfinished():
        now = clock.now()
        while pending and pending[0].arrival <= now:
            req = pending.popleft()
            rid = engine.add_request(factory.request(req, prompts(req) if prompts else None))
            if behaviours is not None:
                behaviours[rid] = factory.behaviour(req, tokens_per_forward)
            records[rid] = RequestRecord(arrival=req.arrival)
            waiting_first.add(rid)
        if not engine.has_unfinished():
            clock.idle_until(pending[0].arrival)
            continue
        logged = len(engine.work_log)
        start = time.perf_counter()
        outputs = engine.step()
        busy += clock.advance(engine.work_log[logged:], time.perf_counter() - start)
        steps += 1
        now = clock.now()
        for rid in list(waiting_first):
            state = engine.request_state(rid)
            if state is not None and state.nfe > 0:
                records[rid].first_forward = now
                waiting_first.discard(rid)
        for out in outputs:
            rec = records[out.request_id]
            rec.finish, rec.tokens, rec.finish_reason = now, len(out.result.token_ids), out.result.finish_reason
            if out.request_id in waiting_first:
                rec.first_forward = now
                waiting_first.discard(out.request_id)
        assert steps < max_steps, "the serving run did not end"
    first = min(r.arrival for r in records.values())
    makespan = max(r.finish for r in records.values()) - first
    log = engine.work_log[forwards_before:]
    sched = engine._loop.scheduler if engine._loop is not None else None
    peak_kv = sched.budget.peak * kv_bytes_per_token if sched is not None else 0
    return RunResult(policy, [records[k] for k in sorted(records)], makespan, busy, steps, len(log),
                     max((sum(w.rows for w in step) for step in log), default=0), peak_kv,
                     sum(len(step) for step in log))


def simulate(workload: list[SimRequest], policy: str, setup: ServingSetup, factory: RequestFactory,
             shape: ModelShape, cost: CostModel) -> RunResult:
    """The workload on the simulated model (decode-behaviour model) priced by `cost` on the virtual clock."""
    behaviours: dict[int, RequestBehaviour] = {}
    engine = sim_engine(factory.tokenizer, shape, setup.engine_config(policy), behaviours,
                        scheduler_config=setup.scheduler_config())
    return serve(engine, workload, factory, VirtualClock(cost, shape, setup.kernels), policy, behaviours,
                 setup.tokens_per_forward, shape.kv_bytes_per_token)


def run_model(workload: list[SimRequest], policy: str, setup: ServingSetup, factory: RequestFactory, model: Any,
              clock: Clock, prompts: Callable[[SimRequest], list[int]] | None = None) -> RunResult:
    """The workload on a real model (its forwards decide the tokens) on `clock`: the wall clock for the real run, a
    virtual clock with a fitted CPU cost for its simulation."""
    engine = real_engine(model, factory.tokenizer, setup.engine_config(policy),
                         scheduler_config=setup.scheduler_config())
    shape = ModelShape.from_model(model)
    return serve(engine, workload, factory, clock, policy, None, kv_bytes_per_token=shape.kv_bytes_per_token,
                 prompts=prompts)
