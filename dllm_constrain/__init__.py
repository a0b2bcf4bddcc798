"""dllm-constrain: structured output (JSON Schema, regex, grammars) for diffusion language models.

    import dllm_constrain as dc
    print(dc.generate("Request text", schema={...}))
"""
from __future__ import annotations

from dllm_constrain.api import LLM, GenerationResult, bundled_model_path, clear_model_cache, generate
from dllm_constrain.async_llm import AsyncLLM
from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.state import POLICY_NAMES, OutputConstraint, SamplingParams

__version__ = "0.1.0"

__all__ = [
    "AsyncLLM",
    "EngineConfig",
    "LLM",
    "GenerationResult",
    "OutputConstraint",
    "POLICY_NAMES",
    "SamplingParams",
    "bundled_model_path",
    "clear_model_cache",
    "generate",
    "__version__",
]
