"""Engine-level settings: KV reuse (Refresh/Reuse phases), head-centric sparse reuse, the budgeted logits path.

These are properties of a batch run, not of one request, so they live here and not on `SamplingParams`:

    EngineConfig()                                  # the defaults: DualCache KV reuse refreshed once per block,
                                                    # dense reuse, logits budget from free memory
    EngineConfig(kv_cache="none")                   # every step recomputes the whole sequence (reference behaviour)
    EngineConfig(refresh="steps", refresh_steps=4)  # also refresh every 4 forwards inside a block
    EngineConfig(refresh="adaptive", refresh_threshold=0.25)  # refresh once 25% of the block was committed since
    EngineConfig(keep_ratio=0.5)                    # Reuse steps attend to the 50% most salient cached keys per head
    EngineConfig(logits_budget_bytes=64 << 20)      # at most 64 MiB of transient logits workspace
    EngineConfig(scheduler="fcfs")                  # every running request takes every step (no step budget)
    EngineConfig(step_tokens=4096, kv_budget_bytes=40 << 30)  # phase costs per step; KV memory of running requests
    EngineConfig(kv_cache_memory=4 << 30)           # at most 4 GiB of KV cache (CLI / server: --kv-cache-memory 4GiB)

Scheduling (engine.scheduler): `scheduler` picks the policy of the request loop: "phase" (the default,
dLLM-Serve's: each request's next forward costs its phase, a Refresh its prompt + canvas, a Reuse its block, and
one step holds at most `step_tokens` of them; requests that do not fit are deferred a step, so a burst's Refreshes
are staggered), "fcfs" (FCFS slots: every running request takes every step) or "static" (static batches). The
default step budget is max(8192, the model's context), so any request fits it alone. `kv_budget_bytes` bounds the
KV memory of the running requests, 2 * layers * kv_heads * head_dim * dtype bytes * (prompt + canvas) each, at
admission (None: only the scheduler's token and slot limits).

KV reuse (Fast-dLLM's DualCache, dLLM-Serve's Refresh/Reuse):
  Refresh: one full forward over prompt + canvas; every layer's keys/values of every position are cached, and the
           step's commits come from that forward.
  Reuse:   the forward runs only the active block's tokens (for shifted-prediction families such as Dream, also
           the position just left of the block, whose state predicts the block's first token); their queries attend
           to the cached keys/values of every other position plus the block's own fresh keys/values.
  A request refreshes when its active block changes (always: the cache must hold the finished block's final
  tokens), and additionally
    refresh="block"     never otherwise (one refresh per block; the default);
    refresh="steps"     after `refresh_steps` forwards since its last refresh;
    refresh="adaptive"  once the tokens committed in the block since the last refresh reach `refresh_threshold`
                        of the block's length.
  keep_ratio < 1 turns on head-centric sparse reuse: at each refresh every KV head keeps its own
  ceil(keep_ratio * n) most salient cached keys (scored against the block's queries,
  `kernels.packed_kv_attention.select_salient_keys`), packed densely per head; Reuse steps attend to those plus
  the block's fresh keys (`packed_kv_attention`: Triton on CUDA, torch elsewhere).

Budgeted logits: only the open positions of each request's active block are projected, in row chunks whose
transient workspace fits `logits_budget_bytes` (None: derived from the device's free memory, see
`engine.logits.default_logits_budget`); the grammar masks are applied inside each chunk and the chunk is reduced at
once to token / probability / entropy / margin (`kernels.masked_row_stats`), then freed.

Masks beside the forward (`mask_workers`, engine.mask_workers): the constraint masks of a step depend only on the
canvas before its forward, so with mask_workers >= 1 they are computed on that many worker threads while the forward
runs, and the forced tokens they show are committed after it (see engine.llm_engine, "Forced tokens"); mask_workers=0
computes them serially before the forward; None (the default) picks 1 on CUDA and 0 on the CPU. A step issues its
forward first and then hands the masks out. On the CPU, workers run the forward as LLaDA's or Dream's TorchScript twin
on torch's inter-op pool (`gil_free_forward`; with a dense cache and two usable cores), which does not hold the GIL;
an eager CPU forward (the sparse cache, one core, `gil_free_forward=False`) is done before the masks start, since its
many small ops each take the GIL and beside the masks' Python they measured slower than serial. With the twin and a
second core a request costs 1-6% less (docs/constraints.md), but it stays opt-in: the masks are the same on both
paths (bounded by work, not by the clock), but a worker step commits forced tokens after the forward instead of before
it, so with forced_tokens (the default) its tokens may differ from the serial path's (docs/constraints.md,
"Reproducibility"). More than one worker helps only when the batch holds requests of different compiled constraints
(requests of one compiled constraint share a worker). With the GIL-free forward the mask workers and the compile
thread run on a core of their own, and the forward's threads on the others (`core_split`, engine.core_split): woken
on the forward's core, a helper took it from the forward for up to a scheduler tick while the other core was idle.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dllm_constrain.engine.scheduler import SCHEDULER_POLICIES
from dllm_constrain.errors import InvalidRequestError

KV_CACHE_MODES = ("dual", "none")
REFRESH_MODES = ("block", "steps", "adaptive")
BACKENDS = ("auto", "triton", "torch")
DEFAULT_STEP_TOKENS = 8192  # the "phase" step budget's floor (vLLM's max_num_batched_tokens default)


@dataclass(frozen=True)
class EngineConfig:
    kv_cache: str = "dual"  # "dual": Refresh/Reuse KV cache (models without a cached forward fall back); "none"
    refresh: str = "block"  # "block" | "steps" | "adaptive" (see the module docstring)
    refresh_steps: int = 4  # refresh="steps": refresh after this many forwards
    refresh_threshold: float = 0.5  # refresh="adaptive": share of the block committed since the last refresh
    keep_ratio: float = 1.0  # < 1: head-centric sparse Reuse steps
    logits_budget_bytes: int | None = None  # None: derived from free device memory
    max_logit_rows: int | None = None  # optional hard cap on rows per logits chunk
    budgeted_logits: bool = True  # False: one unchunked projection + reduction per request (tests, benchmarks)
    backend: str = "auto"  # kernels' backend: "auto" (Triton on CUDA, torch elsewhere) | "triton" | "torch"
    # threads computing constraint masks beside the forward; 0: serially before it; None: 1 when the model runs on
    # CUDA (the host is idle during the forward), 0 on the CPU (see the module docstring)
    mask_workers: int | None = None
    # run packed forwards as the model's TorchScript twin on torch's inter-op pool, so the loop thread waits without
    # the GIL and the mask workers' Python runs beside the forward (engine.models.scripted_forward; LLaDA and Dream
    # with a dense cache); None: on when the loop has mask workers and the model runs on the CPU; True: whenever
    # the model has it (on CUDA too, where it is not measured); False: never
    gil_free_forward: bool | None = None
    # with the GIL-free forward on the CPU, keep the Python threads beside it (mask workers, compile thread) on a core
    # of their own and the forward's threads off it (engine.core_split); None: when a core is left over beside
    # torch's intra-op threads; True: whenever the process has two cores; False: never touch thread affinity
    core_split: bool | None = None
    # the request loop's scheduling policy, its per-step token budget ("phase"; None: max(8192, the model's
    # context)), and the KV memory budget of the running requests in bytes (None: none); see the module docstring
    scheduler: str = "phase"
    step_tokens: int | None = None
    kv_budget_bytes: int | None = None
    # bytes of KV cache the engine may hold (vLLM's kv_cache_memory_bytes; None: no bound); the running requests'
    # KV memory is bounded by it at admission (kv_budget_bytes, when not given, takes this value)
    kv_cache_memory: int | None = None

    def __post_init__(self) -> None:
        if self.kv_budget_bytes is None and self.kv_cache_memory is not None:
            object.__setattr__(self, "kv_budget_bytes", self.kv_cache_memory)  # frozen: set once, at construction

    def validate(self) -> "EngineConfig":
        """Raise InvalidRequestError naming the first bad field; returns self."""
        if self.kv_cache not in KV_CACHE_MODES:
            raise InvalidRequestError(f"kv_cache must be one of {KV_CACHE_MODES}, got {self.kv_cache!r}")
        if self.refresh not in REFRESH_MODES:
            raise InvalidRequestError(f"refresh must be one of {REFRESH_MODES}, got {self.refresh!r}")
        if not isinstance(self.refresh_steps, int) or isinstance(self.refresh_steps, bool) or self.refresh_steps < 1:
            raise InvalidRequestError(f"refresh_steps must be an integer >= 1, got {self.refresh_steps!r}")
        if not isinstance(self.refresh_threshold, (int, float)) or not 0.0 < self.refresh_threshold <= 1.0:
            raise InvalidRequestError(f"refresh_threshold must be in (0, 1], got {self.refresh_threshold!r}")
        if not isinstance(self.keep_ratio, (int, float)) or not 0.0 < self.keep_ratio <= 1.0:
            raise InvalidRequestError(f"keep_ratio must be in (0, 1], got {self.keep_ratio!r}")
        if self.logits_budget_bytes is not None and (
                not isinstance(self.logits_budget_bytes, int) or self.logits_budget_bytes < 1):
            raise InvalidRequestError(f"logits_budget_bytes must be a positive integer (or None), "
                                      f"got {self.logits_budget_bytes!r}")
        if self.max_logit_rows is not None and (not isinstance(self.max_logit_rows, int) or self.max_logit_rows < 1):
            raise InvalidRequestError(f"max_logit_rows must be an integer >= 1 (or None), got {self.max_logit_rows!r}")
        if self.mask_workers is not None and (not isinstance(self.mask_workers, int) or isinstance(
                self.mask_workers, bool) or self.mask_workers < 0):
            raise InvalidRequestError(f"mask_workers must be an integer >= 0 (or None), got {self.mask_workers!r}")
        if self.gil_free_forward is not None and not isinstance(self.gil_free_forward, bool):
            raise InvalidRequestError(f"gil_free_forward must be True, False or None, got {self.gil_free_forward!r}")
        if self.core_split is not None and not isinstance(self.core_split, bool):
            raise InvalidRequestError(f"core_split must be True, False or None, got {self.core_split!r}")
        if self.scheduler not in SCHEDULER_POLICIES:
            raise InvalidRequestError(f"scheduler must be one of {SCHEDULER_POLICIES}, got {self.scheduler!r}")
        for name in ("kv_cache_memory", "step_tokens", "kv_budget_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise InvalidRequestError(f"{name} must be a positive integer (or None), got {value!r}")
        if self.backend not in BACKENDS:
            raise InvalidRequestError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        return self

    def with_overrides(self, **overrides: Any) -> "EngineConfig":
        """A copy with the given fields replaced; None values leave a field as it is."""
        changes = {k: v for k, v in overrides.items() if v is not None}
        return replace(self, **changes).validate() if changes else self
