"""The startup heap leaves the garbage collector's reach once a model is loaded (dllm_constrain.gc_heap).

Each check runs in a fresh interpreter: whether a heap is frozen is a property of the whole process, which the
test process's own earlier LLMs would decide."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


def _run(script: str, checkpoint: str | None = None) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CHECKPOINT": checkpoint or ""}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_the_first_freeze_freezes_what_is_alive_and_a_second_does_nothing() -> None:
    out = _run("""
        import gc
        from dllm_constrain.gc_heap import freeze_startup_heap
        assert gc.get_freeze_count() == 0
        kept = [[i] for i in range(1000)]
        assert freeze_startup_heap() is True
        frozen = gc.get_freeze_count()
        assert frozen >= 1000, frozen
        later = [[i] for i in range(1000)]
        assert freeze_startup_heap() is False
        assert gc.get_freeze_count() == frozen  # objects made after the freeze stay collectable
        print("ok")
    """)
    assert out == "ok"


def test_garbage_at_the_freeze_is_collected_not_made_permanent() -> None:
    out = _run("""
        import gc, weakref
        from dllm_constrain.gc_heap import freeze_startup_heap
        class Node: pass
        a, b = Node(), Node()
        a.other, b.other = b, a  # a reference cycle: only the collector frees it
        dead = weakref.ref(a)
        del a, b
        freeze_startup_heap()
        print(dead() is None)
    """)
    assert out == "True"


def test_a_heap_frozen_by_the_host_process_is_left_as_it_is() -> None:
    out = _run("""
        import gc
        from dllm_constrain.gc_heap import freeze_startup_heap
        gc.freeze()
        before = gc.get_freeze_count()
        extra = [[i] for i in range(1000)]
        print(freeze_startup_heap(), gc.get_freeze_count() == before)
    """)
    assert out == "False True"


@pytest.mark.parametrize("freeze", [True, False])
def test_loading_a_model_freezes_the_heap_unless_asked_not_to(tiny_checkpoint, freeze: bool) -> None:
    out = _run(f"""
        import gc, os
        import dllm_constrain as dc
        llm = dc.LLM(os.environ["CHECKPOINT"], freeze_gc_heap={freeze})
        print(gc.get_freeze_count() > 0)
    """, checkpoint=str(tiny_checkpoint))
    assert out == str(freeze)


def test_the_frozen_heap_is_handed_back_at_exit() -> None:
    """Native bindings that count leaked instances at shutdown (triton's nanobind modules) see them released."""
    out = _run("""
        import atexit, gc
        from dllm_constrain.gc_heap import freeze_startup_heap
        atexit.register(lambda: print(gc.get_freeze_count()))  # runs last: registered first (exit handlers are LIFO)
        freeze_startup_heap()
        assert gc.get_freeze_count() > 0
    """)
    assert out == "0"
