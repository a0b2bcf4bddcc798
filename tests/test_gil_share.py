"""A compilation beside the request loop runs with a short GIL switch interval, and leaves the process's as found."""
from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from dllm_constrain.engine.gil_share import COMPILE_SWITCH_INTERVAL_S, SwitchIntervalWhileBusy, compiling_beside
from dllm_constrain.engine.state import PendingConstraint


@pytest.fixture(autouse=True)
def default_interval():
    saved = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(saved)


def test_a_hold_lowers_the_interval_and_puts_back_the_one_it_found():
    guard = SwitchIntervalWhileBusy(2e-4)
    with guard.hold():
        assert sys.getswitchinterval() == pytest.approx(2e-4, abs=1e-6)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_the_interval_comes_back_only_when_the_last_holder_leaves():
    guard = SwitchIntervalWhileBusy(2e-4)
    first, second = guard.hold(), guard.hold()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert sys.getswitchinterval() == pytest.approx(2e-4, abs=1e-6)
    second.__exit__(None, None, None)
    assert sys.getswitchinterval() == pytest.approx(0.005)
    assert guard.holders == 0


def test_a_shorter_interval_already_set_is_left_alone():
    sys.setswitchinterval(1e-4)
    guard = SwitchIntervalWhileBusy(2e-4)
    with guard.hold():
        assert sys.getswitchinterval() == pytest.approx(1e-4, abs=1e-6)
    assert sys.getswitchinterval() == pytest.approx(1e-4, abs=1e-6)


def test_an_interval_set_by_someone_else_during_the_hold_stays():
    guard = SwitchIntervalWhileBusy(2e-4)
    with guard.hold():
        sys.setswitchinterval(0.001)
    assert sys.getswitchinterval() == pytest.approx(0.001)


def test_the_interval_comes_back_when_the_holder_raises():
    guard = SwitchIntervalWhileBusy(2e-4)
    with pytest.raises(RuntimeError):
        with guard.hold():
            raise RuntimeError("compilation failed")
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_holders_on_several_threads_share_one_lowering():
    guard = SwitchIntervalWhileBusy(2e-4)
    inside = threading.Barrier(3)
    leave = threading.Event()
    seen: list[float] = []

    def hold() -> None:
        with guard.hold():
            inside.wait(timeout=10)
            leave.wait(timeout=10)
            seen.append(sys.getswitchinterval())

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait(timeout=10)
    assert guard.holders == 2
    leave.set()
    for t in threads:
        t.join(timeout=10)
    assert seen == [pytest.approx(2e-4, abs=1e-6)] * 2  # each saw the short interval until it left
    assert guard.holders == 0
    assert sys.getswitchinterval() == pytest.approx(0.005)


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_an_interval_that_is_not_positive_is_refused(bad):
    with pytest.raises(ValueError, match="interval_s"):
        SwitchIntervalWhileBusy(bad)


def test_a_compilation_beside_the_loop_runs_with_the_short_interval():
    seen: list[float] = []

    def compile_now():
        seen.append(sys.getswitchinterval())
        return "compiled"

    with ThreadPoolExecutor(1) as pool:
        assert PendingConstraint(pool, compile_now).result(timeout=10) == "compiled"
    assert seen == [pytest.approx(COMPILE_SWITCH_INTERVAL_S, abs=1e-6)]
    assert compiling_beside.holders == 0
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_compilation_that_fails_still_puts_the_interval_back():
    def refuse():
        raise ValueError("not a schema")

    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(ValueError, match="not a schema"):
            PendingConstraint(pool, refuse).result(timeout=10)
    assert sys.getswitchinterval() == pytest.approx(0.005)
