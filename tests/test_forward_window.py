"""A mask job waiting for a constraint still compiling sleeps until the compilation ends or the forward does."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from dllm_constrain.engine.mask_workers import ForwardWindow


def _wait_in_thread(window: ForwardWindow, future: Future) -> tuple[threading.Thread, list[bool]]:
    out: list[bool] = []
    t = threading.Thread(target=lambda: out.append(window.wait_done(future)))
    t.start()
    return t, out


def test_a_done_future_returns_at_once_even_with_the_window_closed() -> None:
    future: Future = Future()
    future.set_result(1)
    assert ForwardWindow().wait_done(future) is True


def test_a_closed_window_does_not_wait_for_a_compiling_constraint() -> None:
    assert ForwardWindow().wait_done(Future()) is False


def test_the_waiting_job_wakes_when_the_compilation_ends() -> None:
    window, future = ForwardWindow(), Future()
    window.open()
    t, out = _wait_in_thread(window, future)
    time.sleep(0.05)
    assert t.is_alive() and out == []  # still waiting: neither event has happened
    future.set_result("compiled")
    t.join(timeout=5)
    assert out == [True]


def test_the_waiting_job_wakes_when_the_forward_ends() -> None:
    window, future = ForwardWindow(), Future()
    window.open()
    t, out = _wait_in_thread(window, future)
    time.sleep(0.05)
    assert t.is_alive()
    window.close()
    t.join(timeout=5)
    assert out == [False] and not future.done()


def test_a_failed_compilation_also_wakes_the_job() -> None:
    window, future = ForwardWindow(), Future()
    window.open()
    t, out = _wait_in_thread(window, future)
    future.set_exception(ValueError("refused"))
    t.join(timeout=5)
    assert out == [True]
