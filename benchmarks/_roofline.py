"""Roofline cost of one denoising step (FLOPs and HBM bytes) for a LLaDA-8B-shaped model, per cache setting:
what a GPU's peak compute and bandwidth allow, against which the measured CPU figures cannot be read directly.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelDims:
    d_model: int = 4096  # LLaDA-8B
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 32
    mlp: int = 12288
    vocab: int = 126464

    @property
    def layer_params(self) -> int:
        hd = self.d_model // self.n_heads
        attn = 2 * self.d_model * self.d_model + 2 * self.d_model * self.n_kv_heads * hd
        return attn + 3 * self.d_model * self.mlp

    @property
    def kv_bytes_per_token(self) -> int:  # K and V of every layer, bf16
        return 2 * self.n_layers * self.n_kv_heads * (self.d_model // self.n_heads) * 2


def step_cost(dims: ModelDims, batch: int, prompt: int, canvas: int, block: int, kind: str,
              keep_ratio: float = 1.0, rows: int | None = None) -> tuple[float, float]:
    """(FLOPs, HBM bytes) of one denoising step of `batch` requests, bf16 weights and activations.

    kind: "full" (the reference loop: whole sequence, logits for every position), "refresh" (whole sequence, K/V
    written to the cache, logits for the committable rows only), "reuse" (the block against the cached K/V).
    rows: committable rows per request projected through the LM head (default: the whole block).
    Counted: the matmul FLOPs (2 per multiply-add) of the projections, attention (QK^T and PV) and LM head; bytes:
    the weights read once per step, the KV cache read/written, the logits written (full) and the hidden states in
    and out of each layer (small). Norms, RoPE, softmax and the embedding gather are left out (< 2%).
    """
    n = prompt + canvas
    rows = block if rows is None else rows
    d, L, hd = dims.d_model, dims.n_layers, dims.d_model // dims.n_heads
    wbytes = 2 * dims.layer_params * L
    head_bytes = 2 * dims.vocab * d
    if kind in ("full", "refresh"):
        tokens, keys = n, n
    elif kind == "reuse":
        tokens, keys = block, block + keep_ratio * (n - block)
    else:
        raise ValueError(kind)
    flops = 2 * dims.layer_params * L * tokens * batch  # projections and MLP
    flops += 4 * L * dims.n_heads * hd * tokens * keys * batch  # QK^T and PV
    logit_rows = n if kind == "full" else rows
    flops += 2 * d * dims.vocab * logit_rows * batch
    nbytes = wbytes + head_bytes
    kv = dims.kv_bytes_per_token
    if kind == "refresh":
        nbytes += kv * n * batch  # written
    elif kind == "reuse":
        nbytes += kv * keys * batch + kv * block * batch  # read (kept keys + fresh block) and the block written
    else:
        nbytes += kv * n * batch  # activations K/V pass through HBM once even without a cache
    nbytes += 2 * 2 * d * L * tokens * batch  # layer inputs/outputs
    if kind == "full":
        nbytes += 2 * dims.vocab * n * batch  # bf16 logits of every position written (and read by softmax)
    return float(flops), float(nbytes)


def roofline_table(peak_flops: float = 989e12, bandwidth: float = 3.35e12) -> str:
    """Roofline time per step (max(FLOPs / peak, bytes / bandwidth)) for LLaDA-8B on an H100 SXM (bf16)."""
    dims = ModelDims()
    lines = [f"LLaDA-8B: {dims.layer_params * dims.n_layers / 1e9:.2f}B layer parameters "
             f"({2 * dims.layer_params * dims.n_layers / 1e9:.1f} GB bf16), LM head {dims.vocab} x {dims.d_model} "
             f"({2 * dims.vocab * dims.d_model / 1e9:.2f} GB), KV cache {dims.kv_bytes_per_token / 1024:.0f} KiB per "
             f"token; H100 SXM {peak_flops / 1e12:.0f} TFLOP/s bf16 dense, {bandwidth / 1e12:.2f} TB/s: ridge "
             f"{peak_flops / bandwidth:.0f} FLOP/byte", "",
             "| batch | prompt+canvas | block | step | TFLOP | GB moved | FLOP/byte | bound | roofline ms | "
             "vs full |", "|---:|---:|---:|---|---:|---:|---:|---|---:|---:|"]
    for batch, prompt, canvas, block in [(1, 256, 256, 32), (1, 1024, 1024, 32), (16, 256, 256, 32),
                                         (16, 1024, 1024, 32), (64, 256, 256, 32)]:
        base = None
        for kind, keep in [("full", 1.0), ("refresh", 1.0), ("reuse", 1.0), ("reuse", 0.25)]:
            f, b = step_cost(dims, batch, prompt, canvas, block, kind, keep)
            t = max(f / peak_flops, b / bandwidth)
            base = base or t
            bound = "compute" if f / peak_flops >= b / bandwidth else "memory"
            name = kind if keep == 1.0 else f"reuse, keep {keep}"
            lines.append(f"| {batch} | {prompt}+{canvas} | {block} | {name} | {f / 1e12:.2f} | {b / 1e9:.1f} | "
                         f"{f / b:.0f} | {bound} | {t * 1e3:.2f} | {base / t:.1f}x |")
    return "\n".join(lines)
