"""A compilation beside the request loop gives the GIL back to it: it runs with a short switch interval (and leaves
the process's interval as it found it), and pauses at its deadline checks while a loop runs its step's Python."""
from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dllm_constrain.constraints.deadline import Deadline, pausing
from dllm_constrain.engine.gil_share import (
    COMPILE_SWITCH_INTERVAL_S,
    LoopActivity,
    SwitchIntervalWhileBusy,
    compiling_beside,
    loop_activity,
)
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


# ------------------------------------------------------------------ pauses while a loop runs its step


def test_a_pause_returns_at_once_when_no_loop_is_busy():
    activity = LoopActivity()
    pause = activity.pauser(max_pause_s=5.0)
    pause()  # no loop: nothing to wait for (a wait here would last 5 s and fail the suite's time bound)
    assert activity.busy_loops == 0


def test_a_pause_waits_until_the_busy_loop_waits():
    activity = LoopActivity()
    pause = activity.pauser(max_pause_s=10.0)
    in_step, go_wait = threading.Event(), threading.Event()
    order: list[str] = []

    def loop() -> None:
        with activity.busy():
            in_step.set()
            go_wait.wait(timeout=10)
            order.append("loop waits")
            with activity.waiting():
                time.sleep(0.05)

    t = threading.Thread(target=loop)
    t.start()
    in_step.wait(timeout=10)
    threading.Timer(0.05, go_wait.set).start()
    pause()
    order.append("compilation goes on")
    t.join(timeout=10)
    assert order == ["loop waits", "compilation goes on"]


def test_a_pause_that_runs_out_ends_the_pauses_of_that_compilation():
    activity = LoopActivity()
    pause = activity.pauser(max_pause_s=0.01)
    with activity.busy():
        t0 = time.perf_counter()
        pause()  # runs out
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(100):
            pause()  # no more waits
        later = time.perf_counter() - t0
    assert first >= 0.01
    assert later < 0.01


def test_waiting_outside_a_step_changes_nothing_and_a_step_inside_a_step_counts_once():
    activity = LoopActivity()
    with activity.waiting():
        assert activity.busy_loops == 0
    with activity.busy():
        with activity.busy():
            assert activity.busy_loops == 1
        assert activity.busy_loops == 1
        with activity.waiting():
            assert activity.busy_loops == 0
        assert activity.busy_loops == 1
    assert activity.busy_loops == 0


def test_the_pause_is_called_at_the_deadline_checks_of_this_thread_only():
    calls: list[str] = []
    d = Deadline(None)
    with pausing(lambda: calls.append(threading.current_thread().name) or 0.0):
        d.check()
        other = threading.Thread(target=d.check, name="other")
        other.start()
        other.join(timeout=10)
    d.check()
    assert calls == [threading.current_thread().name]


def test_a_compilation_beside_the_loop_pauses_at_its_checks():
    seen: list[bool] = []

    def compile_now():
        from dllm_constrain.constraints import deadline

        seen.append(deadline._local.pause is not None)
        return "compiled"

    with ThreadPoolExecutor(1) as pool:
        assert PendingConstraint(pool, compile_now).result(timeout=10) == "compiled"
    assert seen == [True]


def test_the_engine_counts_its_step_busy_and_its_forward_wait_idle(monkeypatch):
    from conftest import build_tiny_llada

    from dllm_constrain.engine.config import EngineConfig
    from dllm_constrain.engine.llm_engine import LLMEngine
    from dllm_constrain.engine.models import scripted_forward
    from dllm_constrain.engine.placement import usable_cores
    from dllm_constrain.engine.state import Request, SamplingParams

    if usable_cores() < 2:
        pytest.skip("the GIL-free forward runs only with 2 usable cores")
    in_step: list[int] = []
    in_forward_wait: list[int] = []
    run_step = LLMEngine._run_step
    wait = scripted_forward.RunningForward.wait

    def recording_step(self, loop):
        in_step.append(loop_activity.busy_loops)
        return run_step(self, loop)

    def recording_wait(self):
        in_forward_wait.append(loop_activity.busy_loops)
        return wait(self)

    monkeypatch.setattr(LLMEngine, "_run_step", recording_step)
    monkeypatch.setattr(scripted_forward.RunningForward, "wait", recording_wait)
    engine = LLMEngine(build_tiny_llada(), config=EngineConfig(gil_free_forward=True))
    engine.generate([Request([5, 6, 7], SamplingParams(max_new_tokens=8, block_length=8))])
    assert in_step and set(in_step) == {1}
    assert in_forward_wait and set(in_forward_wait) == {0}
    assert loop_activity.busy_loops == 0


def test_a_compilation_may_pause_before_its_collector_pass(monkeypatch):
    import gc

    from dllm_constrain.constraints import compile_cache

    events: list[str] = []
    real_collect = gc.collect

    class RecordingGC:
        isenabled, disable, enable = staticmethod(gc.isenabled), staticmethod(gc.disable), staticmethod(gc.enable)

        @staticmethod
        def collect(generation: int = 2) -> int:
            events.append("collect")
            return real_collect(generation)

    monkeypatch.setattr(compile_cache, "gc", RecordingGC)
    with pausing(lambda: events.append("pause") or 0.0):
        assert compile_cache._build_or_refusal(lambda: "built") == "built"
    assert events == ["pause", "collect"]


def test_a_pause_point_without_a_pause_does_nothing():
    from dllm_constrain.constraints.deadline import pause_point

    pause_point()  # no hook on this thread
    calls: list[int] = []
    with pausing(lambda: calls.append(1) or 0.0):
        pause_point()
    pause_point()
    assert calls == [1]


def test_the_time_a_compilation_pauses_does_not_count_against_its_limit():
    from dllm_constrain.errors import CompilationTimeoutError

    limit = Deadline(0.05)
    time.sleep(0.06)  # the limit has passed, as if the compilation had worked that long
    with pytest.raises(CompilationTimeoutError):
        limit.check()
    paused = Deadline(0.05)
    time.sleep(0.06)  # ... while it waited for the loop: the pause reports the time
    with pausing(lambda: 1.0):  # (more than it slept: the test does not race the clock)
        paused.check()


def test_a_pause_reports_how_long_it_waited():
    activity = LoopActivity()
    pause = activity.pauser(max_pause_s=0.02)
    assert pause() == 0.0  # no loop busy
    with activity.busy():
        assert pause() >= 0.02  # ran out
