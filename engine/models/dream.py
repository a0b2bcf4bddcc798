"""Dream (Dream-org/Dream-v0-*-7B): a Qwen2-layout transformer run bidirectionally, loaded from its HF layout.

Tensor names are the released ones: `model.embed_tokens.weight`, `model.layers.{i}.self_attn.{q,k,v}_proj.
{weight,bias}`, `model.layers.{i}.self_attn.o_proj.weight` (no bias), `model.layers.{i}.mlp.{gate,up,down}_proj.
weight`, `model.layers.{i}.{input_layernorm,post_attention_layernorm}.weight`, `model.norm.weight`,
`lm_head.weight` (absent from the file when tie_word_embeddings is true).

Shifted prediction: Dream was adapted from an autoregressive model and keeps its "hidden state i predicts token
i+1" head; its sampler shifts logits right by one (`cat([logits[:, :1], logits[:, :-1]])`). The adapter does the
same on hidden states, so `hidden_states()[:, i]` is the state that predicts token i, as the engine contract
requires. Position 0 keeps its own state; it is never a canvas position (a prompt always precedes the canvas).

Numerics: RMSNorm multiplies by its weight in float32 before casting back (the reference multiplies after
casting), a rounding-level difference in bf16 and none in float32.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from dllm_constrain.errors import CheckpointError
from dllm_constrain.engine.models.base import (
    LinearHeadLM,
    ScriptableLM,
    SpecialTokens,
    default_position_ids,
    parse_config_fields,
)
from dllm_constrain.engine.models.layers import (
    RMSNorm,
    apply_rope,
    attention_bias,
    bidirectional_attention,
    rope_cos_sin,
    swiglu,
)
from dllm_constrain.engine.models.scripted_forward import ScriptedWeights

AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (q, k, v) -> attention output
ObserveFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]  # (layer, q, k, v)
LayerAttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (layer, q, k, v) -> out

# Fields of the released Dream config.json that we accept when they hold the value we implement.
_ACCEPTED_AS: dict[str, set[Any]] = {
    "hidden_act": {"silu"},
    "rope_scaling": {None},
    "use_sliding_window": {False},
    "attention_bias": {True},  # q/k/v biases are always present in the Qwen2 layout
    "use_mrope": {False},
}
# Fields with no effect on inference (training, init, dropout, caching, hub metadata, unused sliding window).
_IGNORED = {
    "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "initializer_range", "attention_dropout", "_name_or_path", "sliding_window", "max_window_layers",
    "output_attentions", "output_hidden_states", "return_dict",
}


@dataclass
class DreamConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    vocab_size: int
    mask_token_id: int
    eos_token_id: int
    num_key_value_heads: int | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    head_dim: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def dim_per_head(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "DreamConfig":
        """Parse config.json, refusing fields we do not know and feature values we do not implement."""
        kwargs, extra = parse_config_fields(cls, raw, family="Dream", accepted_as=_ACCEPTED_AS,
                                            ignored=_IGNORED)
        if isinstance(kwargs.get("eos_token_id"), list):
            kwargs["eos_token_id"] = kwargs["eos_token_id"][0]
        cfg = cls(**kwargs, extra=extra)
        if cfg.hidden_size % cfg.num_attention_heads or cfg.num_attention_heads % cfg.kv_heads:
            raise CheckpointError(f"Dream config: hidden_size={cfg.hidden_size}, num_attention_heads="
                                  f"{cfg.num_attention_heads}, num_key_value_heads={cfg.kv_heads} do not divide evenly")
        if cfg.head_dim is not None and cfg.head_dim != cfg.dim_per_head:
            raise CheckpointError(f"Dream config field head_dim={cfg.head_dim} is not supported "
                                  f"(the Qwen2 layout needs hidden_size / num_attention_heads = {cfg.dim_per_head})")
        return cfg

    def to_dict(self) -> dict[str, Any]:
        """A config.json in the released Dream layout."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("extra", "head_dim")}
        out.update({"model_type": "Dream", "architectures": ["DreamModel"], "hidden_act": "silu",
                    "rope_scaling": None, "use_sliding_window": False})
        return out


