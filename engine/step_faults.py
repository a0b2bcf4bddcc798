"""A model fault in a step ends only the requests it belongs to (the rest of the step goes on).

  `forward_rows`  the step's forward; one that raises is run again on each half of its requests (an out-of-memory
                  shrinks the scheduler's step budget first), down to the request that still fails alone;
  `head_stats`    the same for the head pass (an out-of-memory halves the logits budget first).
A request that still fails alone ends with StepFailedError. Each row of a packed forward computes what it computes
alone, and the head pass reduces rows independently, so the other requests' answers do not change. Only a fault
of the model (an Exception out of the forward or the head) is isolated; the engine's own faults still end the loop.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dllm_constrain.engine.logits import HeadJob, LogitsPath, head_pass
from dllm_constrain.engine.model_runner import ModelRunner, Row
from dllm_constrain.engine.scheduler import Scheduler
from dllm_constrain.engine.state import RequestState
from dllm_constrain.errors import StepFailedError
from dllm_constrain.kernels.masked_row_stats import RowStats

Started = Callable[[], list[Row]] | Exception


def is_out_of_memory(err: BaseException) -> bool:
    """An allocation failure of the device or the host (torch's OutOfMemoryError, MemoryError, or a RuntimeError
    saying "out of memory")."""
    return isinstance(err, (torch.cuda.OutOfMemoryError, MemoryError)) or (
        isinstance(err, RuntimeError) and "out of memory" in str(err).lower())


def start_rows(runner: ModelRunner, live: Sequence[RequestState]) -> Started:
    """`ModelRunner.start_rows`, or the exception it raised (`forward_rows` retries without the culprit)."""
    try:
        return runner.start_rows(live)
    except Exception as err:  # noqa: BLE001 - a fault of the model: `forward_rows` isolates it
        return err


def forward_rows(runner: ModelRunner, scheduler: Scheduler, live: list[RequestState], started: Started
                 ) -> list[Row]:
    """The forward's rows (`started`: what `start_rows` gave for `live`), the requests a fault follows ended."""
    try:
        if isinstance(started, Exception):
            raise started
        return started()
    except Exception as err:  # noqa: BLE001 - see the module docstring
        if is_out_of_memory(err):
            scheduler.shrink_step_budget()
        if len(live) == 1:
            live[0].fail(StepFailedError(f"request {live[0].index}: its forward failed: {err!r}"))
            runner.release(live[0].index)
            return []
        mid = len(live) // 2
        return [row for part in (live[:mid], live[mid:])
                for row in forward_rows(runner, scheduler, part, start_rows(runner, part))]


def head_stats(logits_path: LogitsPath, jobs: list[HeadJob], device: torch.device) -> list[RowStats | None]:
    """`head_pass` over `jobs` (each job's host statistics), None for the jobs of requests a fault ended."""
    try:
        return list(head_pass(logits_path, jobs))
    except Exception as err:  # noqa: BLE001 - see the module docstring
        if is_out_of_memory(err):
            logits_path.halve_budget(device)
        if len(jobs) == 1:
            jobs[0].state.fail(StepFailedError(f"request {jobs[0].state.index}: its head pass failed: {err!r}"))
            return [None]
        mid = len(jobs) // 2
        return head_stats(logits_path, jobs[:mid], device) + head_stats(logits_path, jobs[mid:], device)
