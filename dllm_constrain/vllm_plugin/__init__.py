"""dllm-constrain as a vLLM plugin.

- `register()` is the `vllm.general_plugins` entry point. vLLM calls it in each of its processes; when
  vLLM is importable it wraps `SamplingParams.verify` so that servers started with this plugin's
  logits processor hand `response_format` json_schema / json_object and `structured_outputs` regex /
  choice to the constraint layer instead of vLLM's grammar backend (routing.py).
- `DllmConstrainLogitsProcessor` (logits_processor.py) is the V1 custom logits processor that applies
  the layer's per-position masks: `--logits-processors dllm_constrain.vllm_plugin:DllmConstrainLogitsProcessor`.
- With DLLM_CONSTRAIN_VLLM_DIFFUSION=1, `register()` also registers `diffusion_gemma.ConstrainedDiffusionGemma`
  for DiffusionGemma: vLLM's model with a model state whose sampler applies block constraints
  (block_constraint.py, vLLM-independent) around vLLM's DiffusionSampler.
- core.py is the vLLM-independent part: request specs, the door to the compiler's one compile cache
  (keyed by the normalised schema or regex), the per-request canvas state.

Importing this package does not import vLLM. See docs/vllm.md for what is proven and what is not.
"""
from __future__ import annotations

from .core import CACHE, EXTRA_KEY, ConstraintCache, RequestConstraint, spec_from_structured_outputs
from .routing import register

__all__ = [
    "CACHE",
    "EXTRA_KEY",
    "ConstraintCache",
    "DllmConstrainLogitsProcessor",
    "RequestConstraint",
    "register",
    "spec_from_structured_outputs",
]


def __getattr__(name: str):
    if name == "DllmConstrainLogitsProcessor":
        from .logits_processor import DllmConstrainLogitsProcessor

        return DllmConstrainLogitsProcessor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
