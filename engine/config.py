"""Engine-level settings (`EngineConfig`): properties of a batch run, not of one request.

    EngineConfig()                                  # DualCache KV reuse refreshed once per block, dense reuse,
                                                    # logits budget from free memory, the "phase" scheduler
    EngineConfig(kv_cache="none")                   # every step recomputes the whole sequence (reference behaviour)
    EngineConfig(refresh="steps", refresh_steps=4)  # also refresh every 4 forwards inside a block
    EngineConfig(refresh="adaptive", refresh_threshold=0.25)  # refresh once 25% of the block was committed since
    EngineConfig(keep_ratio=0.5)                    # Reuse steps attend to the 50% most salient cached keys per head
    EngineConfig(logits_budget_bytes=64 << 20)      # at most 64 MiB of transient logits workspace
    EngineConfig(scheduler="fcfs")                  # every running request takes every step (no step budget)
    EngineConfig(step_tokens=4096, kv_budget_bytes=40 << 30)  # phase costs per step; KV memory of running requests
    EngineConfig(kv_cache_memory=4 << 30)           # at most 4 GiB of KV cache (CLI / server: --kv-cache-memory 4GiB)

Each field carries its one check (dllm_constrain.option_checks), so `validate()`, the API's keywords, the CLI and
the server refuse a bad value in the same words. What each setting does (KV reuse: Refresh and Reuse phases;
head-centric sparse reuse; budgeted logits; mask workers beside the forward, the GIL-free forward and the core
split; scheduling): docs/serving.md, "Engine settings".
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from dllm_constrain.engine.scheduler import SCHEDULER_POLICIES
from dllm_constrain.option_checks import (
    Check,
    bool_check,
    check_metadata,
    checks_of,
    choice_check,
    int_check,
    real_check,
    validate_fields,
)

KV_CACHE_MODES = ("dual", "none")
REFRESH_MODES = ("block", "steps", "adaptive")
BACKENDS = ("auto", "triton", "torch")
DEFAULT_STEP_TOKENS = 8192  # the "phase" step budget's floor (vLLM's max_num_batched_tokens default)


def _check(check: Check, default: Any) -> Any:
    """A field with its one check (dllm_constrain.option_checks): EngineConfig.validate, the API's keywords, the
    CLI and the server all report a bad value in its words."""
    return field(default=default, metadata=check_metadata(check))


@dataclass(frozen=True)
class EngineConfig:
    # "dual": Refresh/Reuse KV cache (models without a cached forward fall back); "none"
    kv_cache: str = _check(choice_check(KV_CACHE_MODES), "dual")
    refresh: str = _check(choice_check(REFRESH_MODES), "block")  # "block" | "steps" | "adaptive" (module docstring)
    refresh_steps: int = _check(int_check(1), 4)  # refresh="steps": refresh after this many forwards
    # refresh="adaptive": share of the block committed since the last refresh
    refresh_threshold: float = _check(real_check(0.0, 1.0, lo_open=True), 0.5)
    keep_ratio: float = _check(real_check(0.0, 1.0, lo_open=True), 1.0)  # < 1: head-centric sparse Reuse steps
    logits_budget_bytes: int | None = _check(int_check(1, optional=True), None)  # None: from free device memory
    max_logit_rows: int | None = _check(int_check(1, optional=True), None)  # optional cap on rows per logits chunk
    # False: one unchunked projection + reduction per request (tests, benchmarks)
    budgeted_logits: bool = _check(bool_check(), True)
    # kernels' backend: "auto" (Triton on CUDA, torch elsewhere) | "triton" | "torch"
    backend: str = _check(choice_check(BACKENDS), "auto")
    # threads computing constraint masks beside the forward; 0: serially before it; None: 1 when the model runs on
    # CUDA (the host is idle during the forward), 0 on the CPU (see the module docstring)
    mask_workers: int | None = _check(int_check(0, optional=True), None)
    # run packed forwards as the model's TorchScript twin on torch's inter-op pool, so the loop thread waits without
    # the GIL and the mask workers' Python runs beside the forward (engine.models.scripted_forward; LLaDA and Dream
    # with a dense cache); None: on when the loop has mask workers and the model runs on the CPU; True: whenever
    # the model has it (on CUDA too, where it is not measured); False: never
    gil_free_forward: bool | None = _check(bool_check(optional=True), None)
    # with the GIL-free forward on the CPU, keep the Python threads beside it (mask workers, compile thread) on a core
    # of their own and the forward's threads off it (engine.core_split); None: when a core is left over beside
    # torch's intra-op threads; True: whenever the process has two cores; False: never touch thread affinity
    core_split: bool | None = _check(bool_check(optional=True), None)
    # the request loop's scheduling policy, its per-step token budget ("phase"; None: max(8192, the model's
    # context)), and the KV memory budget of the running requests in bytes (None: none); see the module docstring
    scheduler: str = _check(choice_check(SCHEDULER_POLICIES), "phase")
    step_tokens: int | None = _check(int_check(1, optional=True), None)
    kv_budget_bytes: int | None = _check(int_check(1, optional=True), None)
    # bytes of KV cache the engine may hold (vLLM's kv_cache_memory_bytes); the KV pool is preallocated at this size
    # and admission keeps the running requests within it. None: on CUDA a share of the free memory after the
    # weights (engine.kv_pool), on the CPU no bound (the pool grows as requests are admitted)
    kv_cache_memory: int | None = _check(int_check(1, optional=True), None)

    def __post_init__(self) -> None:
        if self.kv_budget_bytes is None and self.kv_cache_memory is not None:
            object.__setattr__(self, "kv_budget_bytes", self.kv_cache_memory)  # frozen: set once, at construction

    def validate(self) -> "EngineConfig":
        """Raise InvalidRequestError naming the first bad field (its check's words); returns self."""
        validate_fields(self, {"kv_cache_memory": ENGINE_CHECKS["kv_cache_memory"], **ENGINE_CHECKS})
        return self

    def with_overrides(self, **overrides: Any) -> "EngineConfig":
        """A copy with the given fields replaced; None values leave a field as it is."""
        changes = {k: v for k, v in overrides.items() if v is not None}
        return replace(self, **changes).validate() if changes else self


ENGINE_CHECKS = checks_of(EngineConfig)  # field name -> its check
