"""Allowed-token masks computed beside the forward: a small thread pool owned by one request loop.

Why: a step's masks depend only on the canvas before its forward, which does not read them; on worker threads they
run while the forward runs (torch ops and the constraint's native trie walk release the GIL). Safety:
  - a request's constraint is used by one thread at a time: the loop thread does not touch the constraints it
    handed out until it has joined every job of the step (`MaskBatch.join`, before any commit decision);
  - states of one compiled constraint share its lazily grown automata, so the requests of one compiled constraint
    (`shared_key`: `CanvasConstraint.shared_state`) go to one job, one after the other in the loop's order: the
    memos fill in the same order as on the serial path, and two threads never grow the same automaton;
  - a job's failure is its request's: returned in its `MaskResult` and re-raised on the loop thread, where a typed
    DllmConstrainError ends that request only and anything else the step;
  - per-call deadlines (`constraints.deadline`) are per thread, so a call on a worker is bounded as on the loop's.
Timing: jobs and the forward record their start and end; `MaskTiming` sums mask time and the part of it that ran
while the forward was running (benchmarks/bench_overlap.py). docs/engine.md, "Masks beside the forward".
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
import torch

from dllm_constrain.constraints.protocol import CanvasConstraint
from dllm_constrain.engine.state import RequestState

__all__ = ["ForwardWindow", "MaskBatch", "MaskItem", "MaskResult", "MaskTiming", "MaskWorkers", "shared_key"]


@dataclass
class MaskTiming:
    """Measured cost of a loop's masks: wall seconds spent computing them, the part of it that ran while a
    forward was running, and the forwards' own wall time (for per-forward figures)."""

    mask_calls: int = 0  # mask computations (one per request and step, plus rare recomputations and probes)
    mask_seconds: float = 0.0
    overlapped_seconds: float = 0.0  # mask seconds inside a forward's [start, end)
    probe_calls: int = 0  # of mask_calls: the frontier probes before the forward (prefix hints or one-position masks)
    probe_seconds: float = 0.0  # of mask_seconds
    forwards: int = 0
    forward_seconds: float = 0.0
    refresh_forwards: int = 0  # of forwards: those in which a request refreshed (or ran whole without a cache)
    refresh_seconds: float = 0.0  # of forward_seconds

    @property
    def overlap_fraction(self) -> float:
        """(mask time that ran while the forward was running) / (total mask time); 0 without mask work."""
        return self.overlapped_seconds / self.mask_seconds if self.mask_seconds > 0 else 0.0

    def add_mask(self, start: float, end: float, forward: tuple[float, float] | None = None,
                 probe: bool = False) -> None:
        self.mask_calls += 1
        self.mask_seconds += end - start
        if probe:
            self.probe_calls += 1
            self.probe_seconds += end - start
        if forward is not None:
            self.overlapped_seconds += max(0.0, min(end, forward[1]) - max(start, forward[0]))

    def add_forward(self, start: float, end: float, refresh: bool = False) -> None:
        self.forwards += 1
        self.forward_seconds += end - start
        if refresh:
            self.refresh_forwards += 1
            self.refresh_seconds += end - start


