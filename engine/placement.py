"""Where a checkpoint is loaded and in which dtype: the device and dtype rules of `LLM(device=, dtype=)`.

device None  -> `default_device()`: "cuda" when `torch.cuda.is_available()`, else "cpu".
dtype None   -> the checkpoint's stored floating dtype; on CUDA a float32 checkpoint loads as bfloat16 when the GPU
                supports it (`torch.cuda.is_bf16_supported()`), as serving engines do.
Strings are accepted ("cpu", "cuda", "cuda:0"; "bfloat16"/"bf16", "float16"/"fp16"/"half", "float32"/"fp32"/
"float"), as are torch.device / torch.dtype objects. A bad value raises InvalidRequestError naming the field.

Sampling noise is drawn on the model's device from each request's own generator (engine.llm_engine), so a seed
reproduces its results on the same device, not across devices (as in vLLM).
"""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from dllm_constrain.errors import InvalidRequestError

DEVICE_TYPES = ("cpu", "cuda")
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def usable_cpus() -> frozenset[int]:
    """The CPU cores this process may run on, by number (its affinity mask, e.g. under taskset); empty where the OS
    has no affinity masks."""
    affinity = getattr(os, "sched_getaffinity", None)
    return frozenset(affinity(0)) if callable(affinity) else frozenset()


def usable_cores() -> int:
    """How many CPU cores this process may run on (`usable_cpus`; where the OS has no affinity masks, all of them)."""
    return len(usable_cpus()) or os.cpu_count() or 1


def default_device() -> torch.device:
    """The device a model goes to when none is named: CUDA when available, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def resolve_device(device: Any) -> torch.device:
    """`device` (None, a string such as "cpu" / "cuda:0", or a torch.device) as a torch.device the engine can run
    on; InvalidRequestError naming `device` for anything else, or for CUDA when it is not available."""
    if device is None:
        return default_device()
    if isinstance(device, torch.device):
        dev = device
    elif isinstance(device, str):
        try:
            dev = torch.device(device.strip())
        except (RuntimeError, ValueError, TypeError):
            raise InvalidRequestError(f"device must be 'cpu', 'cuda' or 'cuda:N' (or None), got {device!r}") from None
    else:
        raise InvalidRequestError(f"device must be a string such as 'cpu' or 'cuda:0', a torch.device or None, "
                                  f"got {device!r} (a {type(device).__name__})")
    if dev.type not in DEVICE_TYPES:
        raise InvalidRequestError(f"device must be 'cpu', 'cuda' or 'cuda:N' (or None), got {device!r}: the engine "
                                  f"runs on {' and '.join(DEVICE_TYPES)}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidRequestError(f"device={device!r} but CUDA is not available here (use device='cpu')")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InvalidRequestError(f"device={device!r} but only {torch.cuda.device_count()} CUDA device(s) exist")
    return dev


def parse_dtype(dtype: Any) -> torch.dtype | None:
    """`dtype` (None, a name in DTYPES, optionally prefixed "torch.", or a torch.dtype among them) as a torch.dtype;
    InvalidRequestError naming `dtype` otherwise."""
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
    elif isinstance(dtype, str):
        name = dtype.strip().lower()
        name = name[len("torch."):] if name.startswith("torch.") else name
        if name in DTYPES:
            return DTYPES[name]
    raise InvalidRequestError(f"dtype must be one of 'bfloat16' ('bf16'), 'float16' ('fp16', 'half'), 'float32' "
                              f"('fp32') or a matching torch.dtype (or None), got {dtype!r}")


def stored_dtype(folder: str | Path) -> torch.dtype | None:
    """The checkpoint's floating dtype (the most common one among its safetensors tensors, read from the headers
    only); None when the folder cannot tell (the loader then reports what is wrong with it)."""
    from safetensors import safe_open

    from dllm_constrain.engine.loader import weight_files

    try:
        counts: Counter[str] = Counter()
        for path in weight_files(folder):
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    counts[f.get_slice(name).get_dtype()] += 1
    except Exception:  # CheckpointError, OSError, or safetensors' own error for a corrupt header
        return None
    floating = [(n, c) for n, c in counts.most_common() if n in _SAFETENSORS_DTYPES]
    return _SAFETENSORS_DTYPES[floating[0][0]] if floating else None


def resolve_dtype(dtype: Any, device: torch.device, stored: torch.dtype | None) -> torch.dtype | None:
    """The dtype to load in: `dtype` when given; else on CUDA bfloat16 for a float32 (or unknown) checkpoint when
    the GPU supports it; else `stored` (None: the loader keeps the stored dtype)."""
    chosen = parse_dtype(dtype)
    if chosen is not None:
        return chosen
    if device.type == "cuda" and stored in (None, torch.float32) and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return stored


def model_dtype(model: Any) -> torch.dtype:
    """The dtype of the model's first floating parameter (float32 when it has none)."""
    params = getattr(model, "parameters", None)
    if callable(params):
        for p in params():
            if p.is_floating_point():
                return p.dtype
    return torch.float32
