"""What runs next: a waiting queue, admission under a KV memory budget, a per-step token budget, bounded waits.

Bookkeeping only (no tensors): once per step the engine (`LLMEngine.step`) asks `schedule()` which requests join
the running set and which running requests take this step's forward, and tells `finish` / `abort` who left.
This queue is the only one a request waits in and `max_num_seqs` the one admission limit (the server's
--max-batch-size): docs/serving.md, "Scheduling", has the full account.

    SchedulerConfig   limits: max_num_seqs (running requests), max_num_tokens (prompt + canvas of the running
                      requests: the KV budget), max_wait_steps (the fairness bound), policy, max_step_tokens
    TokenBudget       the KV planner: a request's footprint (prompt + canvas) reserved at admission, freed when it
                      leaves; nothing grows, so nothing is preempted or swapped
    Scheduler         FCFS admission with backfill; policies "phase" (dLLM-Serve's phase costs under a per-step
                      token budget, deferral), "fcfs" (FCFS slots) and "static" (static batches)

A request that can never fit (more tokens than max_num_tokens or, under "phase", max_step_tokens) is refused at
`add` with PromptTooLongError. Outputs do not depend on the policy: a deferred request does nothing at that step,
and the packed forward computes each request's rows as it computes them alone.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from dllm_constrain.errors import InvalidRequestError, PromptTooLongError

SCHEDULER_POLICIES = ("phase", "fcfs", "static")


def has_step_budget(policy: str) -> bool:
    """Whether the scheduling policy `policy` bounds the phase costs of one step (only "phase" does)."""
    return policy == "phase"


def _positive_or_none(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise InvalidRequestError(f"{name} must be an integer >= 1 (or None), got {value!r}")


@dataclass(frozen=True)
class SchedulerConfig:
    """Admission limits and the step policy; None means unbounded."""

    max_num_seqs: int | None = 64  # running requests at once
    max_num_tokens: int | None = None  # prompt + canvas tokens of the running requests, summed (the KV budget)
    max_wait_steps: int = 64  # steps after which a waiting request is admitted before any newer one
    policy: str = "phase"  # "phase" | "fcfs" | "static" (see the module docstring)
    max_step_tokens: int | None = None  # "phase": the phase costs one step's forward may hold, summed

    def validate(self) -> "SchedulerConfig":
        for name in ("max_num_seqs", "max_num_tokens", "max_step_tokens"):
            _positive_or_none(name, getattr(self, name))
        if not isinstance(self.max_wait_steps, int) or isinstance(self.max_wait_steps, bool) \
                or self.max_wait_steps < 0:
            raise InvalidRequestError(f"max_wait_steps must be an integer >= 0, got {self.max_wait_steps!r}")
        if self.policy not in SCHEDULER_POLICIES:
            raise InvalidRequestError(f"scheduler must be one of {SCHEDULER_POLICIES}, got {self.policy!r}")
        return self


@dataclass
class TokenBudget:
    """The KV planner: tokens reserved by running requests against a capacity (None = unbounded)."""

    capacity: int | None
    used: int = 0
    peak: int = 0  # the most tokens reserved at once

    @staticmethod
    def from_kv_bytes(budget_bytes: int, bytes_per_token: int) -> int:
        """The token limit a KV byte budget allows (dense cache: 2 * layers * kv_heads * head_dim * dtype size per
        token, see `kv_bytes_per_token`)."""
        return max(1, budget_bytes // max(1, bytes_per_token))

    def fits(self, tokens: int) -> bool:
        return self.capacity is None or self.used + tokens <= self.capacity

    def reserve(self, tokens: int) -> None:
        assert self.fits(tokens), "reserve() past the budget"
        self.used += tokens
        self.peak = max(self.peak, self.used)

    def release(self, tokens: int) -> None:
        self.used -= tokens
        assert self.used >= 0


def kv_bytes_per_token(model: Any) -> int | None:
    """Dense KV bytes per token of a model with a `config` naming layers, KV heads and head size (LLaDA, Dream);
    None when the model does not say."""
    cfg = getattr(model, "config", None)
    layers = getattr(cfg, "n_layers", None) or getattr(cfg, "num_hidden_layers", None)
    kv_heads = getattr(cfg, "kv_heads", None) or getattr(cfg, "num_key_value_heads", None)
    head_dim = getattr(cfg, "head_dim", None) or getattr(cfg, "dim_per_head", None)
    if not all(isinstance(x, int) for x in (layers, kv_heads, head_dim)):
        return None
    params = getattr(model, "parameters", None)
    size = next(params()).element_size() if callable(params) else 4
    return 2 * layers * kv_heads * head_dim * size


@dataclass
class SeqEntry:
    """One request as the scheduler sees it: its fixed token footprint, when it arrived / was admitted / last took a
    forward, and how many steps it was deferred."""

    request_id: int
    tokens: int  # prompt + canvas
    arrival: int  # scheduler step at which it was added
    admitted_at: int | None = None
    last_served: int = -1  # the latest step it took (-1: none yet)
    deferred: int = 0  # steps it was running but left out of the forward by the step budget

    def waited(self, step: int) -> int:
        return step - self.arrival

    def order_key(self) -> tuple[int, int, int]:
        """Running requests' order on the step budget: least recently served first, then by arrival."""
        return (self.last_served, self.arrival, self.request_id)


