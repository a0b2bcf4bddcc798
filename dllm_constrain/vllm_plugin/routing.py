"""Admission: hand a request's structured-output constraint to this plugin instead of vLLM's backend.

vLLM turns `response_format` (json_schema, json_object), `structured_outputs.regex` and
`structured_outputs.choice` into `SamplingParams.structured_outputs`, and `SamplingParams.verify`
then either refuses it (diffusion models) or selects a grammar backend (xgrammar, guidance, ...) that
the engine core runs. `claim()` moves such a constraint into `extra_args["dllm_constrain"]` and clears
`structured_outputs`, so vLLM's grammar backend never sees the request and the plugin's logits
processor applies the constraint layer's masks instead.

The patch point is `SamplingParams.verify` (vllm/sampling_params.py): `install()` wraps it so the claim
happens before vLLM's own checks. It is only active for servers started with this plugin's logits
processor (`--logits-processors dllm_constrain.vllm_plugin:DllmConstrainLogitsProcessor`); other
servers in the same environment keep vLLM's behaviour. See docs/vllm.md.
"""
from __future__ import annotations

import os
from typing import Any

from .core import CACHE, EXTRA_KEY, spec_from_structured_outputs, tokenizer_info_for

PROCESSOR_MODULE = "dllm_constrain.vllm_plugin"

DIFFUSION_REFUSAL = (
    "dllm_constrain cannot constrain this diffusion model inside vLLM yet: vLLM's diffusion sampler "
    "(DiffusionSampler in vllm/model_executor/models/diffusion_gemma.py) replaces the sampler, so it "
    "runs no logits processor. Start the server with DLLM_CONSTRAIN_VLLM_DIFFUSION=1 (our DiffusionGemma sampler), "
    "remove response_format, or serve the model with dllm-constrain's own server (docs/vllm.md, 'DiffusionGemma')."
)


DIFFUSION_ENV = "DLLM_CONSTRAIN_VLLM_DIFFUSION"
DIFFUSION_ARCH = "DiffusionGemmaForBlockDiffusion"
DIFFUSION_CLASS = "dllm_constrain.vllm_plugin.diffusion_gemma:ConstrainedDiffusionGemma"


def diffusion_enabled() -> bool:
    """True when this process serves DiffusionGemma with our constrained sampler (DLLM_CONSTRAIN_VLLM_DIFFUSION=1 in
    the server's environment: register() then registers diffusion_gemma.ConstrainedDiffusionGemma)."""
    return os.environ.get(DIFFUSION_ENV) == "1"


def register_diffusion_model() -> bool:
    """Register ConstrainedDiffusionGemma for DiffusionGemma's architecture when enabled (lazily, by name: vLLM
    imports it when a server loads such a model). Returns whether it did."""
    if not diffusion_enabled():
        return False
    from vllm import ModelRegistry

    ModelRegistry.register_model(DIFFUSION_ARCH, DIFFUSION_CLASS)
    return True


def is_enabled_for(model_config: Any) -> bool:
    """True when the server was started with this plugin's logits processor, or serves a diffusion model with our
    constrained sampler (`diffusion_enabled`; vLLM's V2 runner, which diffusion models need, loads no V1 logits
    processor, so there the environment is the switch)."""
    if getattr(model_config, "is_diffusion", False) and diffusion_enabled():
        return _has_our_sampler(model_config)
    for lp in getattr(model_config, "logits_processors", None) or ():
        name = lp if isinstance(lp, str) else f"{getattr(lp, '__module__', '')}:{getattr(lp, '__qualname__', '')}"
        if name.startswith(PROCESSOR_MODULE):
            return True
    return False


def _has_our_sampler(model_config: Any) -> bool:
    """Only DiffusionGemma's architecture is registered with our sampler: another diffusion model would take a
    constraint and never apply it."""
    return DIFFUSION_ARCH in (getattr(model_config, "architectures", None) or ())


