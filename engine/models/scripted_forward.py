"""LLaDA's (and Dream's) packed span forward in TorchScript, run on torch's inter-op thread pool: a forward that does
not hold the GIL, so the step's mask threads run beside it (engine.mask_workers; on a CPU host the eager forward is a
few hundred small torch calls that each take the GIL, and beside a Python thread they convoy).

  span_forward         the same math as `ModelRunner._packed_forward` with `hidden_states_cached` (LLaDA, or Dream:
                       q/k/v biases and the output shifted right by one row) and the dense KV pool, the same aten
                       operations in the same order (bitwise the same hidden states): the step's rows, each layer's
                       keys/values written into the pool slots, then ONE grouped varlen attention
                       (kernels.varlen_attention.grouped_attention) over the step's metadata
                       (engine.attention_step.StepAttention); without a cache the keys are the step's own rows
  ScriptedWeights      the model's tensors in the flat layout the function takes
  start_span_forward   the forward started with `torch.jit.fork`; `RunningForward.wait()` releases the GIL
  pin                  every tensor handed to the forked forward gets one more C++ reference for the duration:
                       otherwise the inter-op thread drops the last-but-one reference of a Python-held tensor and
                       waits for the GIL to Py_DECREF it (measured: 107 ms instead of 7 for a bundled-model forward
                       beside a thread spinning in Python)
"""
from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from dllm_constrain.kernels.varlen_attention import grouped_attention



