"""RoPE precision as each family's official code computes it.

LLaDA (`rope_full_precision`, on in LLaDA-8B's config.json and the default of LLaDA's ModelConfig): the cos/sin
tables and the rotation in float32, the result cast back to the activations' dtype. Dream (Qwen2's rotary
embedding): the tables computed in float32 and cast to the activations' dtype, the rotation in that dtype.
"""
from __future__ import annotations

import torch

from dllm_constrain.engine.models.layers import apply_rope, rope_cos_sin
from dllm_constrain.engine.models.llada import LLaDAConfig, LLaDAModel

BASE = dict(d_model=64, n_layers=1, n_heads=2, mlp_hidden_size=64, vocab_size=50, mask_token_id=3, eos_token_id=1)


def _rotated(x: torch.Tensor, pos: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    cos, sin = rope_cos_sin(pos, x.shape[-1], 10000.0, dtype)
    return apply_rope(x, cos, sin)


def test_the_config_field_is_read_and_defaults_to_full_precision() -> None:
    assert LLaDAConfig.from_dict(BASE).rope_full_precision is True
    assert LLaDAConfig.from_dict({**BASE, "rope_full_precision": False}).rope_full_precision is False
    assert LLaDAConfig.from_dict(LLaDAConfig(**BASE, rope_full_precision=False).to_dict()).rope_full_precision is False


def test_full_precision_rotates_bf16_activations_in_float32() -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 2, 64, 32).to(torch.bfloat16)
    pos = torch.arange(4000, 4064)[None]  # far positions: bf16 tables are coarse there
    model = LLaDAModel(LLaDAConfig(**BASE)).to(torch.bfloat16)
    assert model.rope_dtype(x) == torch.float32
    full = _rotated(x, pos, model.rope_dtype(x))
    assert full.dtype == torch.bfloat16
    expect = _rotated(x.float(), pos, torch.float32).to(torch.bfloat16)
    assert torch.equal(full, expect)
    low = _rotated(x, pos, torch.bfloat16)  # Qwen2/Dream's way, and LLaDA's with rope_full_precision=False
    assert not torch.equal(low, expect)
    off = LLaDAModel(LLaDAConfig(**BASE, rope_full_precision=False)).to(torch.bfloat16)
    assert off.rope_dtype(x) == torch.bfloat16


def test_float32_models_are_unchanged_by_the_setting() -> None:
    torch.manual_seed(1)
    ids = torch.randint(4, 50, (1, 12))
    on = LLaDAModel(LLaDAConfig(**BASE)).eval()
    off = LLaDAModel(LLaDAConfig(**BASE, rope_full_precision=False)).eval()
    off.load_state_dict(on.state_dict())
    with torch.inference_mode():
        assert torch.equal(on.hidden_states(ids), off.hidden_states(ids))
