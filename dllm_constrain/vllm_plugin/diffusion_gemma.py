"""Constrained DiffusionGemma inside vLLM: a model-state subclass whose sampler applies our block constraints.

vLLM runs DiffusionGemma through a model-state class that the model names (`get_model_state_cls()`), and the
state supplies the sampler (`custom_sampler()` -> `DiffusionSampler`). Both are extension points, so nothing of
vLLM's is patched here: `ConstrainedDiffusionGemma` is vLLM's model class with our state class,
`ConstrainedDiffusionGemmaModelState` is vLLM's state with our sampler around vLLM's, `ConstrainedDiffusionSampler`
(diffusion_sampler.py), which delegates every step to vLLM's `DiffusionSampler` with two additions for the requests
that carry a constraint (`extra_args["dllm_constrain"]`, put there at admission by routing.claim):

- before the step, each such request's rows of the flat `[sum of canvas widths, V]` logits are masked to its
  block's rows (block_constraint.py), where vLLM's own `_mask_rows_to_allowed` masks `diffusion_constrained`
  requests, so argmax, sampling, entropy and self-conditioning all read the masked distribution;
- after it, a request that committed its block (`num_sampled` > 0) has the block checked jointly and, where two
  positions cannot hold together, repaired in the sampler's output (`sampled_token_ids`) before vLLM emits it.

`register()` (this plugin's vLLM entry point) registers the class for the architecture
`DiffusionGemmaForBlockDiffusion` when DLLM_CONSTRAIN_VLLM_DIFFUSION=1 is set in the server's environment (opt-in).
Requests without a constraint take vLLM's path unchanged. Importing this module imports vLLM's DiffusionGemma module
(vLLM 0.32 has it; transformers' Gemma4 processor needs torchvision): docs/vllm.md, "DiffusionGemma".
"""
from __future__ import annotations

from typing import Any

from vllm.model_executor.models.diffusion_gemma import (
    DiffusionGemmaForConditionalGeneration,
    DiffusionGemmaModelState,
)

from .diffusion_sampler import ConstrainedDiffusionSampler
from .routing import model_tokenizer_info


class ConstrainedDiffusionGemmaModelState(DiffusionGemmaModelState):
    """vLLM's DiffusionGemma state with ConstrainedDiffusionSampler around its sampler."""

    _constrained: ConstrainedDiffusionSampler | None = None

    def custom_sampler(self, sampler: Any) -> tuple[Any, Any] | None:
        inner, extra = super().custom_sampler(sampler)
        model_config = self.model_config

        def tokenizer_info() -> Any:
            from vllm.tokenizers import cached_tokenizer_from_config

            return model_tokenizer_info(model_config, cached_tokenizer_from_config(model_config))

        self._constrained = ConstrainedDiffusionSampler(inner, tokenizer_info)
        return self._constrained, extra

    def remove_request(self, req_id: str) -> None:
        slot = self._req_id_to_index.get(req_id)
        super().remove_request(req_id)
        if slot is not None and self._constrained is not None:
            self._constrained.forget(slot)


class ConstrainedDiffusionGemma(DiffusionGemmaForConditionalGeneration):
    """vLLM's DiffusionGemma model, run with ConstrainedDiffusionGemmaModelState."""

    @staticmethod
    def get_model_state_cls():
        return ConstrainedDiffusionGemmaModelState
