"""The step's device-to-host reads, in one place.

On CUDA, Python reading a value the device computed (`.item()`, `bool(t)`, `.tolist()`, a copy to the host) waits
for every kernel queued before it: a host sync. The engine's step reads device results only through `to_host`, so
the syncs of a step are the calls of `to_host` it makes (counted by tests and benchmarks on the CPU as on CUDA). The
copy is explicit even on the CPU (`copy=True`), so the read is a dispatched `aten._to_copy` to the host either way.
"""
from __future__ import annotations

import torch

HOST = torch.device("cpu")


def to_host(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Host copies of `tensors`, made by one wait on the device: pass everything a step needs at once."""
    return tuple(t.to(HOST, copy=True) for t in tensors)
