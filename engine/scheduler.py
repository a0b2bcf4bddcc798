"""What runs next: a FCFS waiting queue, admission under a memory budget, a bound on waiting.

The scheduler is bookkeeping only (no tensors): the engine (`LLMEngine.step`) asks it once per step which requests
join the running set (`schedule`), runs one forward over the running set, and tells it which requests left
(`finish`, `abort`). Requests join and leave at any step, so a slot freed by a request that ended is refilled at
the next step: a straggler holds its own slot, never the others'.

Memory: a dLLM request's sequence has its final length from the start (prompt + canvas of max_new_tokens), so its
KV footprint is known at arrival and constant until it leaves. `TokenBudget` (the KV planner) reserves exactly that
many tokens at admission and frees them when the request leaves: admitted requests never grow, so nothing is ever
preempted or swapped, and a request leaving frees its own reservation without moving anyone else's cache
(engine.kv_cache keeps one entry per request). Limits: at most `max_num_seqs` running requests and at most
`max_num_tokens` tokens (prompt + canvas, summed over running requests); `TokenBudget.from_kv_bytes` derives the
token limit from a byte budget and the model's per-token KV size.

Admission order: first come, first served, with backfill: walking the queue in arrival order, every request that
fits is admitted, and one that does not fit yet is skipped so smaller ones behind it can use the free room.
Fairness bound: a request that has waited `max_wait_steps` steps or more is overdue; once the walk reaches an
overdue request that does not fit, it stops, so nothing newer is admitted before it (the running set drains until
it fits). A request that can never fit (more tokens than `max_num_tokens`) is refused at `add` with
PromptTooLongError.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from dllm_constrain.errors import InvalidRequestError, PromptTooLongError


@dataclass(frozen=True)
class SchedulerConfig:
    """Admission limits; None means unbounded."""

    max_num_seqs: int | None = 64  # running requests at once
    max_num_tokens: int | None = None  # prompt + canvas tokens of the running requests, summed (the KV budget)
    max_wait_steps: int = 64  # steps after which a waiting request is admitted before any newer one

    def validate(self) -> "SchedulerConfig":
        for name in ("max_num_seqs", "max_num_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise InvalidRequestError(f"{name} must be an integer >= 1 (or None), got {value!r}")
        if not isinstance(self.max_wait_steps, int) or isinstance(self.max_wait_steps, bool) \
                or self.max_wait_steps < 0:
            raise InvalidRequestError(f"max_wait_steps must be an integer >= 0, got {self.max_wait_steps!r}")
        return self


@dataclass
class TokenBudget:
    """The KV planner: tokens reserved by running requests against a capacity (None = unbounded)."""

    capacity: int | None
    used: int = 0

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
    """One request as the scheduler sees it: its fixed token footprint and when it arrived / was admitted."""

    request_id: int
    tokens: int  # prompt + canvas
    arrival: int  # scheduler step at which it was added
    admitted_at: int | None = None

    def waited(self, step: int) -> int:
        return step - self.arrival


@dataclass
class Scheduler:
    """FCFS waiting queue + running set under `SchedulerConfig` limits (see the module docstring)."""

    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    waiting: deque[SeqEntry] = field(default_factory=deque)
    running: list[SeqEntry] = field(default_factory=list)
    step_count: int = 0  # completed schedule() calls
    budget: TokenBudget = field(init=False)
    _next_id: int = 0

    def __post_init__(self) -> None:
        self.config.validate()
        self.budget = TokenBudget(self.config.max_num_tokens)

    # ------------------------------------------------------------------ arrivals and departures
    def add(self, tokens: int, request_id: int | None = None) -> int:
        """Queue a request of `tokens` tokens (prompt + canvas); returns its id. PromptTooLongError if it can never
        be admitted under the token budget."""
        if not isinstance(tokens, int) or tokens < 1:
            raise InvalidRequestError(f"a request needs at least one token, got {tokens!r}")
        cap = self.config.max_num_tokens
        if cap is not None and tokens > cap:
            raise PromptTooLongError(f"prompt + max_new_tokens = {tokens} tokens exceeds the engine's token budget "
                                     f"of {cap} tokens (max_num_tokens); it could never be scheduled")
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
            return self.finish(request_id)
        return None

    # ------------------------------------------------------------------ one step
    def _slots_free(self) -> bool:
        return self.config.max_num_seqs is None or len(self.running) < self.config.max_num_seqs

    def schedule(self) -> list[SeqEntry]:
        """Admit waiting requests for this step (FCFS with backfill, overdue requests first); returns the newly
        admitted entries, which are appended to `running`."""
        admitted: list[SeqEntry] = []
        for entry in list(self.waiting):
            if not self._slots_free():
                break
            if self.budget.fits(entry.tokens):
                self.waiting.remove(entry)
                self.budget.reserve(entry.tokens)
                entry.admitted_at = self.step_count
                self.running.append(entry)
                admitted.append(entry)
            elif entry.waited(self.step_count) >= self.config.max_wait_steps:
                break  # overdue and too big for now: nothing newer may take the room it is waiting for
        self.step_count += 1
        return admitted

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)
