"""What the engine hands back: per-request results, per-step outputs of the continuous loop, streaming updates,
progress snapshots. Plain dataclasses, so a server layer can serialise or queue them as they are."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dllm_constrain.errors import DllmConstrainError


@dataclass
class GenerationResult:
    """What one request produced, with the counters every result carries."""

    text: str  # decoded answer, stopping at the first EOS
    token_ids: list[int]  # answer ids before the first EOS
    nfe: int  # model forward passes spent on this request
    tokens_per_forward: float  # answer tokens (incl. the first EOS) / nfe
    forced_tokens: int  # tokens committed because the constraint allowed exactly one
    remasks: int  # proposals rejected by joint verification and left open
    wall_time: float  # seconds from the start of generate() (or add_request) to this request's end
    # "eos": the answer ended with EOS; "length": the canvas filled up without one; "error": the request failed
    # (see `error`); "aborted": removed by LLMEngine.abort
    finish_reason: str
    canvas_ids: list[int] = field(default_factory=list)  # the whole final canvas (EOS-padded tail)
    steps: int = 0  # loop iterations, forward-free forced steps included
    forwards_saved: int = 0  # scheduled steps skipped because forced tokens completed blocks
    renoised: int = 0  # positions re-noised by the entropy-bound policy
    backtracks: int = 0  # steps undone because the canvas became uncompletable
    refreshes: int = 0  # forwards that were full (KV cache Refresh or no cache); nfe - refreshes reused the cache
    error: DllmConstrainError | None = None  # why the request failed (finish_reason "error"), else None
    # SamplingParams.read_slots' readings, one per slot (None: no forward committed in it; see RequestState)
    slot_logprobs: list | None = None


@dataclass
class RequestOutput:
    """A request that ended during `LLMEngine.step()`: finished, failed with its own typed error, or aborted."""

    request_id: int
    result: GenerationResult

    @property
    def error(self) -> DllmConstrainError | None:
        return self.result.error

    @property
    def finished_ok(self) -> bool:
        return self.result.finish_reason in ("eos", "length")


@dataclass
class StreamUpdate:
    """One request's committed left prefix after a step (the answer ids a client may show: every position left of
    them is committed, and they stop at the first EOS); `new_token_ids` is what grew since the last update."""

    request_id: int
    token_ids: list[int]
    new_token_ids: list[int]
    finished: bool


StreamHook = Callable[[list[StreamUpdate]], None]


@dataclass
class CanvasSnapshot:
    """One request's canvas at a step, for progress displays (open positions hold mask_id)."""

    index: int
    canvas: list[int]
    committed: list[bool]
    done: bool
    # False while the request's constraint is still compiling (its answer may still be a compilation error)
    constraint_ready: bool = True


@dataclass
class StepEvent:
    """Passed to the progress callback after every step."""

    step: int
    snapshots: list[CanvasSnapshot]
    mask_id: int


ProgressCallback = Callable[[StepEvent], None]
