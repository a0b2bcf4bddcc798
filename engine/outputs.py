"""What the engine hands back: per-request results, per-step outputs of the continuous loop, streaming updates,
progress snapshots. Plain dataclasses, so a server layer can serialise or queue them as they are."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dllm_constrain.errors import DllmConstrainError

if TYPE_CHECKING:
    from dllm_constrain.engine.models.base import SpecialTokens
    from dllm_constrain.engine.state import RequestState


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


def request_result(s: RequestState, special: SpecialTokens, decode: Callable[[list[int]], str],
                   refreshes: int) -> GenerationResult:
    """The result of an ended request. A failed or aborted request's answer is its committed left prefix and its
    canvas shows open positions as mask_id."""
    eos = special.eos_id
    if s.finish_reason in ("eos", "length"):
        canvas = s.canvas.tolist()
        end = canvas.index(eos) if eos in canvas else len(canvas)
        answer = canvas[:end]
    else:
        canvas = s.canvas_view(special.mask_id)
        answer = s.committed_prefix(eos)
        end = len(answer)
    produced = end + (1 if end < len(canvas) else 0)
    wall = (s.end_time or time.perf_counter()) - s.start_time
    return GenerationResult(
        text=decode(answer), token_ids=answer, nfe=s.nfe,
        tokens_per_forward=produced / s.nfe if s.nfe else float(produced),
        forced_tokens=s.forced_tokens, remasks=s.remasks, wall_time=wall, finish_reason=s.finish_reason or "length",
        canvas_ids=canvas, steps=s.step, forwards_saved=s.forwards_saved, renoised=s.renoised,
        backtracks=s.backtracks, refreshes=refreshes, error=s.error,
        slot_logprobs=[s.slot_reads.get(k) for k in range(len(s.params.read_slots))]
        if s.params.read_slots else None,
    )


def stream_updates(states: Iterable[RequestState], streamed: dict[int, int], outputs: list[RequestOutput],
                   eos_id: int) -> list[StreamUpdate]:
    """Committed left prefixes that grew at this step (waiting and running requests, `states`) or ended
    (`outputs`); `streamed` (request id -> prefix length already streamed) is brought up to date."""
    updates = []
    for s in states:
        prefix = s.committed_prefix(eos_id)
        seen = streamed.get(s.index, 0)
        if len(prefix) > seen:
            streamed[s.index] = len(prefix)
            updates.append(StreamUpdate(s.index, prefix, prefix[seen:], False))
    for out in outputs:
        ids = out.result.token_ids
        seen = min(streamed.get(out.request_id, 0), len(ids))
        updates.append(StreamUpdate(out.request_id, ids, ids[seen:], True))
    return updates
