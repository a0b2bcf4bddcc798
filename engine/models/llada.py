"""LLaDA (GSAI-ML/LLaDA-8B-*): a LLaMA-style bidirectional transformer, loaded from its HF checkpoint layout.

Tensor names follow the released checkpoints (`model.transformer.wte`, `...blocks.{i}.q_proj`, ...,
`model.transformer.ln_f`, `model.transformer.ff_out`), so LLaDA-8B and our bundled model load the same way.
Math: pre-norm blocks, x += attn_out(Attn(RoPE(q), RoPE(k), v)); x += ff_out(silu(ff_proj(h)) * up_proj(h)).

Input token shift (config `input_token_shift`, our extension; off in released LLaDA checkpoints): the input of
position i is x_i = wte[t_i] + P wte[t_(i-1)] + N wte[t_(i+1)] + sum_(k=2..K) P_k wte[t_(i-k)] (tensors
`model.transformer.shift_prev`, `shift_next` and, for a window of K > 1 left neighbours (config
`token_shift_left`), `shift_prev{k}`; no bias), the neighbour terms zero at the ends of a sequence. It hands every
position its neighbours' identity from the first layer on, so copying a span ("the token after the one that
follows my left neighbour") is one attention lookup instead of a two-layer induction circuit that a small model
trained on a CPU learns late or never (RWKV's token shift and the "smeared keys" of the induction-head studies are
the same idea). The wider left window serves the first token of a copied value: in `name Ada` -> `"name":"Ada`
the value's first token and its source share their second left neighbour (`name`), not their first. A span
forward (`hidden_states_cached`) gets its boundary neighbours from the caller (`neighbor_ids`, one column per
offset of `neighbor_offsets`).
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
    NeighborTokensLM,
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

# Fields of the released LLaDA config.json that we read, or accept when they hold the value we implement.
_ACCEPTED_AS = {
    "activation_type": {"silu", "swiglu"},
    "alibi": {False},
    "block_type": {"llama", "sequential"},
    "layer_norm_type": {"rms"},
    "rope": {True},
    "attention_layer_norm": {False},
    "scale_logits": {False},
    "multi_query_attention": {None, False},
    "include_bias": {False},
    "bias_for_layer_norm": {None, False},
    "layer_norm_with_affine": {True},
    "block_group_size": {1},
}
# Fields with no effect on inference (training, init, dropout, hub metadata).
_IGNORED = {
    "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "init_device", "init_fn", "init_std", "init_cutoff_factor", "attention_dropout", "residual_dropout",
    "embedding_dropout", "flash_attention", "weight_tying", "clip_qkv", "alibi_bias_max", "mlp_ratio",
    "precision", "input_emb_norm", "attention_type", "_name_or_path",
    "tie_word_embeddings", "bos_token_id", "attention_layer_norm_with_affine",
}


@dataclass
class LLaDAConfig:
    d_model: int
    n_layers: int
    n_heads: int
    mlp_hidden_size: int
    vocab_size: int
    mask_token_id: int
    eos_token_id: int
    n_kv_heads: int | None = None
    embedding_size: int | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_sequence_length: int = 4096
    include_qkv_bias: bool = False
    input_token_shift: bool = False
    token_shift_left: int = 1  # left neighbours mixed into each input (with input_token_shift)
    # RoPE tables and rotation in float32 whatever the weights' dtype (LLaDA's ModelConfig default, set in LLaDA-8B)
    rope_full_precision: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def neighbor_offsets(self) -> tuple[int, ...]:
        """Offsets of the neighbours mixed into each input, in the column order of `neighbor_ids`: the left and
        right neighbour first (the original shift), then the wider left window."""
        if not self.input_token_shift:
            return ()
        return (-1, 1) + tuple(-k for k in range(2, self.token_shift_left + 1))

    @property
    def padded_vocab(self) -> int:
        return self.embedding_size or self.vocab_size

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "LLaDAConfig":
        """Parse config.json, refusing fields we do not know and feature values we do not implement."""
        kwargs, extra = parse_config_fields(cls, raw, family="LLaDA", accepted_as=_ACCEPTED_AS,
                                            ignored=_IGNORED)
        if raw.get("weight_tying"):
            raise CheckpointError("LLaDA config field weight_tying=True is not supported (LLaDA has an untied head)")
        cfg = cls(**kwargs, extra=extra)
        if cfg.token_shift_left < 1:
            raise CheckpointError(f"LLaDA config: token_shift_left must be >= 1, got {cfg.token_shift_left}")
        if cfg.d_model % cfg.n_heads or cfg.n_heads % cfg.kv_heads:
            raise CheckpointError(f"LLaDA config: d_model={cfg.d_model}, n_heads={cfg.n_heads}, "
                                  f"n_kv_heads={cfg.kv_heads} do not divide evenly")
        return cfg

    def to_dict(self) -> dict[str, Any]:
        """A config.json in the released LLaDA layout."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "extra"}
        if not self.input_token_shift:
            del out["input_token_shift"]  # a released LLaDA config has no such field
        if not self.input_token_shift or self.token_shift_left == 1:
            del out["token_shift_left"]
        out.update({"model_type": "llada", "architectures": ["LLaDAModelLM"], "activation_type": "silu",
                    "block_type": "llama", "layer_norm_type": "rms", "rope": True, "alibi": False,
                    "weight_tying": False, "include_bias": False})
        return out


