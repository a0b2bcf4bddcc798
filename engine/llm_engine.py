"""The request loop: a scheduler picks the running requests, one model forward per step serves them all, a policy
per request decides what to commit. Continuous batching in nano-vllm's shape: LLMEngine = this loop,
`engine.scheduler.Scheduler` = what runs next, `engine.model_runner.ModelRunner` = one forward.

One step (`LLMEngine._step`, shared by `generate` and the continuous `step()`):
  0. admission (`Scheduler.schedule`): waiting requests fill the slots and tokens freed by the ones that ended
     (FCFS with backfill, a wait bound, a token budget), so a straggler never holds back the others;
  1. forward-free work per request (`_prepare_step`): step/time bound, close finished blocks, stop requests
     whose answer has ended (a committed EOS with everything left of it committed: the rest is filled with EOS
     and no more forwards are spent on it); the constraint masks of the active block's open positions, serially
     here (mask_workers=0, or a forced frontier) with the forced tokens committed at once, or handed to the
     loop's mask workers (see "Masks beside the forward");
  2. ONE forward for all running requests (`ModelRunner.forward_rows`): Refresh rows (whole sequence, KV cache
     entry rewritten) and Reuse rows (active block only, against the request's cached keys/values) of different
     requests are packed into one varlen forward; attention is per request, so each row computes bitwise what
     it computes alone (see engine.model_runner);
  3. per request (`_after_forward`): the masks computed beside the forward are joined (all of them, before any
     commit decision) and their forced tokens committed; project logits only for the open positions of its
     active block, in row chunks under a byte budget (`engine.logits`; never a [batch, canvas, vocab] tensor);
     apply the allowed-token
     mask (the constraint's, plus never the mask token) inside each chunk BEFORE any statistic, so policies rank
     by constrained probabilities; the policy picks rows;
     the constraint verifies them jointly (`select_commits`); rejected ones stay open (counted as remasks).
     If the constraint then reports the canvas uncompletable (possible only with approximate masks), the
     step's commits are undone and banned at their positions (counted as backtracks);
  4. departures: a request that ended (EOS, full canvas, or its own typed error: ConstraintError,
     GenerationTimeoutError) is returned at once as a `RequestOutput`, and its slot, tokens and cache entry are
     freed. Steps 1 and 3 run per request under `_isolated`: one request's failure never touches the others.
Termination: every step commits at least one position (or bans one (position, token) pair), and a step
bound (and the optional per-request `SamplingParams.timeout`) ends a request with GenerationTimeoutError rather
than looping forever.

Masks beside the forward (EngineConfig.mask_workers >= 1; the default None: 1 on CUDA, 0 on CPU;
engine.mask_workers): a step's masks
depend only on the canvas before its forward, so the loop hands them to its worker threads and runs the forward
meanwhile; it joins every job before any commit decision, so a request's constraint is used by one thread at a
time, and requests of one compiled constraint share a job (its automata grow in the loop's order). A job's typed
failure ends its request only, as on the serial path.

Forced tokens (SamplingParams.forced_tokens, default True): a position whose mask allows a single token is
committed without the model. On the serial path (mask_workers=0) they are committed before the forward (from the
second forward on: see "The first forward" below), which then sees them, and a block they close costs no forward
(`forwards_saved`). With mask workers, the mask of the
block's leftmost open position is computed first, alone (cheap: a small part of the block's masks): when it is
forced, the step stays serial as above (so every block forced tokens close, a cascade included, still costs no
forward); otherwise the block's masks go beside the forward and their forced tokens (never the frontier) are
committed after it, before the policy's commits (a forced token changes no other position's mask). Valid either
way, but that forward did not see those forced tokens as context, so outputs may differ from the serial path's.
With forced_tokens=False no position is forced: every commit goes through the policy, the masks are the same on
both paths, and results are identical for mask_workers=0 and >= 1 (same seeds): a canvas state's masks are bounded
by work, never by the clock (docs/constraints.md, "Reproducibility"), so a mask job that shares a core with the
forward takes longer but answers the same (tests/test_determinism.py).

The first forward never waits for the constraint: a request's first forward reads its all-open canvas, and its
masks are computed beside it (mask workers) or after it, their forced tokens committed after it (the one exception:
forced tokens that fill the whole answer are committed at once and no forward is spent). So a request may be
admitted with its constraint still compiling (`Request.constraint` a `PendingConstraint`, as `LLM.generate` makes
for a schema not in the compile cache; the loop starts such a compilation once it has started a forward): the
compilation runs beside the first forward, a mask job waits for it while
the forward runs, and a compilation that outlasts the forward parks the request (`RequestState.parked`: the forward's
rows of the block are kept, the request takes no forward) until it ends; its error then ends that request only. Once
it has compiled, the parked request's masks for those rows are computed by the mask workers beside the next forward
when other requests take one (it takes its own next forward a step later), on the loop thread otherwise. The
answer is the one the request gets with the constraint compiled before (same seed; the masks do not follow the
clock, see "Forced tokens" above).

Threading: the engine is driven from one thread; a server drives `step()` from one thread and hands it
`add_request` / `abort` calls through a queue (the loop state lives in `_Loop`, no global state). The only other
threads are the loop's mask workers, which touch nothing but the constraints of the requests they were handed (a
worker also makes a pending constraint the request's canvas state), and the LLM's compile thread, which compiles.

Block-diffusion models (DiffusionGemma: `encode_prompt`, `init_canvas`, `denoise_step`, `advance`,
`extend_prompt`, `noise`) run the same per-request logic in lockstep blocks (`engine.block_diffusion`): the prompt
is encoded once into a KV cache; each block of `block_length` positions is denoised by the canvas decoder
alone, open positions holding fresh uniform noise drawn from each request's own generator every step (the
re-noising of the entropy-bound sampler; under a constraint, the previous step's samples of the masked
distribution instead), the previous step's logits (divided by the temperature when it is
> 0) fed back as the self-conditioning signal; a finished block is appended to the cache. Committed
positions stay committed (the real sampler re-decides them; constraints need a monotone canvas).

Randomness: each request owns a `torch.Generator` on the model's device (seeded by `SamplingParams.seed`), and
all its noise (Gumbel noise at temperature > 0, uniform-state noise) is drawn there from it. A seed therefore
reproduces a request's results on the same device (and, on CUDA, the same logits budget, which sets the row
chunks), independently of the batch; it does not reproduce them across devices (as in vLLM).

Optional model hooks (all duck-typed, for families with extra per-request state):
  - `model.init_request_state(state)`: called once per request before the first step (may write
    `state.model_state` and fill the open canvas positions with noise using `state.generator`);
  - `model.uses_request_state = True`: `hidden_states` is then called with `request_states=[...]`;
  - `model.renoise_tokens(state, positions) -> list[int]`: the ids re-noised positions get (default mask_id).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from dllm_constrain.constraints.protocol import fill_token_bitmask, first_unfit_pin
from dllm_constrain.engine.block_diffusion import generate_blocks, is_block_diffusion
from dllm_constrain.engine.config import DEFAULT_STEP_TOKENS, EngineConfig
from dllm_constrain.engine.core_split import CoreSplit, pin_current_thread, plan_core_split
from dllm_constrain.engine.gil_share import loop_activity
from dllm_constrain.engine.logits import LogitsPath
from dllm_constrain.engine.mask_workers import ForwardWindow, MaskItem, MaskResult, MaskTiming, MaskWorkers
from dllm_constrain.engine.model_runner import ForwardStats, ModelRunner
from dllm_constrain.engine.placement import usable_cpus
from dllm_constrain.engine.models.base import DiffusionLM
from dllm_constrain.engine.outputs import (
    CanvasSnapshot,
    GenerationResult,
    ProgressCallback,
    RequestOutput,
    StepEvent,
    StreamHook,
    StreamUpdate,
)
from dllm_constrain.engine.policies import CommitPolicy, make_policy
from dllm_constrain.engine.scheduler import Scheduler, SchedulerConfig, TokenBudget, kv_bytes_per_token
from dllm_constrain.engine.state import Request, RequestState
from dllm_constrain.errors import (
    ConstraintError,
    ConstraintTooLongError,
    DllmConstrainError,
    GenerationTimeoutError,
    InvalidRequestError,
    PinnedTokenError,
    PromptTooLongError,
)
from dllm_constrain.kernels.bitmask import (
    allocate_token_bitmask,
    clear_token,
    pack_bool_mask,
    single_token_rows,
    single_tokens,
)

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
        self.base_allowed = self._base_allowed()
        self.base_bitmask = pack_bool_mask(self.base_allowed)  # the same, as one token-bitmask row [W]
        # uniform-state (block) diffusion re-noises open positions, with the masked distribution's samples under a
        # constraint (`_denoise`); masked diffusion re-masks them and has no use for the samples
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
            # beside the forward on CUDA, where the host is idle during the forward; serial on the CPU, where beside
            # the GIL-free forward a request costs 1-6% less with a second core, but a worker step commits forced
            # tokens after the forward instead of before it, so its tokens differ from the serial path's
            # (docs/constraints.md, "Reproducibility")
            workers = 0 if on_cpu else 1
        forward_running = ForwardWindow()

        def beside(s: RequestState, view: list[int], positions: list[int]) -> torch.Tensor | None:
            return self._allowed_beside(s, view, positions, forward_running)

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
        if step is None and config.scheduler == "phase":
            step = max(DEFAULT_STEP_TOKENS, int(self.model.max_sequence_length))
        tokens = limits.max_num_tokens
        if config.kv_budget_bytes is not None:
            per_token = kv_bytes_per_token(self.model)
            if per_token is None:
                raise InvalidRequestError("kv_budget_bytes needs a model whose config names its layers, KV heads and "
                                          "head size")
            kv_tokens = TokenBudget.from_kv_bytes(config.kv_budget_bytes, per_token)
            tokens = kv_tokens if tokens is None else min(tokens, kv_tokens)
        return replace(limits, policy=config.scheduler, max_step_tokens=step, max_num_tokens=tokens).validate()

    def _phase_cost(self, loop: _Loop, request_id: int) -> int:
        """A running request's phase cost for this step (engine.scheduler): 0 when it takes no forward."""
        s = loop.states[request_id]
        if s.done or s.parked is not None:
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
    def _base_allowed(self) -> torch.Tensor:
        """Tokens any canvas position may take: never MASK, nor BOS/PAD (when distinct from EOS), nor the
        padded embedding rows past the tokenizer's vocabulary."""
        allowed = torch.ones(self.vocab_size, dtype=torch.bool)
        sp = self.special
        for tok in (sp.mask_id, sp.bos_id, sp.pad_id):
            if tok is not None and tok != sp.eos_id and 0 <= tok < self.vocab_size:
                allowed[tok] = False
        tok_vocab = None
        if self.tokenizer is not None:
            tok_vocab = getattr(self.tokenizer, "vocab_size", None)
            if callable(getattr(self.tokenizer, "get_vocab_size", None)):
                tok_vocab = self.tokenizer.get_vocab_size()
        if isinstance(tok_vocab, int) and 0 < tok_vocab < self.vocab_size:
            allowed[tok_vocab:] = False
        return allowed

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
        # the request's noise is drawn on the model's device from this generator (no host draw and copy per
        # step), so a seed reproduces its samples on the same device, not across devices (as in vLLM)
        generator = torch.Generator(device=self.runner.device)
        if params.seed is not None:
            generator.manual_seed(params.seed)
        else:
            generator.seed()
        n = params.max_new_tokens
        state = RequestState(
            index=index,
            prompt_ids=list(request.prompt_ids),
            params=params,
            canvas=torch.full((n,), self.special.mask_id, dtype=torch.long),
            committed=torch.zeros(n, dtype=torch.bool),
            generator=generator,
        )
        pins = params.pinned_tokens()
        if defer and not request.constraint_ready and not pins:
            state.pending = request
        else:
            # a template's pins are checked against the constraint before any forward, so its compilation is waited
            # for here (it cannot run beside the first forward)
            state.constraint = request.constraint_state()  # made for this canvas (max_new_tokens)
        if pins:
            self._pin(state, pins)
        hook = getattr(self.model, "init_request_state", None)
        if callable(hook):
            hook(state)
        return state

    def _pin(self, s: RequestState, pins: dict[int, int]) -> None:
        """Commit a template's pinned tokens (before the first step), after checking that some valid output holds
        them: tokens the model may write at all, EOS only followed by EOS (the canvas conventions), and under a
        constraint a completable pinned canvas (`first_unfit_pin`). Raises PinnedTokenError naming the first
        position that cannot be part of any valid output."""
        special = next((p for p, t in pins.items() if not self._base_allows(t)), None)
        if s.constraint is not None:
            # validity under a constraint includes the EOS tail; the pins left of a special are searched
            bad = first_unfit_pin(s.constraint, s.canvas_len, {p: t for p, t in pins.items()
                                                                 if special is None or p < special},
                                  self.special.mask_id)
            if bad is not None:
                text = self.decode([pins[bad]]) if self.tokenizer is not None else ""
                raise PinnedTokenError(
                    f"pinned token {pins[bad]} ({text!r}) at canvas position {bad} cannot be part of any output the "
                    f"constraint accepts (given the pins left of it)", position=bad, token=pins[bad])
        else:
            eos = self.special.eos_id
            eos_at = next((p for p, t in pins.items() if t == eos), None)
            after = next((p for p, t in pins.items() if eos_at is not None and p > eos_at and t != eos), None)
            if after is not None and (special is None or after < special):
                raise PinnedTokenError(f"pinned token {pins[after]} at canvas position {after} follows the pinned "
                                       f"EOS at position {eos_at}: after EOS only EOS is valid",
                                       position=after, token=pins[after])
        if special is not None:
            raise PinnedTokenError(f"pinned token {pins[special]} at canvas position {special} is not one the model "
                                   f"may write (a special such as MASK/BOS/PAD, or past the vocabulary)",
                                   position=special, token=pins[special])
        s.commit(list(pins), list(pins.values()))

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
        A step that raises (a fault of the model or the engine, not a request's own typed error, which only ends
        that request) leaves the loop's state half-updated: every request of the loop is dropped and the error
        re-raised; the next add_request starts a new loop."""
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
            updates = self._stream_updates(loop, outputs)
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
        """The per-step work both loops share: admission, forward-free work, one forward, commits, departures. A
        request whose own work raises a DllmConstrainError (constraint failure, step or time bound) ends with it;
        the others go on. A compilation beside the loop pauses while the step runs, except while it waits
        (engine.gil_share)."""
        with loop_activity.busy():
            return self._run_step(loop)

    def _run_step(self, loop: _Loop) -> list[RequestOutput]:
        outputs, loop.pending = loop.pending, []
        cost = lambda rid: self._phase_cost(loop, rid)  # noqa: E731
        loop.scheduler.schedule(cost)
        # the running requests that take this step (under the "phase" policy, those whose phase costs fit its budget;
        # the others are deferred and do nothing at this step)
        running = [loop.states[e.request_id] for e in loop.scheduler.scheduled]
        parked = [s for s in running if s.parked is not None]
        # a parked request whose constraint is there now gets its first forward's masks: beside this step's
        # forward when other requests take it and the loop has workers (the loop thread does not hold them all up
        # with a cold automaton's first masks; the request takes its next forward one step later), else here
        others_forward = loop.masks is not None and any(s.parked is None and not s.done for s in running)
        unparking: list[RequestState] = []
        for s in parked:
            self._isolated(s, self._check_step_bound, s)  # its step and time bounds hold while it waits
            if s.done or not s.pending.constraint_ready:
                continue
            if others_forward:
                unparking.append(s)
            else:
                self._isolated(s, self._unpark, s, loop.policies[s.index], loop.logits_path, None, loop.timing)
        beside: list[MaskItem] = []
        for s in running:
            if s.parked is None and self._isolated(s, self._prepare_step, s, loop.timing, loop.masks is not None,
                                                   True):
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
        live = [s for s in running if not s.done and s.parked is None and s.index not in deferred]
        if not live:
            self._wait_parked(running)
        refreshed_before = loop.runner.stats.refresh_rows
        start = time.perf_counter()
        batch = None
        loop.forward_running.open()
        try:
            # the forward starts first: with the GIL-free forward it runs on its own thread from here on, and the mask
            # jobs' Python does not hold up the Python that prepares its inputs
            finish = loop.runner.start_rows(live)
            # every constraint call of the loop thread is done for this step until the join: the workers own the
            # constraints of the requests they were handed (engine.mask_workers)
            batch = loop.masks.submit(beside) if beside and loop.masks is not None else None
            # constraints still to compile start now, beside the forward: their Python does not delay its start (a
            # mask worker may be resolving one of them meanwhile: `pending` is read once)
            for s in loop.states.values():
                request = s.pending
                if request is not None:
                    request.constraint.start(self.place_helper_thread)
            rows = finish()
        except BaseException:
            loop.forward_running.close()
            if batch is not None:
                batch.wait()  # no worker may still use a constraint once the failure leaves the loop
            raise
        loop.forward_running.close()
        end = time.perf_counter()
        if live:
            loop.timing.add_forward(start, end, refresh=loop.runner.stats.refresh_rows > refreshed_before)
        masks = batch.join(loop.timing, (start, end)) if batch is not None else {}
        for row in rows:
            s = row.state
            self._isolated(s, self._after_forward, s, loop.policies[s.index], row.hidden, row.offset,
                           loop.logits_path, masks.get(s.index), loop.timing)
        for s in unparking:
            self._isolated(s, self._unpark, s, loop.policies[s.index], loop.logits_path, masks.get(s.index),
                           loop.timing)
        for s in running:
            if s.done:
                outputs.append(RequestOutput(s.index, self._result(s, loop.runner)))
                loop.scheduler.finish(s.index)
                loop.runner.release(s.index)
                del loop.states[s.index], loop.policies[s.index]
        return outputs

    def _unpark(self, s: RequestState, policy: CommitPolicy, logits_path: LogitsPath, masks: MaskResult | None,
                timing: MaskTiming | None) -> None:
        """A parked request whose constraint has compiled (or failed) since: its first forward's commits now, from
        the rows it kept. `masks`: those rows' masks, computed by the workers beside this step's forward (see
        `_step`); without them they are computed here."""
        if masks is not None and masks.compiling:
            masks = None
        s.masks_after_forward = masks is None
        hidden, s.parked = s.parked, None
        self._commit_after_forward(s, policy, hidden, 0, logits_path, masks, timing)

    @staticmethod
    def _wait_parked(running: list[RequestState]) -> None:
        """No request can take a forward: wait a little for a parked one's compilation (the caller steps again)."""
        futures = [s.pending.constraint.future for s in running if s.parked is not None and not s.done]
        if futures:
            with loop_activity.waiting():
                wait_futures(futures, timeout=0.02, return_when=FIRST_COMPLETED)

    @staticmethod
    def _isolated(s: RequestState, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one request's part of a step (returning what it returns); its typed failure ends that request only
        (None is returned)."""
        try:
            return fn(*args)
        except DllmConstrainError as err:
            s.fail(err)
            return None

    def _stream_updates(self, loop: _Loop, outputs: list[RequestOutput]) -> list[StreamUpdate]:
        """Committed left prefixes that grew at this step (running requests) or ended (outputs)."""
        eos = self.special.eos_id
        updates = []
        for s in loop.states.values():  # waiting and running requests (ended ones were removed)
            prefix = s.committed_prefix(eos)
            seen = loop.streamed.get(s.index, 0)
            if len(prefix) > seen:
                loop.streamed[s.index] = len(prefix)
                updates.append(StreamUpdate(s.index, prefix, prefix[seen:], False))
        for out in outputs:
            ids = out.result.token_ids
            seen = min(loop.streamed.get(out.request_id, 0), len(ids))
            updates.append(StreamUpdate(out.request_id, ids, ids[seen:], True))
        return updates

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

    def _prepare_step(self, s: RequestState, timing: MaskTiming | None = None, workers: bool = False,
                      first_beside: bool = False) -> bool:
        """The forward-free part of a step: bound check, block/EOS bookkeeping, and the masks with the forced
        tokens, serially, unless the loop has mask workers (`workers`) and this step's masks can wait for them:
        then True is returned and the loop hands them to its workers, beside the forward.

        With `first_beside` (the request loop), a request's first forward never waits for its constraint: it reads
        the all-open canvas, nothing is forced before it, and its masks are computed beside it (workers) or after it
        (`masks_after_forward`), their forced tokens committed after it. So a constraint still compiling
        (`RequestState.pending`) compiles beside that forward, and a request gets the same answer whether its
        constraint was compiled before (a cached schema) or during its first forward. One exception keeps a
        compiled constraint's forced tokens before the first forward: when they fill the whole canvas (a `const`
        schema, say), the request ends without any forward (`_forced_fill`); its answer is the only one there is.

        With workers and forced tokens on, the tokens the committed prefix forces at the block's leftmost open
        position (the frontier) are committed first, from the constraint's cheap hint (`_commit_prefix_forced`: no
        mask computed; a block they close, or a cascade of them, costs no forward), and the block's masks go beside
        the forward. A constraint without the hint has the frontier's mask computed alone instead: if it allows one
        token the step stays serial (forced tokens committed before the forward, which sees them), if not the
        masks go beside the forward (docs/constraints.md has the measured figures)."""
        self._check_step_bound(s)
        s.step += 1
        self._settle(s)
        if s.done or (s.constraint is None and s.pending is None):
            return False
        if first_beside and s.nfe == 0:
            if s.pending is None and s.params.forced_tokens:
                if self._forced_fill(s, timing, workers):
                    return False
                if s.allowed_cache is not None:  # the check computed the masks: they serve after the forward
                    s.masks_after_forward = True
                    return False
            if workers:
                return True
            s.masks_after_forward = True
            return False
        if workers:
            if not s.params.forced_tokens:
                return True
            hinted = self._commit_prefix_forced(s, timing)
            if hinted is not None:
                return hinted
            if not self._frontier_forced(s, timing):
                return True
        if s.params.forced_tokens:
            self._commit_forced(s, timing)
        else:
            positions = s.open_in_block()
            s.allowed_cache = (positions, self._timed_allowed(s, s.canvas_view(self.special.mask_id), positions,
                                                              timing))
        return False

    def _forced_fill(self, s: RequestState, timing: MaskTiming | None, workers: bool) -> bool:
        """Whether the forced tokens alone complete the request's answer: they are then committed (no forward is
        needed); otherwise the canvas is left as it was (the first forward reads it all open). With mask workers
        and the constraint's cheap prefix hint, the hint's chain decides; else the active block's masks are
        computed, and unless every row is forced they stay in `allowed_cache` for after the forward."""
        saved = (s.canvas.clone(), s.committed.clone(), s.block, s.block_step, s.forced_tokens, s.forwards_saved)
        hinted = callable(getattr(s.constraint, "prefix_forced_token", None))
        if workers and hinted:
            self._commit_prefix_forced(s, timing)
        else:
            positions = s.open_in_block()
            allowed = self._timed_allowed(s, s.canvas_view(self.special.mask_id), positions, timing)
            if not bool(single_token_rows(allowed).all()):
                s.allowed_cache = (positions, allowed)
                return False
            self._commit_forced(s, timing)
        if s.done:
            return True
        s.canvas, s.committed, s.block, s.block_step, s.forced_tokens, s.forwards_saved = saved
        s.allowed_cache = None
        return False

    def _commit_prefix_forced(self, s: RequestState, timing: MaskTiming | None) -> bool | None:
        """With mask workers: commit, before the forward, the chain of tokens the committed prefix alone forces at
        the left frontier (the constraint's cheap `prefix_forced_token` hint: no mask is computed), moving to the
        next block when one closes (a block closed this way costs no forward). Returns whether the step's masks
        go to the workers (False: the request ended), or None when the constraint offers no hint (the caller
        probes the frontier's mask instead).

        Why it is safe: the canvas is completable and the prefix row is a superset of the frontier's mask, so a
        single prefix token is the frontier's only allowed token. Positions forced by tokens to their right are
        found by the masks beside the forward and committed after it (`_take_masks`)."""
        hint = getattr(s.constraint, "prefix_forced_token", None)
        if not callable(hint):
            return None
        mask_id = self.special.mask_id
        while not s.done:
            positions = s.open_in_block()
            view = s.canvas_view(mask_id)
            start = time.perf_counter()
            token = hint(view, positions[0])
            if timing is not None:
                timing.add_mask(start, time.perf_counter(), probe=True)
            if token is None or (positions[0], token) in s.banned or not self._base_allows(token):
                break
            steps_left = s.budget[s.block] - s.block_step
            block_before = s.block
            s.commit([positions[0]], [token])
            s.forced_tokens += 1
            self._settle(s)
            if s.block != block_before or s.done:
                self._count_saved(s, steps_left)
        return not s.done

    def _base_allows(self, token: int) -> bool:
        """Whether the engine's own mask (specials the model may not write) allows `token`."""
        return 0 <= token < self.vocab_size and bool(self.base_allowed[token])

    @staticmethod
    def _count_saved(s: RequestState, steps_left: int) -> None:
        """A block closed by forced tokens without a forward: the rest of its step budget is saved."""
        s.forwards_saved += max(1, steps_left) if s.params.policy in ("quota", "entropy", "margin") else 1

    def _frontier_forced(self, s: RequestState, timing: MaskTiming | None) -> bool:
        """Whether the mask of the active block's leftmost open position allows a single token."""
        frontier = s.open_in_block()[:1]
        row = self._timed_allowed(s, s.canvas_view(self.special.mask_id), frontier, timing, probe=True)
        return bool(single_token_rows(row)[0])

    def _after_forward(self, s: RequestState, policy: CommitPolicy, hidden: torch.Tensor, offset: int,
                       logits_path: LogitsPath, masks: MaskResult | None = None,
                       timing: MaskTiming | None = None) -> None:
        """The part of a step after the forward: the masks computed beside it (`masks`: their forced tokens, see
        `_take_masks`), policy, joint verification, backtracking, bookkeeping. `logits_path` is the one of the loop
        the request belongs to (a generate() call between two steps of the continuous loop has its own)."""
        s.nfe += 1
        if masks is not None and masks.compiling:  # its masks are computed after the forward instead
            s.masks_after_forward, masks = True, None
        if s.pending is not None and not s.pending.constraint_ready:
            # the constraint is still compiling: keep the rows this forward gave the block until it has (their
            # masks are computed then, as on the serial path)
            positions = s.open_in_block()
            kept = hidden.new_zeros((positions[-1] + 1, hidden.shape[-1]))
            kept[positions] = hidden[[offset + p for p in positions]]
            s.parked, s.masks_after_forward = kept, True
            return
        self._commit_after_forward(s, policy, hidden, offset, logits_path, masks, timing)

    def _commit_after_forward(self, s: RequestState, policy: CommitPolicy, hidden: torch.Tensor, offset: int,
                              logits_path: LogitsPath, masks: MaskResult | None, timing: MaskTiming | None) -> None:
        """`_after_forward` once the request's constraint is there (a pending one is made the request's canvas
        state here, raising its compilation or fit error for this request)."""
        self._resolve_pending(s)
        if s.masks_after_forward:
            s.masks_after_forward = False
            if s.constraint is not None:
                positions = s.open_in_block()
                start = time.perf_counter()
                cached, s.allowed_cache = s.allowed_cache, None
                allowed = (cached[1] if cached is not None and cached[0] == positions
                           else self._timed_allowed(s, s.canvas_view(self.special.mask_id), positions, timing))
                masks = MaskResult(positions, allowed, None, start, time.perf_counter())
        if masks is not None and self._take_masks(s, masks):
            return
        self._denoise(s, policy, hidden, offset, logits_path, timing)
        s.block_step += 1
        self._settle(s)

    # ------------------------------------------------------------------ pieces of a step
    def _check_step_bound(self, s: RequestState) -> None:
        bound = 4 * s.canvas_len + 64
        if s.step >= bound:
            raise GenerationTimeoutError(
                f"request {s.index} did not finish within {bound} steps (canvas of {s.canvas_len} tokens)")
        timeout = s.params.timeout
        if timeout is not None and time.perf_counter() - s.start_time > timeout:
            raise GenerationTimeoutError(f"request {s.index} did not finish within its timeout of {timeout} s")

    def _timed_allowed(self, s: RequestState, view: list[int], positions: list[int],
                       timing: MaskTiming | None, probe: bool = False) -> torch.Tensor:
        """`_allowed` computed on the loop thread (serially), its time recorded in `timing`."""
        start = time.perf_counter()
        allowed = self._allowed(s, view, positions)
        if timing is not None:
            timing.add_mask(start, time.perf_counter(), probe=probe)
        return allowed

    def _allowed_beside(self, s: RequestState, view: list[int], positions: list[int],
                        forward_running: ForwardWindow) -> torch.Tensor | None:
        """`_allowed` on a mask worker. A constraint still compiling is waited for while the forward runs and made
        the request's canvas state here (the worker owns the request's constraint until the join); None when it is
        still compiling after the forward (the request then parks, see `_after_forward`)."""
        if s.pending is not None:
            pending = s.pending.constraint
            pending.start(self.place_helper_thread)
            if not forward_running.wait_done(pending.future):
                return None
            self._resolve_pending(s)
        return self._allowed(s, view, positions)

    @staticmethod
    def _resolve_pending(s: RequestState) -> None:
        """Make a compiled pending constraint the request's canvas state (its compilation or fit error is raised)."""
        if s.pending is not None:
            s.constraint, s.pending = s.pending.constraint_state(), None

    def _allowed(self, s: RequestState, view: list[int], positions: list[int]) -> torch.Tensor:
        """Token bitmask int32 [len(positions), ceil(vocab / 32)] (kernels.bitmask): the constraint fills it in
        place, the base mask and the banned pairs narrow it, and the logits path hands it to the kernels as is."""
        if s.constraint is None:
            allowed = self.base_bitmask.expand(len(positions), -1).clone()
        else:
            allowed = allocate_token_bitmask(len(positions), self.vocab_size)
            fill_token_bitmask(s.constraint, view, positions, allowed)
            allowed &= self.base_bitmask
        for j, pos in enumerate(positions):
            for bpos, btok in s.banned:
                if bpos == pos and 0 <= btok < self.vocab_size:
                    clear_token(allowed, j, btok)
        return allowed

    def _denoise(self, s: RequestState, policy: CommitPolicy, hidden: torch.Tensor, offset: int,
                 logits_path: LogitsPath, timing: MaskTiming | None = None) -> None:
        positions = s.open_in_block()
        if not positions:
            return
        view = s.canvas_view(self.special.mask_id)
        cached, s.allowed_cache = s.allowed_cache, None
        allowed = (cached[1] if cached is not None and cached[0] == positions
                   else self._timed_allowed(s, view, positions, timing))
        # logits for the open positions in budgeted chunks, each masked and reduced at once
        stats = logits_path.row_stats(hidden[[offset + p for p in positions]], allowed, s.params.temperature,
                                      s.generator)
        selection = policy.select(stats, s)
        proposals = [(positions[r], int(stats.token[r]), float(score))
                     for r, score in zip(selection.commit, selection.scores)]
        if not proposals:
            if s.constraint is not None and not bool(s.committed.any()):
                # an all-open canvas is completable iff some output fits it: the time-bounded fit check of
                # new_canvas_state let an output that does not fit in (undecided is not refused); say so now (the
                # regular canvas raises this at its first mask call itself; this covers every other constraint)
                raise ConstraintTooLongError(len(view) + 1, len(view))
            raise ConstraintError(
                f"request {s.index}: no open position of block {s.block} has an allowed token; "
                "the canvas is not completable")
        accepted: list[tuple[int, int]] = [(p, t) for p, t, _ in proposals]
        if s.constraint is not None:
            accepted = [(int(p), int(t)) for p, t in s.constraint.select_commits(view, proposals)]
            if not accepted:  # each proposal was allowed alone, so the best one alone is safe
                accepted = [proposals[0][:2]]
            s.remasks += len(proposals) - len(accepted)
        s.commit([p for p, _ in accepted], [t for _, t in accepted])
        if s.constraint is not None and not s.constraint.is_completable(s.canvas_view(self.special.mask_id)):
            self._undo(s, accepted)
            return
        if s.params.read_slots:
            self._read_slots(s, positions, hidden, offset, accepted)
        renoise = [positions[r] for r in selection.renoise]
        s.renoised += len(renoise)
        rejected = {p for p, _, _ in proposals} - {p for p, _ in accepted}
        self._renoise(s, renoise + sorted(rejected))
        if s.constraint is not None and self.noised_blocks:
            # uniform-state models re-noise open positions with samples of the masked distribution, so the
            # decoder never conditions on tokens the constraint rules out (see block_diffusion.noised_block)
            s.model_state["masked_samples"] = {positions[r]: int(stats.token[r]) for r in range(len(positions))
                                               if int(stats.token[r]) >= 0 and not bool(s.committed[positions[r]])}

    def _read_slots(self, s: RequestState, positions: list[int], hidden: torch.Tensor, offset: int,
                    accepted: list[tuple[int, int]]) -> None:
        """Keep the reading of every slot (SamplingParams.read_slots) this step's commits touched first: the
        log-probabilities of the slot's ids at its positions that were open at this forward (the others, committed
        before without the model, stay NaN). One LM-head projection of the slot's rows, only for such slots."""
        committed = {p for p, _ in accepted}
        open_rows = {p: r for r, p in enumerate(positions)}
        for k, (start, end, ids) in enumerate(s.params.read_slots or ()):
            if k in s.slot_reads or not any(start <= p < end for p in committed):
                continue
            rows = [p for p in range(start, end) if p in open_rows]
            read = torch.full((end - start, len(ids)), float("nan"))
            if rows:
                logits = self.model.logits(hidden[[offset + p for p in rows]]).float()
                logp = torch.log_softmax(logits, dim=-1)[:, list(ids)].cpu()
                read[[p - start for p in rows]] = logp
            s.slot_reads[k] = read

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
        hook = getattr(self.model, "renoise_tokens", None)
        tokens = hook(s, positions) if callable(hook) else [self.special.mask_id] * len(positions)
        for pos, tok in zip(positions, tokens):
            if not bool(s.committed[pos]):
                s.canvas[pos] = tok

    def _commit_forced(self, s: RequestState, timing: MaskTiming | None = None) -> None:
        """Commit every open position of the active block whose allowed set has exactly one token: no model
        confidence needed. The masks come from `fill_token_bitmask` on the current canvas, before the forward;
        committing a forced token leaves the set of valid completions (hence every other mask) unchanged,
        so the remaining rows are kept for the step's commit decision. A block closed this way moves on to
        the next one without a forward (counted in `forwards_saved`)."""
        while not s.done:
            positions = s.open_in_block()
            allowed = self._timed_allowed(s, s.canvas_view(self.special.mask_id), positions, timing)
            steps_left = s.budget[s.block] - s.block_step
            block_before = s.block
            closed = self._force_rows(s, positions, allowed)
            if closed:
                self._count_saved(s, steps_left)
            if not s.done and s.block == block_before:
                return
            s.allowed_cache = None

    def _take_masks(self, s: RequestState, masks: MaskResult) -> bool:
        """This step's masks computed beside the forward, on the canvas the forward saw: re-raise the job's
        failure (a typed one ends this request only, see `_isolated`), else commit their forced tokens now, after
        the forward (forced_tokens on), and keep the other rows for the policy. True when the forced tokens
        closed the block or ended the request: the step is then over for it (its forward was spent, none saved).

        The trade-off against the serial path: the forward of this step did not see this step's forced tokens as
        context (the serial path commits them before it), so the policy's picks, hence the outputs, may differ;
        they stay valid (a forced token never changes another position's mask, and the policy's commits are
        verified jointly on the canvas with the forced tokens in). The frontier is not among them (a forced
        frontier keeps the step serial, see `_prepare_step`), so they do not close the block, unless a constraint
        answers the frontier differently in the two calls (then the forward was spent, none saved)."""
        if masks.error is not None:
            raise masks.error
        positions = s.open_in_block()
        if masks.positions != positions or masks.allowed is None:  # not the canvas the job saw: recompute later
            return False
        if not s.params.forced_tokens:
            s.allowed_cache = (positions, masks.allowed)
            return False
        block_before = s.block
        self._force_rows(s, positions, masks.allowed)
        if s.done or s.block != block_before:
            s.allowed_cache = None
            return True
        return False

    def _force_rows(self, s: RequestState, positions: list[int], allowed: torch.Tensor) -> bool:
        """Commit the positions whose mask row allows a single token (counted in `forced_tokens`), settle, and
        cache the other rows for the policy (`allowed_cache`). True when the forced tokens closed the block."""
        forced = single_tokens(allowed).tolist()  # a few rows: Python lists, not a torch op per question
        rows = [r for r, t in enumerate(forced) if t >= 0]
        if not rows:
            s.allowed_cache = (positions, allowed)
            return False
        s.commit([positions[r] for r in rows], [forced[r] for r in rows])
        s.forced_tokens += len(rows)
        block_before = s.block
        self._settle(s)
        if not s.done and s.block == block_before:
            keep = [r for r, t in enumerate(forced) if t < 0]
            # a budgeted constraint may leave masks right of the left frontier empty (sound, not exact);
            # the forced commits may have made one of them the new frontier, whose mask must then be
            # recomputed (the constraint decides the frontier exactly): keep the rows only if it is not empty
            if keep:
                kept = allowed[keep]
                if bool(kept[0].any()):
                    s.allowed_cache = ([positions[r] for r in keep], kept)
        return len(rows) == len(positions)
    def _settle(self, s: RequestState) -> None:
        """Stop if the answer has ended (fill the tail with EOS); otherwise move past completed blocks."""
        eos = self.special.eos_id
        while not s.done:
            first = self._answer_end(s)  # EOS or a stop id (the answer ends there; the tail becomes EOS)
            if first is not None and bool(s.committed[:first].all()):
                s.canvas[first:] = eos
                s.committed[first:] = True
                s.finish("eos")
                return
            if bool(s.committed.all()):
                s.finish("length")
                return
            if s.open_in_block():
                return
            s.block += 1
            s.block_step = 0
            s.schedule_step = 0

    def _answer_end(self, s: RequestState) -> int | None:
        """The first committed EOS or stop id that ends the answer. Under a constraint a stop id other than EOS ends
        it only where the constraint accepts the text before it as a whole output; elsewhere it is content (a stop
        id the constraint allows mid-answer must not cut the answer into an invalid one)."""
        eos = self.special.eos_id
        for p in s.stop_positions(eos):
            if s.constraint is None or int(s.canvas[p]) == eos:
                return p
            ended = s.canvas_view(self.special.mask_id)[:p] + [eos] * (s.canvas_len - p)
            if s.constraint.is_completable(ended):
                return p
        return None

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
        """The result of an ended request (before `runner` releases it). A failed or aborted request's answer is
        its committed left prefix and its canvas shows open positions as mask_id."""
        eos = self.special.eos_id
        if s.finish_reason in ("eos", "length"):
            canvas = s.canvas.tolist()
            end = canvas.index(eos) if eos in canvas else len(canvas)
            answer = canvas[:end]
        else:
            canvas = s.canvas_view(self.special.mask_id)
            answer = s.committed_prefix(eos)
            end = len(answer)
        produced = end + (1 if end < len(canvas) else 0)
        wall = (s.end_time or time.perf_counter()) - s.start_time
        return GenerationResult(
            text=self.decode(answer),
            token_ids=answer,
            nfe=s.nfe,
            tokens_per_forward=produced / s.nfe if s.nfe else float(produced),
            forced_tokens=s.forced_tokens,
            remasks=s.remasks,
            wall_time=wall,
            finish_reason=s.finish_reason or "length",
            canvas_ids=canvas,
            steps=s.step,
            forwards_saved=s.forwards_saved,
            renoised=s.renoised,
            backtracks=s.backtracks,
            refreshes=runner.refreshes.get(s.index, s.nfe) if runner.cached else s.nfe,
            error=s.error,
            slot_logprobs=[s.slot_reads.get(k) for k in range(len(s.params.read_slots))]
            if s.params.read_slots else None,
        )
