"""dllm-constrain: structured output (JSON Schema, regex, grammars) for diffusion language models.

    import dllm_constrain as dc
    print(dc.generate("Request text", schema={...}))

The public names are imported on first use (PEP 562), so `python -m dllm_constrain --help` and the other
commands' argument errors answer without importing torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC = {
    "AsyncLLM": "dllm_constrain.async_llm",
    "EngineConfig": "dllm_constrain.engine.config",
    "LLM": "dllm_constrain.api",
    "GenerationResult": "dllm_constrain.api",
    "OutputConstraint": "dllm_constrain.engine.state",
    "POLICY_NAMES": "dllm_constrain.engine.state",
    "Processor": "dllm_constrain.processor",
    "SamplingParams": "dllm_constrain.engine.state",
    "bundled_model_path": "dllm_constrain.api",
    "clear_model_cache": "dllm_constrain.api",
    "generate": "dllm_constrain.api",
}

__all__ = [*_PUBLIC, "__version__"]

if TYPE_CHECKING:
    from dllm_constrain.api import LLM, GenerationResult, bundled_model_path, clear_model_cache, generate
    from dllm_constrain.async_llm import AsyncLLM
    from dllm_constrain.engine.config import EngineConfig
    from dllm_constrain.engine.state import POLICY_NAMES, OutputConstraint, SamplingParams
    from dllm_constrain.processor import Processor


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'dllm_constrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
