"""What one request is: its inputs (`Request`, `SamplingParams` with its `OutputConstraint`) and its evolving
canvas (`RequestState`).

The dataclass field defaults here are the one place the per-request defaults live (the API routes its keyword
arguments onto these fields by name; a checkpoint's generation_config.json may override some, see
`dllm_constrain.api.GenerationDefaults`). The canvas length is stated once, as `max_new_tokens`: a request's
constraint state is made from its compiled constraint for that length (`Request.constraint_state`).

The canvas is the answer region only (length max_new_tokens). `committed[i]` says whether position i is
final; an open position holds `mask_id` (or, for uniform-state models, a noise token the model overwrites).
Blocks: the canvas is cut into blocks of `block_length` (the last one may be shorter); only the active
block's open positions may be committed (semi-autoregressive decoding). The step budget is split over the
blocks as evenly as possible (`steps_per_block`).
"""
from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

import torch

from dllm_constrain.constraints.canvas import DEFAULT_CALL_TIMEOUT_S
from dllm_constrain.constraints.compiler import Compiled, new_request_state
from dllm_constrain.constraints.deadline import pausing
from dllm_constrain.constraints.protocol import CanvasConstraint
from dllm_constrain.engine.gil_share import compiling_beside, loop_activity
from dllm_constrain.engine.policies import POLICY_NAMES
from dllm_constrain.errors import InvalidRequestError
from dllm_constrain.option_checks import (
    bool_check,
    choice_check,
    instance_check,
    int_check,
    int_tuple_check,
    real_check,
    seed_check,
    validate_fields,
)

# how many positions a quota policy commits per step (engine.policies.commit_count): "uniform" is LLaDA's
# get_num_transfer_tokens per block (ceil(open / steps_left)), "linspace" Dream's diffusion_generate schedule
# (int(open * (1 - s / t)) on timesteps linspace(1, eps, steps + 1), everything left at the last step)
SCHEDULES = ("uniform", "linspace")

# each SamplingParams field's one check (dllm_constrain.option_checks): `validate()` and the API's keyword routing
# (dllm_constrain.options, where None keeps the checkpoint's value) report a bad value in the same words
SAMPLING_CHECKS = {name: check.named(name) for name, check in {
    "max_new_tokens": int_check(1), "steps": int_check(1, optional=True), "block_length": int_check(1),
    "temperature": real_check(0.0), "seed": seed_check(), "policy": choice_check(POLICY_NAMES),
    "threshold": real_check(0.0, 1.0), "entropy_bound": real_check(0.0, lo_open=True),
    "timeout": real_check(0.0, lo_open=True, optional=True),
    "constraint_timeout": real_check(0.0, lo_open=True, optional=True), "forced_tokens": bool_check(),
    "schedule": choice_check(SCHEDULES), "schedule_eps": real_check(0.0, 1.0, lo_open=True, hi_open=True),
    "stop_token_ids": int_tuple_check("a list of token ids >= 0", 0, optional=False),
    "order_temperature": real_check(0.0), "seed_canvas": int_tuple_check(), "pinned": int_tuple_check(),
    "template": instance_check("text with holes", str), "hole_length": int_check(1),
}.items()}

# JSON Schema options for generation (like xgrammar's strict_mode): an object schema that does not say
# `additionalProperties` gets no undeclared properties, a schema without `type` produces the types its
# keywords imply, undeclared property names (where the schema allows them) are never empty, properties come in
# their declared order (what a model asked for the schema writes; any-order member sets make the canvas
# explore many more states: docs/constraints.md, Figures), integers are written without ".0" and free-form
# values nest at most 3 levels (6 for the spec semantics: deeper free-form values cost the canvas states).
# All are sound narrowings; `strict=False` compiles with the specification's defaults.
STRICT_SCHEMA_OPTIONS: dict[str, Any] = {"additional_properties": "forbid", "untyped_types": "inferred",
                                         "additional_names": "nonempty", "property_order": "declared",
                                         "integer_zero_fraction": "never", "any_json_depth": 3}