@dataclass
class StepStats:
    """What the steps held (for figures and tests): the largest step's phase cost and the deferrals."""

    steps: int = 0
    peak_step_tokens: int = 0
    deferrals: int = 0


# a running request's phase cost for this step (tokens of its next forward; 0: it takes no forward)
PhaseCost = Callable[[int], int]


@dataclass
class Scheduler:
    """Waiting queue + running set under `SchedulerConfig` limits (see the module docstring)."""

    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    waiting: deque[SeqEntry] = field(default_factory=deque)
    running: list[SeqEntry] = field(default_factory=list)
    scheduled: list[SeqEntry] = field(default_factory=list)  # the running requests taking the latest step
    step_count: int = 0  # completed schedule() calls
    budget: TokenBudget = field(init=False)
    stats: StepStats = field(default_factory=StepStats)
    _next_id: int = 0
    _step_costs: dict[int, int] = field(default_factory=dict)  # the latest step's phase cost per scheduled id

    def __post_init__(self) -> None:
        self.config.validate()
        self.budget = TokenBudget(self.config.max_num_tokens)

    @property
    def step_budget(self) -> int | None:
        """The phase costs one step may hold (None: unbounded; only the "phase" policy has one)."""
        return self.config.max_step_tokens if self.config.policy == "phase" else None

    # ------------------------------------------------------------------ arrivals and departures
    def add(self, tokens: int, request_id: int | None = None) -> int:
        """Queue a request of `tokens` tokens (prompt + canvas); returns its id. PromptTooLongError if it can never
        be admitted under the KV budget or take a step under the step budget (its first forward is a Refresh)."""
        if not isinstance(tokens, int) or tokens < 1:
            raise InvalidRequestError(f"a request needs at least one token, got {tokens!r}")
        cap = self.config.max_num_tokens
        if cap is not None and tokens > cap:
            raise PromptTooLongError(f"prompt + max_new_tokens = {tokens} tokens exceeds the engine's token budget "
                                     f"of {cap} tokens (max_num_tokens); it could never be scheduled")
        step_cap = self.step_budget
        if step_cap is not None and tokens > step_cap:
            raise PromptTooLongError(f"prompt + max_new_tokens = {tokens} tokens exceeds the engine's per-step token "
                                     f"budget of {step_cap} tokens (step_tokens); its Refresh could never be "
                                     "scheduled")
        if request_id is None:
            request_id = self._next_id
        elif self.get(request_id) is not None:
            raise InvalidRequestError(f"request id {request_id} is already in use")
        self._next_id = max(self._next_id, request_id + 1)
        self.waiting.append(SeqEntry(request_id, tokens, self.step_count))
        return request_id

    @property
    def next_request_id(self) -> int:
        """The id `add` gives a request when none is passed."""
        return self._next_id

    def get(self, request_id: int) -> SeqEntry | None:
        for entry in (*self.running, *self.waiting):
            if entry.request_id == request_id:
                return entry
        return None

    def finish(self, request_id: int) -> SeqEntry:
        """A running request left (done or failed): free its slot and tokens."""
        for i, entry in enumerate(self.running):
            if entry.request_id == request_id:
                del self.running[i]
                self.budget.release(entry.tokens)
                return entry
        raise KeyError(f"request {request_id} is not running")

    def abort(self, request_id: int) -> SeqEntry | None:
        """Remove a waiting or running request; returns its entry (admitted_at None if it never ran), or None if
        it is unknown or already gone."""
        for entry in self.waiting:
            if entry.request_id == request_id:
                self.waiting.remove(entry)
                return entry
        if any(e.request_id == request_id for e in self.running):
            self.scheduled = [e for e in self.scheduled if e.request_id != request_id]
            return self.finish(request_id)
        return None

    # ------------------------------------------------------------------ one step
    def _slots_free(self) -> bool:
        return self.config.max_num_seqs is None or len(self.running) < self.config.max_num_seqs

    def _overdue(self, entry: SeqEntry) -> bool:
        return entry.waited(self.step_count) >= self.config.max_wait_steps

    def _starved(self, entry: SeqEntry) -> bool:
        """A running request that has not taken a step for the wait bound (since its admission or its last step)."""
        served = max(entry.last_served, entry.admitted_at if entry.admitted_at is not None else -1)
        return self.step_count - served > self.config.max_wait_steps

    def schedule(self, cost: PhaseCost | None = None) -> list[SeqEntry]:
        """Plan this step: admit waiting requests and pick the running requests that take the forward
        (`scheduled`, in the step's order). `cost(request_id)` is a running request's phase cost for this step
        (default: its whole sequence, a Refresh); a waiting request's first forward is a Refresh. Returns the newly
        admitted entries (appended to `running`; under "phase" they are all in `scheduled`)."""
        if self.config.policy == "static":
            admitted = self._admit(None) if not self.running else []
            self.scheduled = list(self.running)
            self._step_costs = {e.request_id: e.tokens for e in self.scheduled}
        elif self.config.policy == "fcfs":
            admitted = self._admit(None)
            self.scheduled = list(self.running)
            self._step_costs = {e.request_id: e.tokens for e in self.scheduled}
        else:
            admitted = self._schedule_phase(cost or (lambda rid: self._entry_tokens(rid)))
        for entry in self.scheduled:
            entry.last_served = self.step_count
        self.stats.steps += 1
        self.stats.peak_step_tokens = max(self.stats.peak_step_tokens, self.step_tokens)
        self.step_count += 1
        return admitted

    def shrink_step_budget(self) -> None:
        """Halve the step budget (after an out-of-memory), never below the tokens of a request it holds, so each
        still fits a step alone."""
        budget = self.config.max_step_tokens
        if budget is not None:
            floor = max((e.tokens for e in (*self.running, *self.waiting)), default=1)
            self.config = replace(self.config, max_step_tokens=max(floor, budget // 2, 1))

    @property
    def step_tokens(self) -> int:
        """The phase costs of the latest step's scheduled requests, summed."""
        return sum(self._step_costs.get(e.request_id, 0) for e in self.scheduled)

    def _entry_tokens(self, request_id: int) -> int:
        entry = self.get(request_id)
        return entry.tokens if entry is not None else 0

    def _schedule_phase(self, cost: PhaseCost) -> list[SeqEntry]:
        """The "phase" step: overdue waiting requests, then running ones (least recently served first), then the
        other waiting ones, each taken while its phase cost fits the step budget; running ones left out are
        deferred."""
        room = [self.step_budget]  # None: unbounded

        def fits(tokens: int) -> bool:
            return room[0] is None or tokens <= room[0]

        def take(tokens: int) -> None:
            if room[0] is not None:
                room[0] -= tokens

        costs: dict[int, int] = {}
        chosen: list[SeqEntry] = []
        deferred: list[SeqEntry] = []

        def serve(entry: SeqEntry) -> None:
            c = max(0, int(cost(entry.request_id)))
            if fits(c):
                take(c)
                costs[entry.request_id] = c
                chosen.append(entry)
            else:
                deferred.append(entry)

        running = sorted(self.running, key=SeqEntry.order_key)
        # a running request unserved for the wait bound goes even before overdue arrivals, so that a stream of
        # them can never hold it back for good
        starved = [e for e in running if self._starved(e)]
        for entry in starved:
            serve(entry)
        admitted = self._admit(room, overdue_only=True, costs=costs)
        chosen += admitted
        for entry in running:
            if entry not in starved:
                serve(entry)
        for entry in deferred:
            entry.deferred += 1
            self.stats.deferrals += 1
        more = self._admit(room, costs=costs)
        self.scheduled = chosen + more
        self._step_costs = costs
        return admitted + more

    def _admit(self, room: list[int | None] | None, overdue_only: bool = False,
               costs: dict[int, int] | None = None) -> list[SeqEntry]:
        """Admit waiting requests in arrival order (backfill; an overdue one that does not fit stops the walk).
        `room`: the step budget left (a one-element list, updated; None: no step budget); `overdue_only`: only the
        overdue ones at the head of the walk."""
        admitted: list[SeqEntry] = []
        for entry in list(self.waiting):
            if not self._slots_free():
                break
            overdue = self._overdue(entry)
            if overdue_only and not overdue:
                continue
            step_ok = room is None or room[0] is None or entry.tokens <= room[0]
            if step_ok and self.budget.fits(entry.tokens):
                self.waiting.remove(entry)
                self.budget.reserve(entry.tokens)
                entry.admitted_at = self.step_count
                self.running.append(entry)
                admitted.append(entry)
                if room is not None and room[0] is not None:
                    room[0] -= entry.tokens
                if costs is not None:
                    costs[entry.request_id] = entry.tokens
            elif overdue:
                break  # overdue and too big for now: nothing newer may take the room it is waiting for
        return admitted

    def defer(self, request_ids: set[int]) -> None:
        """Take scheduled requests back out of this step (their phase cost grew after `schedule`, e.g. forced
        tokens closed a block and made a Reuse a Refresh): they count as deferred and go first at the next step."""
        if not request_ids:
            return
        for entry in self.scheduled:
            if entry.request_id in request_ids:
                entry.last_served = min(entry.last_served, self.step_count - 2)
                entry.deferred += 1
                self.stats.deferrals += 1
                self._step_costs.pop(entry.request_id, None)
        self.scheduled = [e for e in self.scheduled if e.request_id not in request_ids]

    def recost(self, cost: PhaseCost) -> set[int]:
        """After the step's forward-free work: the scheduled requests whose actual phase costs no longer fit the
        step budget, the latest in the step's order first (what `defer` should take out). Empty when it fits."""
        budget = self.step_budget
        actual = {e.request_id: max(0, int(cost(e.request_id))) for e in self.scheduled}
        if budget is None:
            self._step_costs = actual
            return set()
        out: set[int] = set()
        total = 0
        for entry in self.scheduled:
            c = actual[entry.request_id]
            if total + c <= budget:
                total += c
            else:
                out.add(entry.request_id)
        self._step_costs = {k: v for k, v in actual.items() if k not in out}
        self.stats.peak_step_tokens = max(self.stats.peak_step_tokens, total)
        return out

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)
