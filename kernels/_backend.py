"""Backend choice for the kernels: Triton on CUDA, Triton's interpreter on CPU when forced, torch otherwise.

`backend="auto"` runs Triton when the tensors are on a CUDA device (and Triton imports), else the plain-torch
reference. `backend="triton"` forces the kernel; on CPU that needs `TRITON_INTERPRET=1` in the environment, which
runs the very same kernel source through Triton's numpy interpreter (how the kernels are proven without a GPU).
The environment variable `DLLM_CONSTRAIN_KERNEL_BACKEND` (auto | triton | torch) overrides "auto".

`last_backend(op)` tells which path the latest call of `op` took, so tests can assert the kernel really ran.

Triton decides at decoration time (`@triton.jit`) whether a function is compiled or interpreted. The kernel
sources therefore live in private modules imported on first use, and are re-imported if TRITON_INTERPRET changed
since (e.g. a test module switched the interpreter on after another module imported us).
"""
from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

import torch

BACKENDS = ("auto", "triton", "torch")
_LAST: dict[str, str] = {}


def interpreting() -> bool:
    """True when TRITON_INTERPRET asks for Triton's CPU interpreter (read the way Triton reads it)."""
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except Exception:  # older Triton without knobs
        return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # pragma: no cover - triton is a dependency, but a broken install should not crash torch users
        return False
    return True


def resolve_backend(backend: str, device: torch.device) -> str:
    """'triton' or 'torch' for a call on `device`; raises ValueError for a forced Triton run it cannot honour."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = os.environ.get("DLLM_CONSTRAIN_KERNEL_BACKEND", "auto").strip().lower() or "auto"
        if backend not in BACKENDS:
            raise ValueError(f"DLLM_CONSTRAIN_KERNEL_BACKEND must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if backend == "triton":
        if not triton_available():
            raise ValueError("backend='triton' requested but triton does not import")
        if device.type != "cuda" and not interpreting():
            raise ValueError(
                f"backend='triton' on a {device.type} tensor needs TRITON_INTERPRET=1 (Triton's CPU interpreter)"
            )
    return backend


def record(op: str, backend: str) -> None:
    _LAST[op] = backend


def last_backend(op: str) -> str | None:
    """The path ('triton' or 'torch') the latest call of `op` took, None if it never ran."""
    return _LAST.get(op)


def load_kernels(module_name: str) -> ModuleType:
    """Import a kernel-source module, re-importing it when TRITON_INTERPRET changed since its last import."""
    mod = sys.modules.get(module_name)
    if mod is None:
        mod = importlib.import_module(module_name)
    elif getattr(mod, "INTERPRETED", None) != interpreting():
        mod = importlib.reload(mod)
    return mod
