"""Constrained DiffusionGemma inside vLLM: a model-state subclass whose sampler applies our block constraints.

vLLM runs DiffusionGemma through a model-state class that the model names (`get_model_state_cls()`), and the
state supplies the sampler (`custom_sampler()` -> `DiffusionSampler`). Both are extension points, so nothing of
vLLM's is patched here: `ConstrainedDiffusionGemma` is vLLM's model class with our state class,
`ConstrainedDiffusionGemmaModelState` is vLLM's state with our sampler around vLLM's, and
`ConstrainedDiffusionSampler` delegates every step to vLLM's `DiffusionSampler`, with two additions for the
requests that carry a constraint (`extra_args["dllm_constrain"]`, put there at admission by routing.claim):

- before the step, each such request's rows of the flat `[sum of canvas widths, V]` logits are masked to its
  block's rows (block_constraint.py), where vLLM's own `_mask_rows_to_allowed` masks `diffusion_constrained`
  requests, so argmax, sampling, entropy and self-conditioning all read the masked distribution;
- after it, a request that committed its block (`num_sampled` > 0) has the block checked jointly and, where two
  positions cannot hold together, repaired in the sampler's output (`sampled_token_ids`) before vLLM emits it.

`register()` (this plugin's vLLM entry point) registers the class for the architecture
`DiffusionGemmaForBlockDiffusion` when DLLM_CONSTRAIN_VLLM_DIFFUSION=1 is set in the server's environment (opt-in:
it replaces vLLM's class for that architecture). Requests without a constraint take vLLM's path unchanged.
Importing this module imports vLLM's DiffusionGemma module, which needs a vLLM build with it (0.32 has it) and
transformers' Gemma4 processor (torchvision): docs/vllm.md, "DiffusionGemma".
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from vllm.model_executor.models.diffusion_gemma import (
    DiffusionGemmaForConditionalGeneration,
    DiffusionGemmaModelState,
)

from .block_constraint import BlockConstraint, mask_flat_logits
from .core import CACHE, EXTRA_KEY
from .routing import model_tokenizer_info


class ConstrainedDiffusionSampler:
    """vLLM's DiffusionSampler with our block constraints around each step (see the module docstring). Every
    attribute it does not define is the wrapped sampler's, so vLLM's runner sees the sampler it built."""

    def __init__(self, inner: Any, model_config: Any) -> None:
        self._inner = inner
        self._model_config = model_config
        self._info: Any = None
        self.requests: dict[int, BlockConstraint] = {}  # slot -> its constraint

    def __getattr__(self, name: str) -> Any:  # only reached for attributes not found on this wrapper
        return getattr(self._inner, name)

    def _tokenizer_info(self) -> Any:
        if self._info is None:
            from vllm.tokenizers import cached_tokenizer_from_config

            self._info = model_tokenizer_info(self._model_config, cached_tokenizer_from_config(self._model_config))
        return self._info

    def add_request(self, req_idx: int, sampling_params: Any) -> None:
        self._inner.add_request(req_idx, sampling_params)
        self.requests.pop(req_idx, None)
        extra = getattr(sampling_params, "extra_args", None) or {}
        spec = extra.get(EXTRA_KEY)
        if spec is not None:
            if extra.get("diffusion_constrained"):  # that path samples over a K-token set, not our V-wide rows
                raise ValueError("a dllm_constrain constraint cannot be combined with diffusion_constrained")
            compiled = CACHE.get(self._tokenizer_info(), spec, where="diffusion sampler")
            self.requests[req_idx] = BlockConstraint.for_request(compiled, sampling_params.max_tokens)

    def forget(self, req_idx: int) -> None:
        self.requests.pop(req_idx, None)

    def __call__(self, logits: torch.Tensor, input_batch: Any, draft_logits: torch.Tensor | None = None) -> Any:
        if not self.requests or input_batch.num_draft_tokens == 0:  # nothing constrained, or a prefill step
            return self._inner(logits, input_batch, draft_logits)
        num_reqs = input_batch.num_reqs
        slots = input_batch.idx_mapping_np[:num_reqs]
        rows_per_req = np.diff(input_batch.cu_num_logits_np[:num_reqs + 1])
        decode = np.flatnonzero(rows_per_req > 0)
        starts = np.concatenate(([0], np.cumsum(rows_per_req[decode])[:-1])).astype(np.int64)
        masks = [self.requests[int(slots[i])].block_rows(int(rows_per_req[i]), logits.shape[-1])
                 if int(slots[i]) in self.requests else None for i in decode]
        masked = mask_flat_logits(logits, starts, masks)
        out = self._inner(masked, input_batch, draft_logits)
        self._commit(out, masked, slots, decode, starts)
        return out

    def _commit(self, out: Any, masked: torch.Tensor, slots: np.ndarray, decode: np.ndarray,
                starts: np.ndarray) -> None:
        """Check (and repair) the blocks the step committed, in the sampler's output."""
        constrained = [(i, int(slots[i]), int(start)) for i, start in zip(decode, starts)
                       if int(slots[i]) in self.requests]
        if not constrained:
            return
        num_sampled = out.num_sampled.cpu().numpy()  # one device-to-host copy per step with a constrained request
        for i, slot, start in constrained:
            k = int(num_sampled[i])
            if k == 0:
                continue  # still denoising
            block = out.sampled_token_ids[i, :k].tolist()
            final = self.requests[slot].commit(block, masked[start:start + k])
            if final != block:
                out.sampled_token_ids[i, :k] = torch.tensor(final, dtype=out.sampled_token_ids.dtype,
                                                            device=out.sampled_token_ids.device)


class ConstrainedDiffusionGemmaModelState(DiffusionGemmaModelState):
    """vLLM's DiffusionGemma state with ConstrainedDiffusionSampler around its sampler."""

    _constrained: ConstrainedDiffusionSampler | None = None

    def custom_sampler(self, sampler: Any) -> tuple[Any, Any] | None:
        inner, extra = super().custom_sampler(sampler)
        self._constrained = ConstrainedDiffusionSampler(inner, self.model_config)
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