@dataclass(frozen=True)
class OutputConstraint:
    """What a request's answer must match: at most one of a JSON Schema (as a dict), a regex pattern or Lark
    grammar text, and how to compile it. The front end (dllm_constrain.api) checks and normalises the user's
    value (output-type objects, JSON strings, shipped grammar names) before it lands here.

    strict: compile a JSON Schema with STRICT_SCHEMA_OPTIONS (False: the specification's semantics);
    schema_options: `json_schema.SchemaOptions` fields overriding either; whitespace: the SchemaOptions field;
    compile_timeout: seconds for compiling (None: the compiler's default, 10 s)."""

    schema: Any = None
    regex: str | None = None
    grammar: str | None = None
    whitespace: str | None = None
    strict: bool = True
    schema_options: dict[str, Any] | None = None
    compile_timeout: float | None = None

    @property
    def empty(self) -> bool:
        return self.schema is None and self.regex is None and self.grammar is None

    def compile_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `ConstraintCompiler.compile` for this constraint."""
        limit = {} if self.compile_timeout is None else {"timeout_s": self.compile_timeout}
        if self.regex is not None:
            return {"regex": self.regex, **limit}
        if self.grammar is not None:
            return {"grammar": self.grammar}
        options = {**(STRICT_SCHEMA_OPTIONS if self.strict else {}), **(self.schema_options or {})}
        if self.whitespace is not None:
            options["whitespace"] = self.whitespace
        return {"schema": self.schema, **options, **limit}


@dataclass(frozen=True)
class SamplingParams:
    """How to denoise one request. `steps=None` means one step per canvas position (LLaDA's default).

    `threshold` is the Fast-dLLM confidence threshold (policy "threshold"); `entropy_bound` is the
    DiffusionGemma acceptance bound gamma (policy "entropy_bound"). Quota policies ("quota", "entropy",
    "margin") spend exactly the step budget per block unless a block completes early; adaptive policies
    ("threshold", "entropy_bound") commit at least one position per forward and ignore the budget.
    """

    max_new_tokens: int = 128
    steps: int | None = None
    block_length: int = 32
    temperature: float = 0.0
    seed: int | None = None
    policy: str = "quota"
    threshold: float = 0.9
    entropy_bound: float = 0.1
    timeout: float | None = None  # seconds from arrival after which the request ends with GenerationTimeoutError
    constraint: OutputConstraint | None = None  # compiled by the front end (LLM), see Request.constraint
    # seconds each constraint call of the request may take (masks, joint verification, completability, the fit
    # check; None: unbounded); past it a call answers soundly or the request ends with ConstraintTimeoutError
    constraint_timeout: float | None = DEFAULT_CALL_TIMEOUT_S
    # commit the positions whose constraint mask allows a single token without the model (False: every position
    # goes through the policy; see "Forced tokens" in engine.llm_engine)
    forced_tokens: bool = True
    # the quota policies' per-step commit count (SCHEDULES); the checkpoint's family picks it (LLaDA "uniform",
    # Dream "linspace", see dllm_constrain.options.GenerationDefaults)
    schedule: str = "uniform"
    schedule_eps: float = 1e-3  # the last timestep of the "linspace" schedule (Dream's eps)
    # ids that end the answer besides the model's EOS (vLLM's stop_token_ids): a committed stop id with every
    # position left of it committed ends the request; the checkpoint's eos_token_id lists, generation_config.json
    # and its chat template's end-of-turn token fill it (dllm_constrain.options.GenerationDefaults)
    stop_token_ids: tuple[int, ...] = ()
    # > 0: the quota policies draw which positions to commit instead of taking the best ones, with probabilities
    # softmax(score / order_temperature) (without replacement; Dream's alg_temp); 0: the highest scores
    order_temperature: float = 0.0
    # a template (vLLM's `diffusion_seed_canvas` / `diffusion_pinned`): the canvas's initial ids (exactly
    # max_new_tokens of them) and the positions held through every step. Pinned positions are committed before the
    # first step (under a constraint they are checked at admission: errors.PinnedTokenError names the first one no
    # valid output can have); the others start open, whatever the seed holds there
    seed_canvas: tuple[int, ...] | None = None
    pinned: tuple[int, ...] | None = None
    # the same as text with holes (`<hole>`, `<hole:N>`, `<hole:..N>`; dllm_constrain.templates), made into
    # seed_canvas / pinned by the front end (LLM.generate), which also sets max_new_tokens to the template's length;
    # hole_length: the tokens of a `<hole>` that does not say
    template: str | None = None
    hole_length: int = 8
    # slots to read (dllm_constrain.decisions): (start, end, token ids) canvas spans; at the forward whose commits
    # first touch a span, the log-probabilities (full softmax, temperature 1) of those ids at the span's positions
    # still open are kept (GenerationResult.slot_logprobs): what the model predicted for the slot when it decided it
    read_slots: tuple[tuple[int, int, tuple[int, ...]], ...] | None = None

    def validate(self) -> None:
        """Raise InvalidRequestError naming the first bad field (its one check, SAMPLING_CHECKS), then the
        template fields' agreement with the canvas."""
        validate_fields(self, SAMPLING_CHECKS)
        self._validate_template()

    def _validate_template(self) -> None:
        for slot in self.read_slots or ():
            ok = isinstance(slot, tuple) and len(slot) == 3 and all(isinstance(x, int) for x in slot[:2]) \
                and 0 <= slot[0] < slot[1] <= self.max_new_tokens and isinstance(slot[2], tuple) \
                and all(isinstance(t, int) and t >= 0 for t in slot[2])
            if not ok:
                raise InvalidRequestError(f"read_slots holds (start, end, token ids) spans inside the canvas of "
                                          f"{self.max_new_tokens} positions, got {slot!r}")
        if self.seed_canvas is None:
            if self.pinned:
                raise InvalidRequestError("pinned needs a seed_canvas to hold")
            return
        seed = self.seed_canvas
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in seed):
            raise InvalidRequestError("seed_canvas must be a sequence of token ids (integers >= 0)")
        if len(seed) != self.max_new_tokens:
            raise InvalidRequestError(f"seed_canvas must hold exactly max_new_tokens = {self.max_new_tokens} ids, "
                                      f"got {len(seed)}")
        pins = self.pinned or ()
        if not all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p < len(seed) for p in pins):
            raise InvalidRequestError(f"pinned positions must be integers in [0, {len(seed)})")
        if len(set(pins)) != len(pins):
            raise InvalidRequestError("pinned positions must be distinct")

    def pinned_tokens(self) -> dict[int, int]:
        """Pinned position -> its token id, in position order (empty without a template)."""
        if self.seed_canvas is None or not self.pinned:
            return {}
        return {p: self.seed_canvas[p] for p in sorted(self.pinned)}

    @property
    def num_blocks(self) -> int:
        return math.ceil(self.max_new_tokens / min(self.block_length, self.max_new_tokens))

    def block_bounds(self, block: int) -> tuple[int, int]:
        """[start, end) canvas positions of block `block`."""
        size = min(self.block_length, self.max_new_tokens)
        return block * size, min((block + 1) * size, self.max_new_tokens)

    def steps_per_block(self) -> list[int]:
        """The step budget split over blocks in proportion to their sizes (largest remainders first, then
        earlier blocks), at least 1 each; equal blocks get equal shares, as in LLaDA."""
        total = self.steps if self.steps is not None else self.max_new_tokens
        sizes = [end - start for start, end in map(self.block_bounds, range(self.num_blocks))]
        exact = [total * size / self.max_new_tokens for size in sizes]
        shares = [int(x) for x in exact]
        by_remainder = sorted(range(len(sizes)), key=lambda b: (-(exact[b] - shares[b]), b))
        for b in by_remainder[: total - sum(shares)]:
            shares[b] += 1
        return [max(1, s) for s in shares]