class DreamAttention(nn.Module):
    def __init__(self, cfg: DreamConfig) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.dim_per_head
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.kv_heads, hd
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=True)
        self.k_proj = nn.Linear(d, self.n_kv * hd, bias=True)
        self.v_proj = nn.Linear(d, self.n_kv * hd, bias=True)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=False)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        b, n, _ = h.shape
        q = self.q_proj(h).view(b, n, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        att = bidirectional_attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, bias)
        return self.o_proj(att.transpose(1, 2).reshape(b, n, -1))

    def forward_with(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        """`forward` with the attention supplied by the caller: attend(q, k, v) -> [B, Hq, L, D] (KV cache steps)."""
        b, n, _ = h.shape
        q = self.q_proj(h).view(b, n, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        att = attend(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
        return self.o_proj(att.transpose(1, 2).reshape(b, n, -1))


class DreamMLP(nn.Module):
    def __init__(self, cfg: DreamConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_proj(h), self.up_proj(h)))


class DreamBlock(nn.Module):
    """Pre-norm Qwen2 block: x += o_proj(Attn(norm(x))); x += mlp(norm(x))."""

    def __init__(self, cfg: DreamConfig) -> None:
        super().__init__()
        self.self_attn = DreamAttention(cfg)
        self.mlp = DreamMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, bias)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_with(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        x = x + self.self_attn.forward_with(self.input_layernorm(x), cos, sin, attend)
        return x + self.mlp(self.post_attention_layernorm(x))


class DreamModel(nn.Module, LinearHeadLM, ScriptableLM):
    """Dream with the released parameter names: a DiffusionLM (shift included) with a linear head, a span forward and
    its TorchScript twin (engine.models.base protocols)."""

    family = "dream"

    def __init__(self, cfg: DreamConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList([DreamBlock(cfg) for _ in range(cfg.num_hidden_layers)])
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()
        pad = cfg.pad_token_id if cfg.pad_token_id is not None else cfg.eos_token_id
        self.special = SpecialTokens(mask_id=cfg.mask_token_id, eos_id=cfg.eos_token_id, pad_id=pad,
                                     bos_id=cfg.bos_token_id)
        self.vocab_size = cfg.vocab_size
        self.max_sequence_length = cfg.max_position_embeddings

    def tie_weights(self) -> None:
        """Share the embedding with the LM head when the config says so (call again after assigning weights)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def raw_hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[B, L, D] final-norm states before the shift: state i predicts token i+1 (Dream's AR-style head)."""
        if key_padding_mask is None:
            key_padding_mask = torch.ones_like(input_ids, dtype=torch.bool)
        if position_ids is None:
            position_ids = default_position_ids(key_padding_mask)
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(position_ids, self.config.dim_per_head, self.config.rope_theta, x.dtype)
        bias = attention_bias(key_padding_mask, x.dtype)
        for block in self.model.layers:
            x = block(x, cos, sin, bias)
        return self.model.norm(x)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[B, L, D] states aligned with the tokens they predict: out[:, i] = raw[:, i-1], out[:, 0] = raw[:, 0]."""
        raw = self.raw_hidden_states(input_ids, position_ids, key_padding_mask)
        return torch.cat([raw[:, :1], raw[:, :-1]], dim=1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    # ---------------------------------------------------------------- KV cache (engine.kv_pool) and budgeted logits
    # The shift: the state that predicts a block's first token is the raw state of the position just left of the
    # block, so a cached step runs one extra query position on the left of the block.
    kv_query_shift = 1

    def lm_head_weight(self) -> torch.Tensor:
        """[V, D]: logits = hidden @ W^T (no bias, no soft-capping), for the fused budgeted logits path."""
        return self.lm_head.weight

    def hidden_states_kv(self, input_ids, position_ids, key_padding_mask, observe: ObserveFn) -> torch.Tensor:
        """`hidden_states` (same math, shift included) that also hands every layer's rotated q [B,Hq,L,D] and k, v
        [B,Hkv,L,D] to observe(layer, q, k, v): a KV cache Refresh."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(position_ids, self.config.dim_per_head, self.config.rope_theta, x.dtype)
        bias = attention_bias(key_padding_mask, x.dtype)
        for i, block in enumerate(self.model.layers):
            def attend(q, k, v, i=i):
                observe(i, q, k, v)
                return bidirectional_attention(q, k, v, bias)
            x = block.forward_with(x, cos, sin, attend)
        raw = self.model.norm(x)
        return torch.cat([raw[:, :1], raw[:, :-1]], dim=1)

    def scripted_weights(self) -> ScriptedWeights:
        """The tensors of the TorchScript twin of `hidden_states_cached` (engine.models.scripted_forward: the same
        block math as LLaDA's, with the output shift), which the runner starts without the GIL."""
        return ScriptedWeights.of_dream(self)

    def hidden_states_cached(self, input_ids, position_ids, attend: LayerAttendFn) -> torch.Tensor:
        """Shifted hidden states [B, Lq, D] of a span of query tokens (ids and position ids [B, Lq]) whose attention
        is attend(layer, q, k, v) -> [B, Hq, Lq, D] (a KV cache Reuse step): out[:, j] = raw[:, j - 1] predicts the
        span's token j for j >= 1 (out[:, 0] = raw[:, 0], not a prediction of the span's first token)."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(position_ids, self.config.dim_per_head, self.config.rope_theta, x.dtype)
        for i, block in enumerate(self.model.layers):
            x = block.forward_with(x, cos, sin, lambda q, k, v, i=i: attend(i, q, k, v))
        raw = self.model.norm(x)
        return torch.cat([raw[:, :1], raw[:, :-1]], dim=1)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Full [B, L, V] shifted logits: for training and tests; the engine uses hidden_states + logits on rows."""
        return self.logits(self.hidden_states(input_ids, position_ids, key_padding_mask))
