"""A compile-time deadline checked inside every potentially long loop (so compilation never hangs)."""
from __future__ import annotations

import time

from ..errors import CompilationTimeoutError


class Deadline:
    __slots__ = ("limit_s", "t_end", "what")

    def __init__(self, limit_s: float | None, what: str = "compiling the constraint"):
        self.limit_s = limit_s
        self.t_end = None if limit_s is None else time.perf_counter() + limit_s
        self.what = what

    def check(self) -> None:
        if self.t_end is not None and time.perf_counter() > self.t_end:
            raise CompilationTimeoutError(f"{self.what} exceeded the time limit of {self.limit_s:g} s")

    def expired(self) -> bool:
        return self.t_end is not None and time.perf_counter() > self.t_end