def row_neighbor_ids(input_ids: torch.Tensor, key_padding_mask: torch.Tensor | None,
                     offsets: tuple[int, ...] = (-1, 1)) -> torch.Tensor:
    """[B, L, len(offsets)]: the id at position i + offset of every position i of whole rows (-1 beyond the ends
    of a row's real tokens: padding is nobody's neighbour)."""
    ids = input_ids if key_padding_mask is None else input_ids.masked_fill(~key_padding_mask, -1)
    w = max(abs(o) for o in offsets)
    none = torch.full_like(input_ids[:, :w], -1)
    padded = torch.cat([none, ids, none], dim=1)  # padded[:, i + w] = ids[:, i]
    length = ids.shape[1]
    return torch.stack([padded[:, w + o:w + o + length] for o in offsets], dim=-1)


class LLaDABlock(nn.Module):
    def __init__(self, cfg: LLaDAConfig) -> None:
        super().__init__()
        d, hd = cfg.d_model, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = cfg.n_heads, cfg.kv_heads, hd
        self.attn_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.ff_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(d, cfg.n_heads * hd, bias=cfg.include_qkv_bias)
        self.k_proj = nn.Linear(d, cfg.kv_heads * hd, bias=cfg.include_qkv_bias)
        self.v_proj = nn.Linear(d, cfg.kv_heads * hd, bias=cfg.include_qkv_bias)
        self.attn_out = nn.Linear(cfg.n_heads * hd, d, bias=False)
        self.ff_proj = nn.Linear(d, cfg.mlp_hidden_size, bias=False)
        self.up_proj = nn.Linear(d, cfg.mlp_hidden_size, bias=False)
        self.ff_out = nn.Linear(cfg.mlp_hidden_size, d, bias=False)

    def qkv(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Projected, rotated q [B,Hq,L,D] and k/v [B,Hkv,L,D] for the normed input h."""
        b, n, _ = h.shape
        q = self.q_proj(h).view(b, n, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        q, k, v = self.qkv(self.attn_norm(x), cos, sin)
        att = bidirectional_attention(q, k, v, bias)
        b, _, n, _ = att.shape
        x = x + self.attn_out(att.transpose(1, 2).reshape(b, n, -1))
        h = self.ff_norm(x)
        return x + self.ff_out(swiglu(self.ff_proj(h), self.up_proj(h)))

    def forward_with(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        """`forward` with the attention supplied by the caller: attend(q, k, v) -> [B, Hq, L, D] (KV cache steps)."""
        q, k, v = self.qkv(self.attn_norm(x), cos, sin)
        att = attend(q, k, v)
        b, _, n, _ = att.shape
        x = x + self.attn_out(att.transpose(1, 2).reshape(b, n, -1))
        h = self.ff_norm(x)
        return x + self.ff_out(swiglu(self.ff_proj(h), self.up_proj(h)))


class LLaDAModel(nn.Module, LinearHeadLM, NeighborTokensLM, ScriptableLM):
    """LLaDA with the released parameter names: a DiffusionLM with a linear head, a span forward (with neighbour
    ids under the input token shift) and its TorchScript twin (engine.models.base protocols)."""

    family = "llada"

    def __init__(self, cfg: LLaDAConfig) -> None:
        super().__init__()
        self.config = cfg
        transformer = nn.ModuleDict({
            "wte": nn.Embedding(cfg.padded_vocab, cfg.d_model),
            "blocks": nn.ModuleList([LLaDABlock(cfg) for _ in range(cfg.n_layers)]),
            "ln_f": RMSNorm(cfg.d_model, cfg.rms_norm_eps),
            "ff_out": nn.Linear(cfg.d_model, cfg.padded_vocab, bias=False),
        })
        if cfg.input_token_shift:
            transformer["shift_prev"] = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
            transformer["shift_next"] = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
            for k in range(2, cfg.token_shift_left + 1):
                transformer[f"shift_prev{k}"] = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.model = nn.Module()
        self.model.transformer = transformer
        pad = cfg.pad_token_id if cfg.pad_token_id is not None else cfg.eos_token_id
        self.special = SpecialTokens(mask_id=cfg.mask_token_id, eos_id=cfg.eos_token_id, pad_id=pad,
                                     bos_id=cfg.bos_token_id)
        self.vocab_size = cfg.padded_vocab
        self.max_sequence_length = cfg.max_sequence_length

    @property
    def transformer(self) -> nn.ModuleDict:
        return self.model.transformer

    @property
    def neighbor_offsets(self) -> tuple[int, ...]:
        """The offset of each column of `neighbor_ids` (empty without the input token shift)."""
        return self.config.neighbor_offsets

    def rope_dtype(self, x: torch.Tensor) -> torch.dtype:
        """The dtype of the RoPE tables and rotation: float32 under rope_full_precision, else the activations'."""
        return torch.float32 if self.config.rope_full_precision else x.dtype

    def embed(self, input_ids: torch.Tensor, neighbor_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Input vectors [B, L, D] of ids [B, L]; with the input token shift, neighbor_ids [B, L, N] holds each
        position's neighbour ids at `neighbor_offsets` (-1: none, contributing zero)."""
        wte = self.transformer["wte"]
        x = wte(input_ids)
        if not self.config.input_token_shift:
            return x
        if neighbor_ids is None:
            raise ValueError("a model with an input token shift needs neighbor_ids")
        present = (neighbor_ids >= 0).unsqueeze(-1)
        nb = wte(neighbor_ids.clamp_min(0)) * present.to(x.dtype)  # [B, L, N, D]
        x = x + self.transformer["shift_prev"](nb[:, :, 0]) + self.transformer["shift_next"](nb[:, :, 1])
        for col, k in enumerate(range(2, self.config.token_shift_left + 1), start=2):
            x = x + self.transformer[f"shift_prev{k}"](nb[:, :, col])
        return x

    def hidden_states(self, input_ids, position_ids=None, key_padding_mask=None):
        if key_padding_mask is None:
            key_padding_mask = torch.ones_like(input_ids, dtype=torch.bool)
        if position_ids is None:
            position_ids = default_position_ids(key_padding_mask)
        x = self.embed(input_ids, row_neighbor_ids(input_ids, key_padding_mask, self.neighbor_offsets)
                       if self.config.input_token_shift else None)
        cos, sin = rope_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta, self.rope_dtype(x))
        bias = attention_bias(key_padding_mask, x.dtype)
        for block in self.transformer["blocks"]:
            x = block(x, cos, sin, bias)
        return self.transformer["ln_f"](x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.transformer["ff_out"](hidden)

    # ---------------------------------------------------------------- KV cache (engine.kv_pool) and budgeted logits
    kv_query_shift = 0  # hidden state i predicts token i: a block's queries are exactly its positions

    def lm_head_weight(self) -> torch.Tensor:
        """[V, D]: logits = hidden @ W^T (no bias, no soft-capping), for the fused budgeted logits path."""
        return self.transformer["ff_out"].weight

    def hidden_states_kv(self, input_ids, position_ids, key_padding_mask, observe: ObserveFn) -> torch.Tensor:
        """`hidden_states` (same math) that also hands every layer's rotated q [B,Hq,L,D] and k, v [B,Hkv,L,D] to
        observe(layer, q, k, v): a KV cache Refresh."""
        x = self.embed(input_ids, row_neighbor_ids(input_ids, key_padding_mask, self.neighbor_offsets)
                       if self.config.input_token_shift else None)
        cos, sin = rope_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta, self.rope_dtype(x))
        bias = attention_bias(key_padding_mask, x.dtype)
        for i, block in enumerate(self.transformer["blocks"]):
            def attend(q, k, v, i=i):
                observe(i, q, k, v)
                return bidirectional_attention(q, k, v, bias)
            x = block.forward_with(x, cos, sin, attend)
        return self.transformer["ln_f"](x)

    def scripted_weights(self) -> ScriptedWeights:
        """The tensors of the TorchScript twin of `hidden_states_cached` (engine.models.scripted_forward), which the
        runner starts without the GIL."""
        return ScriptedWeights.of(self)

    def hidden_states_cached(self, input_ids, position_ids, attend: LayerAttendFn,
                             neighbor_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states [B, Lq, D] of a span of query tokens (ids and position ids [B, Lq]) whose attention
        is attend(layer, q, k, v) -> [B, Hq, Lq, D], the KV cache's Reuse step (cached keys plus the fresh k, v).
        neighbor_ids [B, Lq, 2]: each query token's neighbours in its own sequence (needed with the input token
        shift: a span's first and last tokens have neighbours outside it)."""
        x = self.embed(input_ids, neighbor_ids)
        cos, sin = rope_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta, self.rope_dtype(x))
        for i, block in enumerate(self.transformer["blocks"]):
            x = block.forward_with(x, cos, sin, lambda q, k, v, i=i: attend(i, q, k, v))
        return self.transformer["ln_f"](x)

    def forward(self, input_ids, position_ids=None, key_padding_mask=None) -> torch.Tensor:
        """Full [B, L, V] logits: for training and tests; the engine uses hidden_states + logits on rows."""
        return self.logits(self.hidden_states(input_ids, position_ids, key_padding_mask))
