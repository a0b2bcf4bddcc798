"""A compilation beside the request loop gives the GIL back to the loop: a short switch interval, and pauses.

Why: the loop thread's step is many small torch calls, and each one releases the GIL and takes it back. A thread
running pure Python beside it (a schema compiling on the LLM's compile thread) takes the GIL at every release and
keeps it until the interpreter's switch interval (5 ms by default) makes it hand the GIL back: every torch call of
the loop then waits up to that long (a convoy). `benchmarks/bench_compile_beside_loop.py` measures the cost and
both remedies (figures: docs/measurements.md).

The switch interval belongs to the process, so one object guards it (`compiling_beside`): the first compilation
to start lowers it (never raises it), the last to end puts back the value it found, unless something else changed
it meanwhile (then that value stays).

Even at 0.2 ms, the compilation takes the GIL at each release of the loop's step (hundreds a step). So a compilation
beside the loop also pauses while a loop runs its step's Python (`LoopActivity`): at its deadline checks (about one
every 30 us) it waits for the loops to be idle, i.e. waiting on a forward, on a compilation, or between steps; the
compilation then runs beside the forwards, where the loop does not need the GIL. A pause that runs out
(`MAX_PAUSE_S`: a loop busy that long is waiting for something else) ends the pauses of that compilation, so no
compilation is held back by more than that. The time paused does not count against the compilation's time limit.
"""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

COMPILE_SWITCH_INTERVAL_S = 2e-4
MAX_PAUSE_S = 0.02  # longer than a step's Python on the CPU (1-3 ms), far below a compilation's time limit


class SwitchIntervalWhileBusy:
    """While at least one holder is inside `hold()`, the process's switch interval is at most `interval_s`."""

    def __init__(self, interval_s: float = COMPILE_SWITCH_INTERVAL_S) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s!r}")
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._holders = 0
        self._saved: float | None = None  # the interval found by the first holder (None: left as it was)

    @property
    def holders(self) -> int:
        return self._holders

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._lock:
            if self._holders == 0:
                found = sys.getswitchinterval()
                if found > self.interval_s:
                    sys.setswitchinterval(self.interval_s)
                    self._saved = found
                else:
                    self._saved = None
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0 and self._saved is not None:
                    # sys.getswitchinterval() reads back the interval rounded to whole microseconds
                    if abs(sys.getswitchinterval() - self.interval_s) < 1e-6:
                        sys.setswitchinterval(self._saved)
                    self._saved = None


class LoopActivity:
    """How many request loops are running their step's Python now (`busy`), and a wait for none to be."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = 0
        self._mine = threading.local()  # .busy: whether this thread is inside `busy` and not `waiting`

    @property
    def busy_loops(self) -> int:
        return self._busy

    @contextmanager
    def busy(self) -> Iterator[None]:
        """A loop's step, from its start to its end (`waiting` inside it marks the waits)."""
        if getattr(self._mine, "busy", False):  # a step inside a step: counted once
            yield
            return
        self._enter()
        try:
            yield
        finally:
            self._leave()

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """The loop waits (on its forward, on a compilation) and needs no GIL meanwhile; outside `busy`, nothing."""
        if not getattr(self._mine, "busy", False):
            yield
            return
        self._leave()
        try:
            yield
        finally:
            self._enter()

    def _enter(self) -> None:
        with self._cond:
            self._busy += 1
        self._mine.busy = True

    def _leave(self) -> None:
        self._mine.busy = False
        with self._cond:
            self._busy -= 1
            if self._busy == 0:
                self._cond.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no loop is busy (True), or `timeout_s` (False)."""
        if self._busy == 0:  # read without the lock: the common case costs no lock
            return True
        with self._cond:
            return self._cond.wait_for(lambda: self._busy == 0, timeout=timeout_s)

    def pauser(self, max_pause_s: float = MAX_PAUSE_S) -> Callable[[], float]:
        """The pause of one compilation (`deadline.pausing`): wait while a loop is busy, returning the seconds
        waited; after one wait that runs out, never again."""
        enabled = True

        def pause() -> float:
            nonlocal enabled
            if not (enabled and self._busy):
                return 0.0
            start = time.perf_counter()
            if not self.wait_idle(max_pause_s):
                enabled = False
            return time.perf_counter() - start

        return pause


# one per process, as the GIL they share
compiling_beside = SwitchIntervalWhileBusy()
loop_activity = LoopActivity()
