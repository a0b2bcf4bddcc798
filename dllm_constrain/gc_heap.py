"""The process's startup heap moved out of the cyclic garbage collector's reach once a model is loaded.

A full (oldest-generation) collection walks every container object the collector tracks. With torch, the model and
the tokenizer loaded that is about 300,000 objects, and on a 2-core Xeon a walk takes 0.15-0.3 s; it lands inside
whatever step or constraint call allocates at that moment (a short constrained request then takes several times its
time, and a constraint call can exceed its per-call time limit). The objects loaded at startup live as long as the
process, so walking them again and again finds nothing: `gc.freeze()` moves them to the permanent generation, which
collections skip (vLLM freezes its engine's startup heap the same way). Objects made later (compiled constraints,
canvases, results) are collected as before; only a reference cycle among the frozen objects that dies later is
never reclaimed, which is why the freeze happens once, after the loading, and why it can be turned off
(`LLM(freeze_gc_heap=False)`).

Measured in docs/constraints.md ("Time bounds"): a full collection 141-170 ms before, about 10 ms after.
"""
from __future__ import annotations

import atexit
import gc


def freeze_startup_heap() -> bool:
    """Collect, then freeze every object alive now (`gc.freeze`), unless the process froze a heap already (an
    earlier LLM, a server's entry point, or a host such as vLLM): True when this call froze it.

    The frozen objects are handed back to the collector at exit (`gc.unfreeze` at `atexit`), so that native
    bindings which check for leaked instances at interpreter shutdown (triton's) still see them released."""
    if gc.get_freeze_count() > 0:
        return False
    gc.collect()  # what is garbage now must not become permanent
    gc.freeze()
    atexit.register(gc.unfreeze)
    return True
