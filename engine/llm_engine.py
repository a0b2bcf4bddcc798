"""The request loop (nano-vllm's LLMEngine in shape): a scheduler picks the running requests, one forward serves
them all, one head pass reduces their open rows, and each request's policy decides its commits on the host.

One step (`LLMEngine._run_step`, shared by `generate` and the continuous `step()`):
  1. admission (`Scheduler.schedule`): waiting requests fill the slots and tokens the ended ones freed;
  2. the constraint stage before the forward (`StructuredOutputManager.prepare`: step and time bounds, block / EOS
     bookkeeping, masks and forced tokens serially, or handed to the loop's mask workers);
  3. ONE forward for the running requests (`ModelRunner.start_rows`); one that raises is retried on each half of
     its requests (an out-of-memory halves the step budget first), so a fault ends only the request causing it;
  4. the constraint stage after the forward (`StructuredOutputManager.after_forward`: parking, the masks computed
     beside the forward and their forced tokens);
  5. ONE head pass (`engine.logits.head_pass`): every request's open rows projected, masked and reduced in one
     `LogitsPath.row_stats` call, and the row statistics read to the host in one `to_host` (engine.host_sync);
  6. per request, on the host: the policy's picks, joint verification, backtracking (`_commit`);
  7. departures: ended requests come back as `RequestOutput`s, their slots, tokens and cache entries freed.
A request's own typed failure ends it alone (`_isolated`). docs/engine.md explains masks beside the forward,
forced tokens, the first forward, threading and randomness; engine.block_diffusion runs lockstep block-diffusion
models through the same stages (`prepare_request`, `after_forward`).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from dllm_constrain.engine.block_diffusion import generate_blocks, is_block_diffusion
from dllm_constrain.engine.config import DEFAULT_STEP_TOKENS, EngineConfig
from dllm_constrain.engine.core_split import CoreSplit, pin_current_thread, plan_core_split
from dllm_constrain.engine.gil_share import loop_activity
from dllm_constrain.engine.logits import HeadJob, LogitsPath, read_slots
from dllm_constrain.engine.mask_workers import ForwardWindow, MaskItem, MaskResult, MaskTiming, MaskWorkers
from dllm_constrain.engine.model_runner import ForwardStats, ModelRunner, Row
from dllm_constrain.engine.models.base import DiffusionLM, RenoisingLM, RequestStateLM
from dllm_constrain.engine.outputs import (
    CanvasSnapshot,
    GenerationResult,
    ProgressCallback,
    RequestOutput,
    StepEvent,
    StreamHook,
    StreamUpdate,
    request_result,
    stream_updates,
)
from dllm_constrain.engine.placement import usable_cpus
from dllm_constrain.engine.policies import CommitPolicy, make_policy
from dllm_constrain.engine.scheduler import (
    Scheduler,
    SchedulerConfig,
    TokenBudget,
    has_step_budget,
    kv_bytes_per_token,
)
from dllm_constrain.engine.state import Request, RequestPhase, RequestState
from dllm_constrain.engine.step_faults import forward_rows, head_stats, start_rows
from dllm_constrain.engine.structured_output import (
    Forwarded,
    StructuredOutputManager,
    base_allowed,
    check_step_bound,
    engine_constraint,
)
from dllm_constrain.errors import (
    ConstraintError,
    ConstraintTooLongError,
    DllmConstrainError,
    InvalidRequestError,
    PromptTooLongError,
)
from dllm_constrain.kernels.hashed_noise import noise_row_key
from dllm_constrain.kernels.masked_row_stats import RowStats

__all__ = ["LLMEngine", "GenerationResult", "RequestOutput", "StreamUpdate", "StepEvent", "CanvasSnapshot",
           "ProgressCallback", "SchedulerConfig", "is_block_diffusion"]


@dataclass
class _Loop:
    """The machinery of one request loop: its scheduler, forward runner (with the KV cache), logits path, and the
    states and policies of the requests it holds. `generate` makes one per call; the continuous API keeps one."""

    scheduler: Scheduler
    runner: ModelRunner
    logits_path: LogitsPath
    states: dict[int, RequestState] = field(default_factory=dict)
    policies: dict[int, CommitPolicy] = field(default_factory=dict)
    streamed: dict[int, int] = field(default_factory=dict)  # request id -> prefix length already streamed
    pending: list[RequestOutput] = field(default_factory=list)  # aborted requests, delivered by the next step
    masks: MaskWorkers | None = None  # threads computing masks beside the forward (None: EngineConfig.mask_workers=0)
    timing: MaskTiming = field(default_factory=MaskTiming)  # measured mask and forward time (benchmarks)
    # open while a step's forward runs: a mask job waiting for a constraint still compiling waits that long at most
    forward_running: ForwardWindow = field(default_factory=ForwardWindow)

    def close(self) -> None:
        """End the loop's mask threads (waiting for a running job)."""
        if self.masks is not None:
            self.masks.close()


