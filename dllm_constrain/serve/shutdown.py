"""A graceful shutdown with a bound: what SIGTERM (or SIGINT) does to a running server.

Orchestrators give a pod a grace period (Kubernetes: 30 s) between SIGTERM and SIGKILL. Without a bound the
server drains for as long as its slowest request (48.8 s measured under load), and is killed mid-answer. Here,
from the signal on:

1. the server stops admitting: the listening socket closes (uvicorn), requests still arriving on open
   connections get 503 `server_shutting_down` with Retry-After (serve/admission.py), and requests waiting in the
   queue are failed with the same 503 at once (they would not start in time);
2. running requests get `abort_fraction` of `shutdown_timeout` to finish;
3. then the ones left are stopped at the engine's next step: a non-streamed request gets 503 `request_aborted`
   ("the server is shutting down"), a stream an error event;
4. uvicorn's own graceful-shutdown limit (`shutdown_timeout`) cancels whatever is still open, and the app's
   lifespan closes the backend.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any, Protocol

import uvicorn

from dllm_constrain.serve.admission import Drain
from dllm_constrain.serve.limits import DEFAULT_SHUTDOWN_TIMEOUT

log = logging.getLogger(__name__)
ABORT_FRACTION = 0.75  # of the shutdown timeout, left to running requests before they are stopped


class Drainable(Protocol):
    """What a bounded shutdown needs from a backend."""

    def drain(self) -> None:
        """Refuse new requests, fail the waiting ones; the running ones go on."""
        ...

    def close(self, timeout: float = 10.0) -> None:
        """Stop the running requests and wait (at most `timeout` s) until they have left the engine."""
        ...


@dataclass
class ShutdownPlan:
    """When the steps of the module docstring happen, counted from the signal."""

    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    abort_fraction: float = ABORT_FRACTION

    def __post_init__(self) -> None:
        if self.shutdown_timeout <= 0:
            raise ValueError("shutdown_timeout must be > 0")
        if not 0 <= self.abort_fraction <= 1:
            raise ValueError("abort_fraction must be within [0, 1]")

    @property
    def abort_after(self) -> float:
        return self.shutdown_timeout * self.abort_fraction


class BoundedShutdownServer(uvicorn.Server):
    """uvicorn's server whose exit signal also drains the app (`drain`) and the backend, and stops the backend's
    running requests `plan.abort_after` seconds later (steps 1-3). Give its Config
    `timeout_graceful_shutdown=plan.shutdown_timeout` (step 4; `make_server` does)."""

    def __init__(self, config: uvicorn.Config, *, backend: Drainable, drain: Drain, plan: ShutdownPlan) -> None:
        super().__init__(config)
        self.backend = backend
        self.drain = drain
        self.plan = plan
        self._stopper: threading.Thread | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Also called from a signal handler: only sets flags and starts a thread (the backend's lock may be held
        by the very thread the handler interrupts)."""
        if self._stopper is None:
            self.drain.begin()
            self._stopper = threading.Thread(target=self._stop_backend, name="serve-shutdown", daemon=True)
            self._stopper.start()
        super().handle_exit(sig, frame)

    def _stop_backend(self) -> None:
        self.backend.drain()
        if self.drain.since is not None:
            wait = self.plan.abort_after - (time.monotonic() - self.drain.since)
            if wait > 0:
                time.sleep(wait)
        log.info("shutdown: stopping the requests still running")
        self.backend.close(timeout=max(0.5, self.plan.shutdown_timeout - self.plan.abort_after))


def make_server(app: Any, *, backend: Drainable, drain: Drain, plan: ShutdownPlan, host: str, port: int,
                log_level: str = "info") -> BoundedShutdownServer:
    """The uvicorn server for `app` with the bounded shutdown of the module docstring."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=plan.shutdown_timeout)  # type: ignore[arg-type]
    return BoundedShutdownServer(config, backend=backend, drain=drain, plan=plan)


__all__ = ["BoundedShutdownServer", "DEFAULT_SHUTDOWN_TIMEOUT", "Drainable", "ShutdownPlan", "make_server"]
