"""Lockstep block diffusion for models with a prompt cache and a separate canvas decoder (DiffusionGemma).

Such a model (`encode_prompt`, `init_canvas`, `denoise_step`, `advance`, `extend_prompt`, `noise`) has no
per-step forward over prompt + canvas, so it has no continuous batch: `LLMEngine.generate` runs its requests
here, block by block, through the engine's own stages (`LLMEngine.prepare_request`, `LLMEngine.after_forward`). The
prompt is encoded once into a KV cache; each block of `block_length` positions is denoised by the canvas
decoder alone, open positions holding fresh noise from each request's own generator every step (under a
constraint, the previous step's samples of the masked distribution instead), the previous step's logits fed
back as the self-conditioning signal; a finished block is appended to the cache.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from dllm_constrain.engine.models.base import BlockDiffusionLM
from dllm_constrain.engine.outputs import ProgressCallback
from dllm_constrain.engine.policies import CommitPolicy
from dllm_constrain.engine.state import RequestState
from dllm_constrain.engine.structured_output import Forwarded
from dllm_constrain.errors import InvalidRequestError

if TYPE_CHECKING:  # annotations only: llm_engine imports this module
    from dllm_constrain.engine.llm_engine import LLMEngine

__all__ = ["generate_blocks", "is_block_diffusion", "noised_block"]


def is_block_diffusion(model: Any) -> bool:
    """Models with a prompt cache and a separate canvas decoder (DiffusionGemma, `BlockDiffusionLM`) run
    `generate_blocks`."""
    return isinstance(model, BlockDiffusionLM)


def generate_blocks(engine: LLMEngine, states: list[RequestState], policies: list[CommitPolicy],
                    progress: ProgressCallback | None) -> None:
    """Denoise `states` in lockstep blocks (one max_new_tokens and block_length for all of them)."""
    model = engine.model
    first = states[0].params
    for s in states:
        if (s.params.max_new_tokens, s.params.block_length) != (first.max_new_tokens, first.block_length):
            raise InvalidRequestError("a block-diffusion batch needs one max_new_tokens and block_length "
                                      "for all its requests")
    width = max(len(s.prompt_ids) for s in states)
    ids = torch.full((len(states), width), engine.special.pad_id, dtype=torch.long)
    kpm = torch.zeros((len(states), width), dtype=torch.bool)
    for b, s in enumerate(states):
        ids[b, width - len(s.prompt_ids):] = torch.tensor(s.prompt_ids, dtype=torch.long)
        kpm[b, width - len(s.prompt_ids):] = True
    prompt = model.encode_prompt(ids, kpm)
    for block in range(first.num_blocks):
        start, end = first.block_bounds(block)
        canvas = model.init_canvas(prompt, end - start)
        sc_logits = None
        while True:
            for s in states:
                if not s.done and s.block == block:
                    engine.prepare_request(s)
            active = [b for b, s in enumerate(states) if not s.done and s.block == block]
            if not active:
                break
            device = canvas.canvas.device
            tokens = torch.stack([noised_block(model, s, start, end, device) for s in states])
            model.advance(canvas, tokens, torch.ones_like(tokens, dtype=torch.bool),
                          self_conditioning_logits=sc_logits)
            out = model.denoise_step(canvas)
            packed, width = out.hidden.reshape(-1, out.hidden.shape[-1]), out.hidden.shape[1]
            engine.after_forward([Forwarded(states[b], out.hidden[b], -start, packed=packed, start=b * width)
                                  for b in active], policies, engine.logits_path)
            temperature = first.temperature
            sc_logits = (out.logits / temperature if temperature > 0 else out.logits).to(out.hidden.dtype)
            if progress is not None:
                progress(engine._event(states))
        if all(s.done for s in states):
            return
        model.extend_prompt(prompt, torch.stack([s.canvas[start:end] for s in states]).to(ids.device))


def noised_block(model: Any, s: RequestState, start: int, end: int, device: torch.device | str = "cpu"
                 ) -> torch.Tensor:
    """The decoder input for one request's block, on `device`: committed ids, fresh noise from its generator
    elsewhere. Under a constraint, open positions sampled at the previous step take that sample of the masked
    (constrained) distribution instead of uniform noise. The host's canvas goes to the device, never the device's
    noise to the host (no host sync)."""
    ids = s.canvas[start:end].clone()
    keep = s.committed[start:end].clone()
    for pos, tok in s.model_state.get("masked_samples", {}).items():
        if start <= pos < end and not bool(keep[pos - start]):
            ids[pos - start], keep[pos - start] = tok, True
    noise = model.noise((end - start,), s.generator, s.generator.device).to(device)
    return torch.where(keep.to(device, non_blocking=True), ids.to(device, non_blocking=True), noise)
