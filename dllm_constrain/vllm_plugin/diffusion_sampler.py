"""The sampler half of constrained DiffusionGemma in vLLM (diffusion_gemma.py binds it to vLLM's model state).

`ConstrainedDiffusionSampler` wraps vLLM's `DiffusionSampler` (any object with its call contract): the step's
input batch gives each request's slot (`idx_mapping_np`) and its rows of the flat logits (`cu_num_logits_np`; a
request with no rows is in prefill), and the step's `SamplerOutput` gives what each request committed
(`num_sampled`, `sampled_token_ids`). It imports no vLLM, so its bookkeeping is tested on the CPU against a
stand-in with that contract (tests/test_vllm_diffusion_gemma.py).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..constraints import TokenizerInfo
from .block_constraint import BlockConstraint, mask_flat_logits
from .core import CACHE, EXTRA_KEY


class ConstrainedDiffusionSampler:
    """vLLM's DiffusionSampler with our block constraints around each step (see the module docstring). Every
    attribute it does not define is the wrapped sampler's, so vLLM's runner sees the sampler it built."""

    def __init__(self, inner: Any, tokenizer_info: Callable[[], TokenizerInfo]) -> None:
        self._inner = inner
        self._load_info = tokenizer_info
        self._info: TokenizerInfo | None = None
        self.requests: dict[int, BlockConstraint] = {}  # slot -> its constraint

    def __getattr__(self, name: str) -> Any:  # only reached for attributes not found on this wrapper
        return getattr(self._inner, name)

    def _tokenizer_info(self) -> TokenizerInfo:
        if self._info is None:  # the model's tokenizer, loaded once the first constrained request arrives
            self._info = self._load_info()
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
