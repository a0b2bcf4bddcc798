"""The LLaDA-reference generation loop the throughput benchmark compares our engine against.

It follows GSAI-ML/LLaDA's generate.py: the whole sequence is recomputed at every step (model(x) -> logits
[B, L, V]), semi-autoregressive blocks, low_confidence remasking with the get_num_transfer_tokens quota, Gumbel
noise as add_gumbel_noise. Batches are left-padded with an attention mask (as the repository's batched
version); the position ids count real tokens only (our models' convention), so a row computes what it computes
alone, as in our engine.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from dllm_constrain.engine.models.base import default_position_ids


def add_gumbel_noise(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """LLaDA's add_gumbel_noise: exp(logits) / (-log U)^T in float64 (argmax = a sample of softmax(logits / T))."""
    if temperature == 0:
        return logits
    logits = logits.to(torch.float64)
    noise = torch.rand_like(logits, dtype=torch.float64)
    gumbel_noise = (-torch.log(noise)) ** temperature
    return logits.exp() / gumbel_noise


def get_num_transfer_tokens(mask_index: torch.Tensor, steps: int) -> torch.Tensor:
    """LLaDA's get_num_transfer_tokens: masked count // steps per step, the remainder on the first steps."""
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base = mask_num // steps
    remainder = mask_num % steps
    num_transfer_tokens = torch.zeros(mask_num.size(0), steps, dtype=torch.int64) + base
    for i in range(mask_num.size(0)):
        num_transfer_tokens[i, : remainder[i]] += 1
    return num_transfer_tokens


@torch.no_grad()
def llada_reference_generate(model: Any, prompt: torch.Tensor, attention_mask: torch.Tensor, steps: int,
                             gen_length: int, block_length: int, temperature: float = 0.0,
                             mask_id: int = 126336) -> torch.Tensor:
    """LLaDA's generate.py (remasking='low_confidence', cfg_scale=0) over a left-padded prompt batch [B, P]."""
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, : prompt.shape[1]] = prompt.clone()
    attention_mask = torch.cat([attention_mask, torch.ones((prompt.shape[0], gen_length), dtype=torch.bool)], dim=-1)
    position_ids = default_position_ids(attention_mask)
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    steps = steps // num_blocks
    for num_block in range(num_blocks):
        lo = prompt.shape[1] + num_block * block_length
        block_mask_index = x[:, lo: lo + block_length] == mask_id
        num_transfer_tokens = get_num_transfer_tokens(block_mask_index, steps)
        for i in range(steps):
            mask_index = x == mask_id
            logits = model(x, position_ids, attention_mask)  # [B, L, V]: the whole canvas, every step
            logits_with_noise = add_gumbel_noise(logits, temperature=temperature)
            x0 = torch.argmax(logits_with_noise, dim=-1)
            p = F.softmax(logits, dim=-1)
            x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
            x0_p[:, lo + block_length:] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.tensor(-np.inf, dtype=x0_p.dtype))
            transfer_index = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(confidence.shape[0]):
                _, select_index = torch.topk(confidence[j], k=int(num_transfer_tokens[j, i]))
                transfer_index[j, select_index] = True
            x[transfer_index] = x0[transfer_index]
    return x