class ForwardWindow:
    """Whether a step's forward is running, and a way for a mask job to wait for a constraint still compiling
    until it has compiled or the forward has ended, whichever comes first.

    Why not poll: a job that wakes every millisecond to look takes the GIL from the compiling thread each time, and
    on a two-core host each wake-up is a third runnable thread beside the forward and the compilation. Here the
    job sleeps on a condition that either event notifies, and wakes at once when the compilation ends."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open = False

    def open(self) -> None:
        """The forward starts."""
        with self._cond:
            self._open = True

    def close(self) -> None:
        """The forward has ended (or failed): every waiting job wakes."""
        with self._cond:
            self._open = False
            self._cond.notify_all()

    def wait_done(self, future: Future) -> bool:
        """Block while `future` is not done and the forward runs; True when `future` is done."""
        if future.done():
            return True
        future.add_done_callback(self._wake)
        with self._cond:
            self._cond.wait_for(lambda: future.done() or not self._open)
        return future.done()

    def _wake(self, _future: Future) -> None:
        with self._cond:
            self._cond.notify_all()


@dataclass
class MaskItem:
    """One request's mask job: its state and the canvas view and open positions taken on the loop thread
    before the forward (the job never reads the live canvas)."""

    state: RequestState
    view: list[int]
    positions: list[int]


@dataclass
class MaskResult:
    """The masks of `positions` for the canvas the job saw (bitmask [len(positions), W]), or the exception the
    computation raised; start/end are perf_counter timestamps of the computation."""

    positions: list[int]
    allowed: torch.Tensor | None
    error: BaseException | None
    start: float
    end: float

    @property
    def compiling(self) -> bool:
        """The job gave up waiting for the request's constraint, still compiling when the forward ended: no masks
        and no error (they are computed once it has compiled)."""
        return self.allowed is None and self.error is None


def shared_key(constraint: CanvasConstraint | None) -> int:
    """Requests whose constraints share mutable compiled structures get the same key (`shared_state`: a regular
    constraint's compiled set algebra, a grammar's compiled grammar, a caller's own constraint itself); requests
    whose constraint still compiles (None) share one."""
    return id(constraint.shared_state() if constraint is not None else None)


Compute = Callable[[RequestState, list[int], list[int]], torch.Tensor]


def _run_group(compute: Compute, items: Sequence[MaskItem]) -> list[MaskResult]:
    """The job of one group, on a worker thread: its requests one after the other, each failure kept."""
    out = []
    with torch.inference_mode():  # thread-local: the loop thread's inference mode does not reach workers
        for item in items:
            start = time.perf_counter()
            try:
                allowed, error = compute(item.state, item.view, item.positions), None
            except Exception as exc:  # noqa: BLE001 - re-raised on the loop thread, for its request
                allowed, error = None, exc
            out.append(MaskResult(item.positions, allowed, error, start, time.perf_counter()))
    return out


@dataclass
class MaskBatch:
    """The jobs of one step. `join` waits for all of them (also when the forward failed, so no worker still uses
    a constraint once the loop thread goes on) and returns request index -> MaskResult."""

    futures: list[tuple[list[MaskItem], Future]] = field(default_factory=list)

    def join(self, timing: MaskTiming | None = None, forward: tuple[float, float] | None = None
             ) -> dict[int, MaskResult]:
        results: dict[int, MaskResult] = {}
        failure: BaseException | None = None
        for items, fut in self.futures:
            try:
                group = fut.result()
            except BaseException as exc:  # noqa: BLE001 - the job itself broke (not a request's error)
                failure = failure or exc
                continue
            for item, res in zip(items, group):
                results[item.state.index] = res
                if timing is not None:
                    timing.add_mask(res.start, res.end, forward)
        if failure is not None:
            raise failure
        return results

    def wait(self) -> None:
        """Wait for every job to end, whatever it returned (the loop thread is leaving with its own failure)."""
        wait([fut for _, fut in self.futures])


class MaskWorkers:
    """A thread pool of `workers` threads computing masks with `compute(state, view, positions)` (the engine's
    `_allowed`). Made per request loop; `close` ends its threads."""

    def __init__(self, workers: int, compute: Compute, initializer: Callable[[], None] | None = None) -> None:
        """initializer: run once on each worker thread as it starts (e.g. `CoreSplit.pin_current_helper`)."""
        self.workers = workers
        self.compute = compute
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dllm-masks", initializer=initializer)

    def submit(self, items: Sequence[MaskItem]) -> MaskBatch:
        """One job per group of requests sharing compiled structures (`shared_key`), in order of first
        appearance; within a job the loop's order is kept."""
        groups: dict[int, list[MaskItem]] = {}
        for item in items:
            groups.setdefault(shared_key(item.state.constraint), []).append(item)
        batch = MaskBatch()
        for group in groups.values():
            batch.futures.append((group, self._pool.submit(_run_group, self.compute, group)))
        return batch

    def close(self) -> None:
        """Wait for running jobs and end the threads (a closed pool takes no more jobs)."""
        self._pool.shutdown(wait=True)