class LLMEngine:
    """The request loop over a `DiffusionLM`: a scheduler picks the running set, one forward per step serves it.

    Continuous use (nano-vllm's shape; one thread drives it):
        rid = engine.add_request(request)      # queued; typed errors for requests that can never run
        while engine.has_unfinished():
            for out in engine.step():          # the requests that ended at this step, as soon as they end
                ...out.request_id, out.result (finish_reason "eos" | "length" | "error" | "aborted")
        engine.abort(rid)                       # removes it, frees its slot; its output comes with the next step
        engine.step(stream=fn)                  # fn(list[StreamUpdate]) after the step: committed left prefixes
        engine.request_state(rid)               # the live state of a waiting or running request
    Static use: `generate(requests)` runs its own loop (same per-request code) and returns results in order."""

    def __init__(self, model: DiffusionLM, tokenizer: Any = None, *, max_logit_rows: int | None = None,
                 config: EngineConfig | None = None, scheduler_config: SchedulerConfig | None = None) -> None:
        """config: the engine settings (KV cache, refresh policy, keep ratio, logits budget; see EngineConfig);
        max_logit_rows, when given, caps the rows of one logits chunk (overrides config.max_logit_rows);
        scheduler_config: admission limits of the request loop (engine.scheduler), generate() included."""
        self.model = model
        self.tokenizer = tokenizer
        config = config if config is not None else EngineConfig()
        if max_logit_rows is not None:
            config = config.with_overrides(max_logit_rows=max(1, max_logit_rows))
        self.config = config.validate()
        self.scheduler_config = (scheduler_config or SchedulerConfig()).validate()
        self.special = model.special
        self.vocab_size = int(model.vocab_size)
        # the constraint stage: masks, forced tokens, compilations beside the loop (engine.structured_output)
        self.structured = StructuredOutputManager(self.special, base_allowed(self.special, self.vocab_size, tokenizer),
                                                 self.place_helper_thread)
        # uniform-state (block) diffusion re-noises open positions, with the masked distribution's samples under a
        # constraint (`_commit`); masked diffusion re-masks them and has no use for the samples
        self.noised_blocks = is_block_diffusion(model)
        # called with (states, hidden, offsets) after every KV cache Reuse forward (agreement measurements)
        self.reuse_hook: Callable[[list[RequestState], torch.Tensor, list[int]], None] | None = None
        self._setup_call(self.config)
        self._loop: _Loop | None = None  # the continuous loop, made by the first add_request
        # the cores of the latest loop's forward and of the Python threads beside it (engine.core_split), and the
        # cores the process had when the engine was made
        self.core_split: CoreSplit | None = None
        self._cpus = usable_cpus()

    def _setup_call(self, config: EngineConfig) -> None:
        """The per-call machinery: the forward runner (with its KV cache) and the budgeted logits path."""
        self.runner = ModelRunner(self.model, self.special.pad_id, config)
        self.runner.on_reuse = self.reuse_hook
        self.logits_path = LogitsPath(self.model, budget_bytes=config.logits_budget_bytes,
                                      max_rows=config.max_logit_rows, budgeted=config.budgeted_logits,
                                      backend=config.backend)
        self.logits_path.reset_budget(self.runner.device)
        # the measured mask/forward time of the latest loop (a generate() call, or the continuous loop)
        self.mask_timing = MaskTiming()

    def _new_loop(self, config: EngineConfig, scheduler_config: SchedulerConfig) -> _Loop:
        self._setup_call(config)
        on_cpu = self.runner.device.type == "cpu"
        workers = config.mask_workers
        if workers is None:
            # beside the forward on CUDA, where the host is idle during the forward; serial on the CPU (docs/engine.md,
            # "Masks beside the forward")
            workers = 0 if on_cpu else 1
        forward_running = ForwardWindow()

        def beside(s: RequestState, view: list[int], positions: list[int]) -> torch.Tensor | None:
            return self.structured.allowed_beside(s, view, positions, forward_running)

        if config.gil_free_forward is None and workers > 0 and on_cpu:
            self.runner.use_gil_free_forward(True)
        # the GIL-free CPU forward and the Python beside it on cores of their own (engine.core_split)
        split = None
        if on_cpu and self.runner.scripted is not None:
            split = plan_core_split(usable_cpus(), torch.get_num_threads(), config.core_split)
        self.core_split = split
        self.runner.core_split = split
        masks = MaskWorkers(workers, beside, split.pin_current_helper if split is not None else None) \
            if workers > 0 else None
        scheduler = Scheduler(self._scheduler_config(config, scheduler_config))
        return _Loop(scheduler, self.runner, self.logits_path, masks=masks, timing=self.mask_timing,
                     forward_running=forward_running)

    def _scheduler_config(self, config: EngineConfig, limits: SchedulerConfig) -> SchedulerConfig:
        """The loop's scheduler settings: `limits` (slots, tokens, wait bound) with the engine config's policy, step
        budget (default max(8192, the model's context)) and KV byte budget (as tokens of this model's KV size)."""
        step = config.step_tokens
        if step is None and has_step_budget(config.scheduler):
            step = max(DEFAULT_STEP_TOKENS, int(self.model.max_sequence_length))
        tokens = limits.max_num_tokens
        if config.kv_budget_bytes is not None:
            per_token = kv_bytes_per_token(self.model)
            if per_token is None:
                raise InvalidRequestError("kv_budget_bytes needs a model whose config names its layers, KV heads and "
                                          "head size")
            kv_tokens = TokenBudget.from_kv_bytes(config.kv_budget_bytes, per_token)
            tokens = kv_tokens if tokens is None else min(tokens, kv_tokens)
        capacity = self.runner.kv_capacity_tokens  # the KV pool's size: from kv_cache_memory, or free CUDA memory
        if capacity is not None:
            tokens = capacity if tokens is None else min(tokens, capacity)
        return replace(limits, policy=config.scheduler, max_step_tokens=step, max_num_tokens=tokens).validate()

    def _phase_cost(self, loop: _Loop, request_id: int) -> int:
        """A running request's phase cost for this step (engine.scheduler): 0 when it takes no forward."""
        s = loop.states[request_id]
        if s.done or s.phase is RequestPhase.PARKED:
            return 0
        return loop.runner.phase_tokens(s)

    def place_helper_thread(self) -> None:
        """Put the calling thread, a helper of this engine's loops (a compile thread, at each compilation the loop
        starts beside its forward), on the helper cores of the latest loop's core split; without a split, on every
        core the process had when the engine was made (an earlier loop's split may have pinned it)."""
        if self.core_split is not None:
            self.core_split.pin_current_helper()
        elif self._cpus:
            pin_current_thread(self._cpus)

    # ------------------------------------------------------------------ set-up
    def _new_state(self, index: int, request: Request, defer: bool = False) -> RequestState:
        """The request's state, its constraint's canvas state made for its canvas; with `defer`, a constraint still
        compiling is left pending (`RequestState.pending`, resolved by the request loop after the first forward)."""
        params = request.params
        params.validate()
        if params.template is not None and params.seed_canvas is None:
            raise InvalidRequestError("SamplingParams.template is made into seed_canvas / pinned by the front end "
                                      "(LLM.generate); give the engine seed_canvas and pinned")
        if not request.prompt_ids:
            raise InvalidRequestError("the prompt is empty (no token ids)")
        total = len(request.prompt_ids) + params.max_new_tokens
        if total > self.model.max_sequence_length:
            raise PromptTooLongError(
                f"prompt ({len(request.prompt_ids)} tokens) + max_new_tokens ({params.max_new_tokens}) = {total} "
                f"exceeds the model's context of {self.model.max_sequence_length} tokens")
        # the head pass hashes the request's sampling noise from `seed` (docs/engine.md, "Randomness"); the generator,
        # on the model's device, serves the model's own noise and the policies' drawn orders
        generator = torch.Generator(device=self.runner.device)
        if params.seed is not None:
            generator.manual_seed(params.seed)
        else:
            generator.seed()
        seed = params.seed if params.seed is not None else generator.initial_seed()
        n = params.max_new_tokens
        state = RequestState(
            index=index,
            prompt_ids=list(request.prompt_ids),
            params=params,
            canvas=torch.full((n,), self.special.mask_id, dtype=torch.long),
            committed=torch.zeros(n, dtype=torch.bool),
            generator=generator,
            seed=seed,
        )
        pins = params.pinned_tokens()
        if defer and not request.constraint_ready and not pins:
            state.pending, state.phase = request, RequestPhase.COMPILING
        else:
            # a template's pins are checked against the constraint before any forward, so its compilation is waited
            # for here (it cannot run beside the first forward)
            state.constraint = engine_constraint(request.constraint_state())  # made for this canvas (max_new_tokens)
        if pins:
            self.structured.pin(state, pins, self.decode if self.tokenizer is not None else None)
        if isinstance(self.model, RequestStateLM):
            self.model.init_request_state(state)
        return state

    def _add(self, loop: _Loop, request: Request, request_id: int | None = None) -> int:
        """Validate a request and queue it in `loop` (typed errors: InvalidRequestError, PromptTooLongError)."""
        if request_id is None:
            request_id = loop.scheduler.next_request_id
        state = self._new_state(request_id, request, defer=True)
        rid = loop.scheduler.add(len(state.prompt_ids) + state.canvas_len, request_id)
        loop.states[rid] = state
        loop.policies[rid] = make_policy(state.params)
        return rid

    # ------------------------------------------------------------------ continuous loop
    def add_request(self, request: Request) -> int:
        """Queue one request for the continuous loop; returns its id. Raises InvalidRequestError (bad parameters,
        empty prompt) or PromptTooLongError (prompt + canvas over the model's context or the token budget) for a
        request that could never run."""
        if is_block_diffusion(self.model):
            raise InvalidRequestError("continuous batching needs a model with a per-step forward; block-diffusion "
                                      "models (prompt cache + canvas decoder) run through generate() in lockstep")
        if self._loop is None:
            self._loop = self._new_loop(self.config, self.scheduler_config)
        return self._add(self._loop, request)

    def abort(self, request_id: int) -> bool:
        """Remove a waiting or running request and free its slot, tokens and cache entry; its output (finish_reason
        "aborted") comes with the next step(). False if the id is unknown or the request already ended."""
        loop = self._loop
        if loop is None:
            return False
        entry = loop.scheduler.abort(request_id)
        if entry is None:
            return False
        s = loop.states.pop(request_id)
        loop.policies.pop(request_id, None)
        loop.streamed.pop(request_id, None)
        s.finish("aborted")
        loop.pending.append(RequestOutput(request_id, self._result(s, loop.runner)))
        loop.runner.release(request_id)
        return True

    def has_unfinished(self) -> bool:
        loop = self._loop
        return loop is not None and (loop.scheduler.has_unfinished() or bool(loop.pending))

    def request_state(self, request_id: int) -> RequestState | None:
        """The live state of a waiting or running request of the continuous loop (None once it ended); read it
        between steps, on the thread that drives the engine."""
        loop = self._loop
        return loop.states.get(request_id) if loop is not None else None

    @torch.inference_mode()
    def step(self, stream: StreamHook | None = None) -> list[RequestOutput]:
        """One step of the continuous loop: refill free slots, one forward for the running set, per-request
        commits; returns the requests that ended at this step (and those aborted since the last one).
        stream: called once after the step with the requests whose committed left prefix grew or that ended.
        A fault of the model in the forward or the head pass ends only the requests it belongs to (`_forward`,
        `_head`); any other fault of the engine leaves the loop's state half-updated: every request of the loop is
        dropped and the error re-raised; the next add_request starts a new loop."""
        loop = self._loop
        if loop is None:
            return []
        try:
            outputs = self._step(loop)
        except BaseException:
            self._loop = None
            loop.close()
            raise
        if stream is not None:
            updates = stream_updates(loop.states.values(), loop.streamed, outputs, self.special.eos_id)
            if updates:
                stream(updates)
        for out in outputs:
            loop.streamed.pop(out.request_id, None)
        return outputs

    @property
    def forward_stats(self) -> ForwardStats:
        """Counted cost of the continuous loop's forwards (occupancy figures); `self.runner.stats` for generate."""
        return self._loop.runner.stats if self._loop is not None else ForwardStats()

    def _step(self, loop: _Loop) -> list[RequestOutput]:
        """The per-step work both loops share (see the module docstring). A compilation beside the loop pauses while
        the step runs, except while it waits (engine.gil_share)."""
        with loop_activity.busy():
            return self._run_step(loop)

    def _run_step(self, loop: _Loop) -> list[RequestOutput]:
        outputs, loop.pending = loop.pending, []
        cost = lambda rid: self._phase_cost(loop, rid)  # noqa: E731
        loop.scheduler.schedule(cost)
        # the running requests that take this step (under the "phase" policy, those whose phase costs fit its budget;
        # the others are deferred and do nothing at this step)
        running = [loop.states[e.request_id] for e in loop.scheduler.scheduled]
        unparking, unparked = self._unparking(loop, running)
        beside: list[MaskItem] = []
        for s in running:
            if s.phase is not RequestPhase.PARKED and self._isolated(
                    s, self.structured.prepare, s, loop.timing, loop.masks is not None, True):
                beside.append(MaskItem(s, s.canvas_view(self.special.mask_id), s.open_in_block()))
        beside += [MaskItem(s, s.canvas_view(self.special.mask_id), s.open_in_block()) for s in unparking]
        # forced tokens may have closed a block (a Reuse became a Refresh): requests past the step budget now wait
        deferred = loop.scheduler.recost(cost)
        for s in running:
            if s.index in deferred:
                s.step -= 1  # this step's forward-free work is done again, unchanged, when it next runs
        if deferred:
            loop.scheduler.defer(deferred)
            beside = [item for item in beside if item.state.index not in deferred]
        live = [s for s in running if not s.done and s.phase is not RequestPhase.PARKED and s.index not in deferred]
        if not live:
            self.structured.wait_parked(running)
        rows, masks = self._forward(loop, live, beside)
        forwarded = [Forwarded(r.state, r.hidden, r.offset, masks.get(r.state.index), packed=r.packed, start=r.start)
                     for r in rows]
        forwarded += [Forwarded(s, s.parked_rows, 0, masks.get(s.index), parked=True) for s in unparking
                      if s.parked_rows is not None]
        self.after_forward(forwarded, loop.policies, loop.logits_path, loop.timing)
        for s in running:
            if s.done:
                outputs.append(RequestOutput(s.index, self._result(s, loop.runner)))
                loop.scheduler.finish(s.index)
                loop.runner.release(s.index)
                del loop.states[s.index], loop.policies[s.index]
        return outputs

    def _unparking(self, loop: _Loop, running: list[RequestState]) -> tuple[list[RequestState], list[RequestState]]:
        """The parked requests whose constraint is there now: their first forward's masks go beside this step's
        forward when other requests take it and the loop has workers (the loop thread does not hold them all up
        with a cold automaton's first masks; the request takes its next forward one step later); otherwise they
        are committed here, before the forward, which they then take (its own head pass: the step's second)."""
        parked = [s for s in running if s.phase is RequestPhase.PARKED]
        others_forward = loop.masks is not None and any(
            s.phase is not RequestPhase.PARKED and not s.done for s in running)
        beside, here = [], []
        for s in parked:
            self._isolated(s, check_step_bound, s)  # its step and time bounds hold while it waits
            if s.done or not s.pending.constraint_ready:
                continue
            (beside if others_forward else here).append(s)
        if here:
            self.after_forward([Forwarded(s, s.parked_rows, 0, None, parked=True) for s in here], loop.policies,
                               loop.logits_path, loop.timing)
        return beside, here

    def _forward(self, loop: _Loop, live: list[RequestState], beside: list[MaskItem]
                 ) -> tuple[list[Row], dict[int, MaskResult]]:
        """The step's one forward, with this step's mask jobs and the pending compilations beside it; returns its
        rows and the masks the workers computed (every job is joined, also when the forward fails)."""
        refreshed_before = loop.runner.stats.refresh_rows
        start = time.perf_counter()
        batch = None
        loop.forward_running.open()
        try:
            # the forward starts first: with the GIL-free forward it runs on its own thread from here on, and the mask
            # jobs' Python does not hold up the Python that prepares its inputs
            started = start_rows(loop.runner, live)
            # every constraint call of the loop thread is done for this step until the join: the workers own the
            # constraints of the requests they were handed (engine.mask_workers)
            batch = loop.masks.submit(beside) if beside and loop.masks is not None else None
            # constraints still to compile start now, beside the forward: their Python does not delay its start (a
            # mask worker may be resolving one of them meanwhile: `pending` is read once)
            for s in loop.states.values():
                request = s.pending
                if request is not None:
                    request.constraint.start(self.place_helper_thread)
            rows = forward_rows(loop.runner, loop.scheduler, live, started)
        except BaseException:
            loop.forward_running.close()
            if batch is not None:
                batch.wait()  # no worker may still use a constraint once the failure leaves the loop
            raise
        loop.forward_running.close()
        end = time.perf_counter()
        if live:
            loop.timing.add_forward(start, end, refresh=loop.runner.stats.refresh_rows > refreshed_before)
        return rows, (batch.join(loop.timing, (start, end)) if batch is not None else {})

    def prepare_request(self, s: RequestState) -> None:
        """The forward-free part of a lockstep step (engine.block_diffusion): serially, no mask workers; a request's
        typed failure ends it."""
        self._isolated(s, self.structured.prepare, s)

    def after_forward(self, forwarded: Sequence[Forwarded], policies: dict[int, CommitPolicy] | Sequence[CommitPolicy],
                      logits_path: LogitsPath, timing: MaskTiming | None = None) -> None:
        """Everything after the forward for the requests it served: the constraint stage (parking, masks beside the
        forward and their forced tokens), ONE head pass over all their open rows, then each request's commits on
        the host. `policies` by request index; `logits_path` is the one of the loop the requests belong to (a
        generate() call between two steps of the continuous loop has its own)."""
        jobs: list[tuple[HeadJob, CommitPolicy]] = []
        for f in forwarded:
            s = f.state
            if f.parked:
                hidden = self._isolated(s, self.structured.unpark, s, f.masks, timing)
                going_on = hidden is not None
            else:
                hidden, going_on = f.hidden, self._isolated(s, self.structured.after_forward, s, f.hidden, f.offset,
                                                            f.masks, timing)
            masks = self._isolated(s, self.structured.head_masks, s, timing) if going_on else None
            if masks is not None:
                positions, allowed = masks
                job = HeadJob(s, hidden, 0, positions, allowed, s.params.temperature, noise_row_key(s.seed, s.nfe))
                if not f.parked:  # kept rows stand alone; the forward's are rows of its packed output
                    job = replace(job, offset=f.offset, packed=f.packed, start=f.start)
                jobs.append((job, policies[s.index]))
        if not jobs:
            return
        stats = head_stats(logits_path, [job for job, _ in jobs], self.runner.device)
        slot_reads: list[tuple[HeadJob, set[int]]] = []
        for (job, policy), part in zip(jobs, stats):
            if part is not None:
                committed = self._isolated(job.state, self._commit, job, policy, part)
                if committed and job.state.params.read_slots:
                    slot_reads.append((job, committed))
        if slot_reads:
            read_slots(self.model, slot_reads)

    def _commit(self, job: HeadJob, policy: CommitPolicy, stats: RowStats) -> set[int]:
        """One request's decisions from its host statistics: the policy's picks, verified jointly by the constraint
        (the rejected stay open, counted as remasks), undone and banned when they left the canvas uncompletable
        (approximate masks; counted as a backtrack); the rest re-noised. Returns the committed positions."""
        s, positions = job.state, job.positions
        committed: set[int] = set()
        if positions:
            selection = policy.select(stats, s)
            proposals = [(positions[r], int(stats.token[r]), float(score))
                         for r, score in zip(selection.commit, selection.scores)]
            if not proposals:
                self._no_proposal(s)
            accepted = self.structured.verify(s, s.canvas_view(self.special.mask_id), proposals)
            s.commit([p for p, _ in accepted], [t for _, t in accepted])
            if not self.structured.completable(s):
                self._undo(s, accepted)
            else:
                committed = {p for p, _ in accepted}
                renoise = [positions[r] for r in selection.renoise]
                s.renoised += len(renoise)
                self._renoise(s, renoise + sorted({p for p, _, _ in proposals} - committed))
                if s.constraint is not None and self.noised_blocks:
                    # uniform-state models re-noise open positions with samples of the masked distribution, so the
                    # decoder never conditions on tokens the constraint rules out (block_diffusion.noised_block)
                    tokens = stats.token.tolist()
                    s.model_state["masked_samples"] = {p: t for p, t in zip(positions, tokens)
                                                       if t >= 0 and not bool(s.committed[p])}
        s.block_step += 1
        self.structured.settle(s)
        return committed

    def _no_proposal(self, s: RequestState) -> None:
        """No open position of the block has an allowed token: the canvas is not completable."""
        if s.constraint is not None and not bool(s.committed.any()):
            # an all-open canvas is completable iff some output fits it: the time-bounded fit check of
            # new_canvas_state let an output that does not fit in (undecided is not refused); say so now (the
            # regular canvas raises this at its first mask call itself; this covers every other constraint)
            raise ConstraintTooLongError(s.canvas_len + 1, s.canvas_len)
        raise ConstraintError(f"request {s.index}: no open position of block {s.block} has an allowed token; "
                              "the canvas is not completable")

    def _undo(self, s: RequestState, commits: list[tuple[int, int]]) -> None:
        """Reopen this step's commits and ban them at their positions (approximate masks let them in)."""
        for pos, tok in commits:
            s.committed[pos] = False
            s.banned.add((pos, tok))
        self._renoise(s, [p for p, _ in commits])
        s.backtracks += 1

    def _renoise(self, s: RequestState, positions: list[int]) -> None:
        """Open positions get the mask token, or what a uniform-state model's hook says."""
        if not positions:
            return
        tokens = (self.model.renoise_tokens(s, positions) if isinstance(self.model, RenoisingLM)
                  else [self.special.mask_id] * len(positions))
        for pos, tok in zip(positions, tokens):
            if not bool(s.committed[pos]):
                s.canvas[pos] = tok

    @staticmethod
    def _isolated(s: RequestState, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one request's part of a step (returning what it returns); its typed failure ends that request only
        (None is returned)."""
        try:
            return fn(*args)
        except DllmConstrainError as err:
            s.fail(err)
            return None

    # ------------------------------------------------------------------ static batch
    @torch.inference_mode()
    def generate(self, requests: Sequence[Request], progress: ProgressCallback | None = None,
                 config: EngineConfig | None = None, *, raise_errors: bool = True) -> list[GenerationResult]:
        """Denoise all requests (through the request loop under the engine's scheduler limits; each request gets
        the answer it gets alone); results come back in request order. `config` replaces the engine's settings for
        this call only. A request's failure (ConstraintError, GenerationTimeoutError) is raised at once when
        raise_errors, else returned in its result (finish_reason "error", `error` set) while the others go on."""
        t0 = time.perf_counter()
        call_config = config.validate() if config is not None else self.config
        if is_block_diffusion(self.model):
            states = [self._new_state(i, r) for i, r in enumerate(requests)]
            for s in states:
                s.start_time = t0
            self._setup_call(call_config)
            generate_blocks(self, states, [make_policy(s.params) for s in states], progress)
            return [self._result(s, self.runner) for s in states]
        loop = self._new_loop(call_config, self.scheduler_config)
        try:
            states = []
            for i, r in enumerate(requests):
                self._add(loop, r, i)
                states.append(loop.states[i])
            for s in states:
                s.start_time = t0
            results: dict[int, GenerationResult] = {}
            while loop.scheduler.has_unfinished():
                for out in self._step(loop):
                    if out.error is not None and raise_errors:
                        raise out.error
                    results[out.request_id] = out.result
                if progress is not None:
                    progress(self._event(states))
            return [results[i] for i in range(len(states))]
        finally:
            loop.close()

    # ------------------------------------------------------------------ outputs
    def _event(self, states: list[RequestState]) -> StepEvent:
        snaps = [CanvasSnapshot(s.index, s.canvas_view(self.special.mask_id), s.committed.tolist(), s.done,
                                s.pending is None) for s in states]
        return StepEvent(step=max(s.step for s in states), snapshots=snaps, mask_id=self.special.mask_id)

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids)

    def _result(self, s: RequestState, runner: ModelRunner) -> GenerationResult:
        """The result of an ended request (before `runner` releases it)."""
        refreshes = runner.refreshes.get(s.index, s.nfe) if runner.cached else s.nfe
        return request_result(s, self.special, self.decode, refreshes)