@dataclass(frozen=True)
class ScriptedWeights:
    """The model's tensors in the flat layout the scripted forward takes (views of the parameters, not copies)."""

    wte: torch.Tensor
    shifts: list[torch.Tensor]  # one [D, D] weight per neighbour column (empty without the input token shift)
    layers: list[list[torch.Tensor]]  # attn_norm, q, k, v, attn_out, ff_norm, ff_proj, up_proj, ff_out
    biases: list[list[torch.Tensor]]  # q, k, v biases per layer (empty lists without include_qkv_bias)
    ln_f: torch.Tensor
    eps: float
    n_heads: int
    n_kv: int
    head_dim: int
    theta: float
    shift_output: bool = False  # Dream: row i of the output is the final state of row i - 1 (row 0 keeps its own)
    rope_fp32: bool = False  # LLaDA's rope_full_precision: RoPE tables and rotation in float32
    pinned: Any = field(default=None, compare=False, repr=False)  # C++-side references to every tensor above

    def __post_init__(self) -> None:
        tensors = [self.wte, self.ln_f, *self.shifts, *(t for ts in self.layers + self.biases for t in ts)]
        object.__setattr__(self, "pinned", pin(tensors))

    @classmethod
    def of_dream(cls, model: Any) -> "ScriptedWeights":
        """The tensors of a `DreamModel` (Qwen2 layout) in the same flat layout."""
        cfg = model.config
        layers, biases = [], []
        for blk in model.model.layers:
            att, mlp = blk.self_attn, blk.mlp
            layers.append([blk.input_layernorm.weight, att.q_proj.weight, att.k_proj.weight, att.v_proj.weight,
                           att.o_proj.weight, blk.post_attention_layernorm.weight, mlp.gate_proj.weight,
                           mlp.up_proj.weight, mlp.down_proj.weight])
            biases.append([att.q_proj.bias, att.k_proj.bias, att.v_proj.bias])
        return cls(model.model.embed_tokens.weight, [], layers, biases, model.model.norm.weight,
                   float(cfg.rms_norm_eps), cfg.num_attention_heads, cfg.kv_heads, cfg.dim_per_head,
                   float(cfg.rope_theta), shift_output=True)

    @classmethod
    def of(cls, model: Any) -> "ScriptedWeights":
        """The tensors of a `LLaDAModel`."""
        cfg, tr = model.config, model.transformer
        shifts: list[torch.Tensor] = []
        if cfg.input_token_shift:
            shifts = [tr["shift_prev"].weight, tr["shift_next"].weight]
            shifts += [tr[f"shift_prev{k}"].weight for k in range(2, cfg.token_shift_left + 1)]
        layers, biases = [], []
        for blk in tr["blocks"]:
            layers.append([blk.attn_norm.weight, blk.q_proj.weight, blk.k_proj.weight, blk.v_proj.weight,
                           blk.attn_out.weight, blk.ff_norm.weight, blk.ff_proj.weight, blk.up_proj.weight,
                           blk.ff_out.weight])
            biases.append([] if blk.q_proj.bias is None else [blk.q_proj.bias, blk.k_proj.bias, blk.v_proj.bias])
        return cls(tr["wte"].weight, shifts, layers, biases, tr["ln_f"].weight, float(cfg.rms_norm_eps),
                   cfg.n_heads, cfg.kv_heads, cfg.head_dim, float(cfg.rope_theta),
                   rope_fp32=bool(cfg.rope_full_precision))


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (w.float() * x32).to(dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    xr = x.to(cos.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
    return (xr * cos + rotated * sin).to(x.dtype)


def _linear(x: torch.Tensor, w: torch.Tensor, b: list[torch.Tensor], i: int) -> torch.Tensor:
    if len(b) == 0:
        return F.linear(x, w)
    return F.linear(x, w, b[i])


def _embed(ids: torch.Tensor, neighbors: torch.Tensor, wte: torch.Tensor, shifts: list[torch.Tensor]) -> torch.Tensor:
    x = F.embedding(ids, wte)
    if len(shifts) > 0:
        present = (neighbors >= 0).unsqueeze(-1)
        nb = F.embedding(neighbors.clamp_min(0), wte) * present.to(x.dtype)
        x = x + F.linear(nb[:, :, 0], shifts[0]) + F.linear(nb[:, :, 1], shifts[1])
        for col in range(2, len(shifts)):
            x = x + F.linear(nb[:, :, col], shifts[col])
    return x


def span_forward(ids: torch.Tensor, pos: torch.Tensor, neighbors: torch.Tensor, wte: torch.Tensor,
                 shifts: list[torch.Tensor], layers: list[list[torch.Tensor]], biases: list[list[torch.Tensor]],
                 ln_f: torch.Tensor, eps: float, n_heads: int, n_kv: int, head_dim: int, theta: float,
                 shift_output: bool, rope_fp32: bool, q_index: list[torch.Tensor],
                 key_index: list[torch.Tensor], key_bias: list[torch.Tensor], out_index: torch.Tensor,
                 counts: list[int], group_rows: list[int], group_keys: list[int], write_slots: torch.Tensor, total: int, pool_k: list[torch.Tensor],
                 pool_v: list[torch.Tensor]) -> torch.Tensor:
    """Hidden states [1, T, D] of the packed rows. ids, pos [1, T]; neighbors [1, T, N] (N = len(shifts)); the
    step's attention metadata (kernels.varlen_attention.VarlenLayout's grouped path); write_slots [total]: the pool
    slot of each real row; pool_k / pool_v: the pool's per-layer [Hkv, S, D] tensors, written in place (empty: no
    cache, the keys are the step's own rows)."""
    x = _embed(ids, neighbors, wte, shifts)
    inv_freq = 1.0 / torch.pow(theta, torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32)
                               / head_dim)
    freqs = pos.to(torch.float32).unsqueeze(-1) * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    rope_dtype = torch.float32 if rope_fp32 else x.dtype
    cos = emb.cos().to(rope_dtype).unsqueeze(1)
    sin = emb.sin().to(rope_dtype).unsqueeze(1)
    b, n = ids.shape[0], ids.shape[1]
    scale = 1.0 / math.sqrt(float(head_dim))
    for layer in range(len(layers)):
        w = layers[layer]
        bias = biases[layer]
        h = _rms_norm(x, w[0], eps)
        q = _rope(_linear(h, w[1], bias, 0).view(b, n, n_heads, head_dim).transpose(1, 2), cos, sin)
        k = _rope(_linear(h, w[2], bias, 1).view(b, n, n_kv, head_dim).transpose(1, 2), cos, sin)
        v = _linear(h, w[3], bias, 2).view(b, n, n_kv, head_dim).transpose(1, 2)
        if len(pool_k) > 0:
            keys, values = pool_k[layer], pool_v[layer]
            keys.index_copy_(1, write_slots, k[0, :, :total].to(keys.dtype))
            values.index_copy_(1, write_slots, v[0, :, :total].to(values.dtype))
        else:
            keys, values = k[0], v[0]
        att = grouped_attention(q[0], keys, values, q_index, key_index, key_bias, out_index, counts, group_rows,
                                group_keys, scale).unsqueeze(0)
        x = x + F.linear(att.transpose(1, 2).reshape(b, n, -1), w[4])
        h = _rms_norm(x, w[5], eps)
        x = x + F.linear(F.silu(F.linear(h, w[6])) * F.linear(h, w[7]), w[8])
    out = _rms_norm(x, ln_f, eps)
    if shift_output:
        out = torch.cat([out[:, :1], out[:, :-1]], dim=1)
    return out


def _hold(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return tensors


def _pin_list(tensors: list[torch.Tensor]) -> torch.jit.Future[list[torch.Tensor]]:
    return torch.jit.fork(_hold, tensors)


@functools.cache
def _pinner() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(_pin_list)


def pin(tensors: list[torch.Tensor]) -> Any:
    """An object that holds a C++-side reference to each of `tensors` for as long as it lives (see "Pinning" above):
    a TorchScript future whose value is the list (the list is referenced from C++ from the call on)."""
    return _pinner()(tensors)


@dataclass
class RunningForward:
    """A started forward: `wait()` (which releases the GIL while it waits) gives `span_forward`'s hidden states; the call's
    tensors stay pinned until then."""

    future: Any
    pinned: Any

    def wait(self) -> torch.Tensor:
        out = self.future.wait()
        self.pinned = None
        return out


@functools.cache
def _launcher() -> Any:
    """`launch(...)`: `span_forward` started on the inter-op pool, returning a Future (compiled once per process, on
    first use: scripting takes a fraction of a second). TorchScript is deprecated in favour of torch.compile, which
    offers no forward that runs without the GIL; the warning is silenced here, where that is the point."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return _script_launcher()


def _script_launcher() -> Any:
    forward = torch.jit.script(span_forward)

    def launch(ids: torch.Tensor, pos: torch.Tensor, neighbors: torch.Tensor, wte: torch.Tensor,
               shifts: list[torch.Tensor], layers: list[list[torch.Tensor]], biases: list[list[torch.Tensor]],
               ln_f: torch.Tensor, eps: float, n_heads: int, n_kv: int, head_dim: int, theta: float,
               shift_output: bool, rope_fp32: bool, q_index: list[torch.Tensor], key_index: list[torch.Tensor],
               key_bias: list[torch.Tensor], out_index: torch.Tensor, counts: list[int], group_rows: list[int],
               group_keys: list[int], write_slots: torch.Tensor, total: int, pool_k: list[torch.Tensor],
               pool_v: list[torch.Tensor]) -> torch.jit.Future[torch.Tensor]:
        return torch.jit.fork(forward, ids, pos, neighbors, wte, shifts, layers, biases, ln_f, eps, n_heads,
                              n_kv, head_dim, theta, shift_output, rope_fp32, q_index, key_index, key_bias,
                              out_index, counts, group_rows, group_keys, write_slots, total, pool_k, pool_v)

    return torch.jit.script(launch)


def start_span_forward(weights: ScriptedWeights, ids: torch.Tensor, pos: torch.Tensor, neighbors: torch.Tensor,
                       step: Any, pool_k: list[torch.Tensor], pool_v: list[torch.Tensor]) -> RunningForward:
    """Start the forward on the inter-op pool (its tensors pinned: see the module docstring). `step`: the step's
    engine.attention_step.StepAttention; pool_k / pool_v: the KV pool's layer tensors (empty without a cache)."""
    w, lay = weights, step.layout
    slots = step.write_slots if step.write_slots is not None else torch.zeros(0, dtype=torch.long)
    tensors = [*lay.q_index, *lay.key_index, *lay.key_bias, lay.out_index, slots]
    pinned = pin([ids, pos, neighbors, *tensors, *pool_k, *pool_v])
    future = _launcher()(ids, pos, neighbors, w.wte, w.shifts, w.layers, w.biases, w.ln_f, w.eps, w.n_heads, w.n_kv,
                         w.head_dim, w.theta, w.shift_output, w.rope_fp32, lay.q_index, lay.key_index, lay.key_bias,
                         lay.out_index, lay.counts, lay.group_rows, lay.group_keys, slots, step.total, pool_k, pool_v)
    return RunningForward(future, pinned)
