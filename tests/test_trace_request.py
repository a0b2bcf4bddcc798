"""benchmarks/trace_request.py counts hops as it says: a call into a project file whose nearest project caller on
its thread is another file (or none), a thread's hops under its own name, runs of one pair collapsed in order."""
from __future__ import annotations

import importlib.util
import sys
import textwrap
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("trace_request", ROOT / "benchmarks" / "trace_request.py")
trace_request = importlib.util.module_from_spec(_spec)
sys.modules["trace_request"] = trace_request
_spec.loader.exec_module(trace_request)


def synthetic_package(tmp_path: Path) -> None:
    """tmp_path/hoppkg/{a,b}.py: a.entry calls b.work twice and a.helper; b.work goes through json."""
    pkg = tmp_path / "hoppkg"
    pkg.mkdir()
    (pkg / "a.py").write_text(textwrap.dedent("""
        from . import b

        def helper():
            return 1

        def entry():
            b.work()
            b.work()
            return helper()
    """))
    (pkg / "b.py").write_text(textwrap.dedent("""
        import json

        def inner():
            return 2

        def work():
            json.loads("1", parse_int=lambda s: inner())
    """))
    (pkg / "__init__.py").write_text("")


def traced(tmp_path: Path, monkeypatch, run, stop_at=None) -> list:
    synthetic_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import hoppkg.a as a

    recorder = trace_request.HopRecorder(root=tmp_path, stop_at=stop_at, folders=("hoppkg",))
    recorder.install()
    try:
        recorder.armed = True
        run(a)
    finally:
        recorder.uninstall()
    return recorder.hops


def test_calls_within_a_file_and_through_other_code_are_not_hops(tmp_path, monkeypatch):
    hops = traced(tmp_path, monkeypatch, lambda a: a.entry())
    pairs = [(h.caller, h.callee, h.function) for h in hops]
    # b.work -> json -> <lambda> in b.py -> b.inner: the nearest project caller of the lambda is b.py: no hop
    assert pairs == [(None, "hoppkg/a.py", "entry"),
                     ("hoppkg/a.py", "hoppkg/b.py", "work"),
                     ("hoppkg/a.py", "hoppkg/b.py", "work")]


def test_a_span_lists_files_in_first_entered_order_and_collapses_repeated_pairs(tmp_path, monkeypatch):
    span = trace_request.span("s", traced(tmp_path, monkeypatch, lambda a: a.entry()))
    assert span.hops == 3
    assert [f for f, _ in span.files] == ["hoppkg/a.py", "hoppkg/b.py"]
    assert [(a, b, n) for _, a, b, n in span.sequence] == [("(thread start)", "hoppkg/a.py", 1),
                                                           ("hoppkg/a.py", "hoppkg/b.py", 2)]


def test_a_thread_started_under_the_hook_records_its_hops_under_its_name(tmp_path, monkeypatch):
    def run(a):
        worker = threading.Thread(target=a.entry, name="worker-1")
        worker.start()
        worker.join(10)

    span = trace_request.span("s", traced(tmp_path, monkeypatch, run))
    assert span.threads == ["worker-1"] and span.hops == 3


def test_the_stop_call_ends_the_recording(tmp_path, monkeypatch):
    hops = traced(tmp_path, monkeypatch, lambda a: a.entry(), stop_at=("hoppkg/b.py", "work"))
    assert trace_request.span("s", hops).hops == 2  # entry, then the first b.work; the second is not seen


@pytest.fixture(autouse=True)
def forget_the_synthetic_package():
    yield
    for name in [m for m in sys.modules if m == "hoppkg" or m.startswith("hoppkg.")]:
        del sys.modules[name]
