"""Deadlines checked cooperatively inside every potentially long loop (so no constraint work hangs).

`Deadline` bounds compilation: by work (CompilationWorkLimitError, the same on any machine) and, as the last resort,
by time (CompilationTimeoutError). `CallDeadline` bounds one constraint call at
request time (allowed_tokens, select_commits, is_completable, min_tokens, ...): the call activates it for its
thread (`activate`), and the shared automata (deriv.py expansions, token-trie walks, the canvas set algebra)
check the active one with `check_active()`. It raises ConstraintTimeoutError *between* atomic updates of the
shared structures (a DFA row, a state, a token-transition table are each published only once complete), never
by a signal, so an interrupted call leaves the compiled constraint whole for every other request.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..errors import CompilationTimeoutError, CompilationWorkLimitError, ConstraintTimeoutError


class Deadline:
    """The bounds of a compilation: `work`, the checks it may pass (each check sits at a fixed point of the compiler's
    loops: a term interned, a DFA row expanded, a product state, so the count is a measure of the work that is the
    same on any machine), and `limit_s`, its time limit, the last resort (a loaded machine reaches it sooner). Past
    `work`, CompilationWorkLimitError: whether a constraint compiles is decided by the work, not by the load. Its checks
    are also where a compilation running beside a request loop pauses while the loop runs its step (`pausing`;
    engine.gil_share says why); the time paused does not count against the limit."""

    __slots__ = ("limit_s", "t_end", "what", "work", "spent")

    def __init__(self, limit_s: float | None, what: str = "compiling the constraint", work: int | None = None):
        self.limit_s = limit_s
        self.t_end = None if limit_s is None else time.perf_counter() + limit_s
        self.what = what
        self.work = work
        self.spent = 0

    def check(self) -> None:
        self.spent += 1
        if self.work is not None and self.spent > self.work:
            raise CompilationWorkLimitError(f"{self.what} exceeded its work limit of {self.work} steps")
        paused = pause_point()
        if paused and self.t_end is not None:
            self.t_end += paused
        if self.t_end is not None and time.perf_counter() > self.t_end:
            raise CompilationTimeoutError(f"{self.what} exceeded the time limit of {self.limit_s:g} s")

    def expired(self) -> bool:
        return self.t_end is not None and time.perf_counter() > self.t_end


class CallDeadline:
    """The time limit of one constraint call. `kind`/`operation` name the constraint and what the call computes;
    `where` (a callable returning a string, evaluated only when the deadline fires) adds the request-level
    location (e.g. the JSON pointer at the canvas frontier); the automaton adds the DFA state it was expanding.
    `stop_s` (at most `limit_s`) fires it earlier than the limit it reports: a call that keeps part of its limit for
    an answer after the main work (canvas.py's salvage) stops that work at stop_s."""

    __slots__ = ("limit_s", "t_end", "kind", "operation", "where")

    def __init__(self, limit_s: float | None, kind: str = "constraint", operation: str = "", where=None,
                 stop_s: float | None = None):
        self.limit_s = limit_s
        span = limit_s if stop_s is None or limit_s is None else min(stop_s, limit_s)
        self.t_end = None if span is None else time.perf_counter() + span
        self.kind = kind
        self.operation = operation
        self.where = where

    def error(self, state: int | None = None, detail: str = "") -> ConstraintTimeoutError:
        parts = []
        if state is not None:
            parts.append(f"expanding DFA state {state}")
        if detail:
            parts.append(detail)
        if self.where is not None:
            try:
                w = self.where()
            except Exception:  # noqa: BLE001 - a description must never mask the timeout itself
                w = ""
            if w:
                parts.append(w)
        return ConstraintTimeoutError(kind=self.kind, operation=self.operation, location="; ".join(parts),
                                      timeout_s=self.limit_s)


class _Local(threading.local):
    # per thread; the class default answers where no call is active, without the AttributeError that
    # getattr(local, name, None) raises and catches inside (about 10x the cost of a check)
    d: CallDeadline | None = None
    pause: Callable[[], float] | None = None  # called at every compilation deadline check (`pausing`)


_local = _Local()


def check_active(state: int | None = None, detail: str = "", *args: object) -> None:
    """Raise ConstraintTimeoutError if this thread's active call deadline has passed. `detail % args` is
    formatted only then, so a check inside a hot loop costs a clock read, not a string."""
    d = _local.d
    if d is not None and d.t_end is not None and time.perf_counter() > d.t_end:
        raise d.error(state, detail % args if args else detail)


def fire_active(detail: str = "") -> None:
    """Fire this thread's active call deadline now (ConstraintTimeoutError, as if its time had passed): a call whose
    bounded work came out inconclusive takes its timeout answer at once instead of at the limit."""
    d = _local.d
    if d is None:
        raise ConstraintTimeoutError(location=detail)
    raise d.error(None, detail)


class activate:
    """`with activate(deadline):` makes `deadline` the active call deadline of this thread (restored after)."""

    __slots__ = ("d", "prev")

    def __init__(self, d: CallDeadline | None):
        self.d = d
        self.prev = None

    def __enter__(self) -> CallDeadline | None:
        self.prev = _local.d
        _local.d = self.d
        return self.d

    def __exit__(self, *exc) -> None:
        _local.d = self.prev


def pause_point() -> float:
    """Where a compilation may pause (`pausing`): at each deadline check, and before work that holds the GIL
    throughout, such as a collector pass. Returns the seconds paused."""
    pause = _local.pause
    return pause() if pause is not None else 0.0


@contextmanager
def pausing(pause: Callable[[], float] | None) -> Iterator[None]:
    """`with pausing(fn):` makes this thread's compilations call `fn()` (which returns the seconds it waited) at each
    of their deadline checks (points between atomic updates, frequent: about one every 30 us of a compilation):
    where a compilation may wait."""
    prev = _local.pause
    _local.pause = pause
    try:
        yield
    finally:
        _local.pause = prev
