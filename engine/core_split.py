"""Which CPU cores the GIL-free forward runs on, and which the Python threads beside it run on.

Why: on the CPU the GIL-free forward (engine.models.scripted_forward) runs on a torch inter-op thread while the mask
workers and the compile thread run Python beside it. The loop thread wakes those helpers just after it starts the
forward, while it still runs itself, so the scheduler has no idle core for them and queues one behind the forward's
thread; at its next tick the kernel hands that core to the helper while the other core has gone idle (its load
balancer leaves a cache-hot task where it is). A lower priority for the helpers cuts the forward's wait only by a
third; keeping them off the forward's cores removes it (the scheduler trace and figures: docs/constraints.md,
"What a schema costs per forward").

So when the forward runs on torch's inter-op pool on the CPU and the process may use more cores than torch's
intra-op threads need, `plan_core_split` keeps the last usable core for the helper threads (the mask workers, the
compile thread) and the others for the forward's threads (torch's pool threads, named "PTThreadPool" by torch; an
OpenMP team started from a pinned thread inherits its cores). The GIL lets one Python thread run at a time, so one
core is what the helpers can use anyway. The loop thread itself is not pinned: between forwards it runs the logits
and the step's Python, and no forward runs then.

Thread affinity belongs to each thread and torch's pool threads belong to the process, so a split outlives the
engine that made it (the next engine re-applies its own); `EngineConfig.core_split=False` never touches affinity.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

__all__ = ["CoreSplit", "FORWARD_THREAD_NAME", "pin_current_thread", "plan_core_split"]

FORWARD_THREAD_NAME = "PTThreadPool"  # the name torch gives the threads of its inter-op (and native intra-op) pools


def pin_current_thread(cores: frozenset[int]) -> None:
    """Keep the calling thread on `cores`. Where the OS refuses (the process's cores changed since they were read)
    the thread stays where it was: placement is a matter of speed, never of results."""
    try:
        os.sched_setaffinity(0, cores)
    except OSError:
        pass


@dataclass(frozen=True)
class CoreSplit:
    """Disjoint core sets: `forward` for the forward's threads, `helpers` for the Python threads beside it."""

    forward: frozenset[int]
    helpers: frozenset[int]

    def __post_init__(self) -> None:
        if not self.forward or not self.helpers or self.forward & self.helpers:
            raise ValueError(f"a core split needs two disjoint non-empty sets, got {sorted(self.forward)} and "
                             f"{sorted(self.helpers)}")

    def pin_current_helper(self) -> None:
        """Keep the calling thread (a mask worker, a compile thread) on the helper cores (`pin_current_thread`)."""
        pin_current_thread(self.helpers)

    def pin_forward_threads(self) -> int:
        """Keep torch's pool threads that exist now on the forward cores; returns how many were pinned. Threads of
        this process named otherwise, and threads that end meanwhile, are left alone."""
        pinned = 0
        mine = threading.get_native_id()
        for name in _task_ids():
            tid = int(name)
            if tid == mine or _task_name(tid) != FORWARD_THREAD_NAME:
                continue
            try:
                os.sched_setaffinity(tid, self.forward)
            except OSError:  # the thread ended since it was listed
                continue
            pinned += 1
        return pinned


def plan_core_split(usable: frozenset[int], torch_threads: int, mode: bool | None) -> CoreSplit | None:
    """The split for a GIL-free CPU forward, or None for none.

    usable: the process's cores (`engine.placement.usable_cpus()`); torch_threads: torch's intra-op threads
    (`torch.get_num_threads()`);
    mode: None splits when a core is left over beside the intra-op threads (the forward would not use it anyway),
    True whenever there are two cores (the forward then gets one core less than torch may want), False never.
    The helpers get the highest-numbered core, the forward the others."""
    if mode is False or len(usable) < 2:
        return None
    if mode is None and torch_threads > len(usable) - 1:
        return None
    helper = max(usable)
    return CoreSplit(forward=frozenset(usable - {helper}), helpers=frozenset({helper}))


def _task_ids() -> list[str]:
    try:
        return os.listdir("/proc/self/task")
    except OSError:  # not Linux: no per-thread listing, nothing to pin
        return []


def _task_name(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""
