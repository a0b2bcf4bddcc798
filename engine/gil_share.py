"""A short GIL switch interval while a compilation runs beside the request loop.

Why: the loop thread's step is many small torch calls, and each one releases the GIL and takes it back. A thread
running pure Python beside it (a schema compiling on the LLM's compile thread) takes the GIL at every release and
keeps it until the interpreter's switch interval (5 ms by default) makes it hand the GIL back: every torch call of
the loop then waits up to that long (a convoy). Measured with `benchmarks/bench_compile_beside_loop.py` on the
bundled model: an unconstrained request took 5.1 s instead of 0.21 s while schemas compiled beside it; with the
interval at 0.2 ms, 0.56 s. A compilation beside the loop makes its thread hand the GIL over within that time,
so the loop's calls wait at most about that long; the compilation itself gets the GIL whenever the loop waits on a
forward.

The switch interval belongs to the process, so one object guards it (`compiling_beside`): the first compilation
to start lowers it (never raises it), the last to end puts back the value it found, unless something else changed
it meanwhile (then that value stays).
"""
from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

COMPILE_SWITCH_INTERVAL_S = 2e-4


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


# one per process, as the interval it guards
compiling_beside = SwitchIntervalWhileBusy()