class PendingConstraint:
    """A constraint still being compiled on another thread. The engine admits its request at once and runs the
    request's first forward meanwhile: that forward reads the all-open canvas whatever the constraint is (the
    first step's masks are computed beside it or after it, see `LLMEngine`), so a compilation that ends before the
    forward costs the request no time at all; one that ends later holds that forward's output until it does.

    `compile()` runs on `executor` once `start()` is called: the engine starts it when it has started a forward, so
    the compilation's Python does not hold up the Python that prepares that forward (they share the GIL).
    `result()` starts it too, then waits for the Compiled (or raises the compilation's typed error)."""

    def __init__(self, executor: Executor, compile: Callable[[], Compiled]) -> None:
        self.future: Future = Future()
        self._executor: Executor | None = executor
        self._compile = compile
        self._lock = threading.Lock()

    def start(self, place: Callable[[], None] | None = None) -> None:
        """Start the compilation (once; later calls do nothing). `place`, when given, runs first on the compile
        thread: the engine that starts it beside its forward puts the thread on its helper cores
        (`LLMEngine.place_helper_thread`, engine.core_split)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.submit(self._run, place)

    def _run(self, place: Callable[[], None] | None = None) -> None:
        try:
            if place is not None:
                place()
            # beside the request loop: the compilation's Python hands the GIL back to the loop's torch calls within
            # a short switch interval, and pauses while a loop runs its step (engine.gil_share)
            with compiling_beside.hold(), pausing(loop_activity.pauser()):
                compiled = self._compile()
        except BaseException as err:  # noqa: BLE001 - the compilation's error is the request's answer
            self.future.set_exception(err)
        else:
            self.future.set_result(compiled)

    def done(self) -> bool:
        """Whether the compilation has ended (compiled or refused); False while it has not started."""
        return self.future.done()

    def result(self, timeout: float | None = None) -> Compiled:
        """The compiled constraint (started now if it was not), waiting up to `timeout` seconds (None: as long as it
        takes)."""
        self.start()
        return self.future.result(timeout)


@dataclass
class Request:
    """One generation request: prompt token ids, how to sample, and an optional constraint: a compiled one
    (`constraints.compiler.Compiled`; the engine makes its canvas state for `params.max_new_tokens`), one still
    compiling (`PendingConstraint`), or a canvas state made beforehand (its length must then be
    `params.max_new_tokens`)."""

    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    constraint: Compiled | CanvasConstraint | PendingConstraint | None = None

    @property
    def constraint_ready(self) -> bool:
        """False while the constraint is still compiling."""
        return not isinstance(self.constraint, PendingConstraint) or self.constraint.done()

    def constraint_state(self) -> CanvasConstraint | None:
        """The request's canvas constraint for its canvas (raises ConstraintTooLongError when nothing fits,
        InvalidRequestError for a state made for another length or an uncompiled OutputConstraint, the
        compilation's error for a refused one; waits for a constraint still compiling)."""
        c, n = self.constraint, self.params.max_new_tokens
        if isinstance(c, PendingConstraint):
            c = c.result()
        if c is None:
            if self.params.constraint is not None and not self.params.constraint.empty:
                raise InvalidRequestError("SamplingParams.constraint is compiled by the front end (LLM.generate); "
                                          "give the engine the compiled constraint as Request.constraint")
            return None
        if isinstance(c, Compiled):
            return new_request_state(c, n, self.params.constraint_timeout)
        made_for = c.canvas_len if isinstance(c, CanvasConstraint) else None  # the length the state was made for
        if isinstance(made_for, int) and made_for != n:
            raise InvalidRequestError(f"the constraint state was made for a canvas of {made_for} positions, the "
                                      f"request's max_new_tokens is {n}: pass the compiled constraint instead")
        return c