def _validation_error(message: str):
    try:
        from vllm.exceptions import VLLMValidationError

        return VLLMValidationError(message, parameter="response_format")
    except ImportError:  # pragma: no cover - vLLM without the typed error
        return ValueError(message)


def model_tokenizer_info(model_config: Any, tokenizer: Any):
    key = (getattr(model_config, "tokenizer", None), getattr(model_config, "tokenizer_revision", None))
    return tokenizer_info_for(tokenizer, model_config.get_vocab_size(), key=key)


def claim(params: Any, model_config: Any = None, tokenizer: Any = None) -> dict | None:
    """Move `params.structured_outputs` (json schema / json_object / regex / choice) into
    `params.extra_args["dllm_constrain"]`. With the model config and tokenizer (admission), the
    constraint is also compiled (cached per schema text) so a schema the layer refuses, or one whose
    shortest answer exceeds max_tokens, is a 400 here rather than a failure in the sampler.

    Returns the claimed spec, or None when the request has nothing this plugin handles (grammar and
    structural_tag stay with vLLM)."""
    spec = spec_from_structured_outputs(getattr(params, "structured_outputs", None))
    if spec is None:
        return (getattr(params, "extra_args", None) or {}).get(EXTRA_KEY)
    if model_config is not None and getattr(model_config, "is_diffusion", False) and not diffusion_enabled():
        raise _validation_error(DIFFUSION_REFUSAL)
    if model_config is not None and getattr(model_config, "is_diffusion", False) and not _has_our_sampler(model_config):
        raise _validation_error(f"dllm_constrain constrains only {DIFFUSION_ARCH} among vLLM's diffusion models; this "
                                f"model is {list(getattr(model_config, 'architectures', None) or ())}: remove "
                                "response_format, or serve it with dllm-constrain's own server (docs/vllm.md)")
    if model_config is not None and tokenizer is not None:
        from ..errors import ConstraintError

        info = model_tokenizer_info(model_config, tokenizer)
        try:
            cc = CACHE.get(info, spec, where="admission")
        except (ConstraintError, ValueError) as e:
            raise _validation_error(f"{type(e).__name__}: {e}") from e
        n = getattr(params, "max_tokens", None)
        if n and not cc.fits(n):
            raise _validation_error(f"ConstraintTooLongError: the shortest answer this constraint accepts needs "
                                    f"{cc.min_tokens()} tokens, and max_tokens is {n}")
    extra = dict(getattr(params, "extra_args", None) or {})
    extra[EXTRA_KEY] = spec
    params.extra_args = extra
    params.structured_outputs = None
    return spec


_INSTALLED = False


def install() -> bool:
    """Wrap `vllm.sampling_params.SamplingParams.verify` (idempotent). Returns True when installed."""
    global _INSTALLED
    if _INSTALLED:
        return True
    from vllm.sampling_params import SamplingParams

    original = SamplingParams.verify
    if getattr(original, "_dllm_constrain", False):
        _INSTALLED = True
        return True

    def verify(self, model_config, speculative_config, structured_outputs_config, tokenizer, *args, **kwargs):
        if is_enabled_for(model_config):
            claim(self, model_config, tokenizer)
        return original(self, model_config, speculative_config, structured_outputs_config, tokenizer,
                        *args, **kwargs)

    verify._dllm_constrain = True  # type: ignore[attr-defined]
    verify.__wrapped__ = original  # type: ignore[attr-defined]
    verify.__doc__ = original.__doc__
    SamplingParams.verify = verify
    _INSTALLED = True
    return True


def register() -> None:
    """vLLM general-plugin entry point (`dllm_constrain.vllm_plugin:register`): the admission hook and, when enabled,
    the constrained DiffusionGemma. Safe to call many times, a no-op without vLLM."""
    try:
        import vllm.sampling_params  # noqa: F401
    except ImportError:
        return
    install()
    register_diffusion_model()