class RequestPhase(enum.Enum):
    """Where a request stands with its constraint (engine.structured_output moves it on):
    COMPILING: its constraint still compiles (`RequestState.pending`); it takes its first forward meanwhile.
    PARKED: that first forward is done and the constraint still compiles: its rows are kept (`parked_rows`) and it
        takes no forward until the compilation ends.
    MASKS_AFTER: this step's masks are computed after its forward (a first forward, on the serial path).
    READY: masks before the forward (serial) or beside it (mask workers).
    DONE: ended (finish_reason says how)."""

    COMPILING = "compiling"
    PARKED = "parked"
    MASKS_AFTER = "masks_after"
    READY = "ready"
    DONE = "done"


@dataclass
class RequestState:
    """The mutable state of one request inside the engine loop."""

    index: int  # position of the request in the caller's list
    prompt_ids: list[int]
    params: SamplingParams
    canvas: torch.Tensor  # int64 [max_new_tokens]; mask_id (or noise) where open
    committed: torch.Tensor  # bool [max_new_tokens]
    generator: torch.Generator | None
    # the seed of the request's sampling noise (SamplingParams.seed, else drawn at admission): the head pass hashes
    # each position's noise from it and the request's step (docs/engine.md, "Randomness")
    seed: int = 0
    constraint: CanvasConstraint | None = None
    block: int = 0  # active block index
    block_step: int = 0  # forwards spent on the active block
    schedule_step: int = 0  # the active block's position in its commit schedule (engine.policies.commit_count)
    step: int = 0  # loop iterations (forwards + forward-free forced-token steps)
    nfe: int = 0  # forward passes this request took part in
    forced_tokens: int = 0  # tokens committed because the constraint allowed only one
    forwards_saved: int = 0  # scheduled steps skipped because forced tokens completed a block
    remasks: int = 0  # proposed commits rejected by joint verification (left open)
    renoised: int = 0  # positions re-noised by the entropy-bound policy
    backtracks: int = 0  # steps undone because the canvas became uncompletable
    banned: set[tuple[int, int]] = field(default_factory=set)  # (position, token) pairs known to dead-end
    # allowed-token masks of the active block's open positions for the current canvas (positions, bitmask [n, W]);
    # computed before the forward (to find forced tokens) and reused after it
    allowed_cache: tuple[list[int], torch.Tensor] | None = None
    phase: RequestPhase = RequestPhase.READY
    # the request while its constraint is still compiling (`constraint` is then None; see PendingConstraint)
    pending: Request | None = None
    # PARKED: the first forward's hidden rows of the active block ([last open position + 1, hidden], rows at the
    # block's open positions), kept while the constraint still compiles
    parked_rows: torch.Tensor | None = None
    model_state: dict[str, Any] = field(default_factory=dict)  # family-specific (e.g. self-conditioning)
    # per read slot (SamplingParams.read_slots, by index): float32 [end - start, ids] log-probabilities, NaN rows at
    # the positions committed before that forward
    slot_reads: dict[int, torch.Tensor] = field(default_factory=dict)
    finish_reason: str | None = None  # "eos" | "length" | "error" | "aborted"
    error: Exception | None = None  # the typed error a failed request ended with
    start_time: float = field(default_factory=time.perf_counter)
    end_time: float | None = None

    @property
    def done(self) -> bool:
        return self.phase is RequestPhase.DONE

    @property
    def canvas_len(self) -> int:
        return int(self.canvas.shape[0])

    @property
    def budget(self) -> list[int]:
        return self.params.steps_per_block()

    def block_bounds(self) -> tuple[int, int]:
        return self.params.block_bounds(self.block)

    def open_in_block(self) -> list[int]:
        """Open canvas positions of the active block, left to right."""
        start, end = self.block_bounds()
        return [start + i for i in (~self.committed[start:end]).nonzero().flatten().tolist()]

    def steps_left_in_block(self) -> int:
        """Remaining step budget of the active block, never below 1 (a remask can outlast the budget)."""
        return max(1, self.budget[self.block] - self.block_step)

    def canvas_view(self, mask_id: int) -> list[int]:
        """The canvas as constraints see it: committed ids, mask_id at every open position."""
        return torch.where(self.committed, self.canvas, torch.full_like(self.canvas, mask_id)).tolist()

    def stop_positions(self, eos_id: int) -> list[int]:
        """The committed positions holding EOS or one of the request's stop ids, in canvas order."""
        stop_ids = torch.tensor((eos_id, *self.params.stop_token_ids), dtype=self.canvas.dtype)
        return (torch.isin(self.canvas, stop_ids) & self.committed).nonzero().flatten().tolist()

    def commit(self, positions: list[int], tokens: list[int]) -> None:
        for pos, tok in zip(positions, tokens):
            self.canvas[pos] = tok
            self.committed[pos] = True

    def committed_prefix(self, eos_id: int) -> list[int]:
        """The committed ids left of the first open position, stopping before the first EOS: what may be shown."""
        open_at = (~self.committed).nonzero()
        end = int(open_at[0, 0]) if open_at.numel() else self.canvas_len
        prefix = self.canvas[:end].tolist()
        return prefix[:prefix.index(eos_id)] if eos_id in prefix else prefix

    def finish(self, reason: str) -> None:
        self.phase = RequestPhase.DONE
        self.parked_rows = None
        self.finish_reason = reason
        self.end_time = time.perf_counter()

    def fail(self, error: Exception) -> None:
        """End the request with its own error (the other requests of the loop go on)."""
        self.error = error
        self.finish("error")
