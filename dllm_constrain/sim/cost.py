"""What a step costs on a virtual clock: a model shape, a device's public peak figures, and the work the engine
issues for the step's real rows.

A step is the list of its forward's segments (engine.model_runner.Segment: a Refresh is the request's whole
sequence, a Reuse its query span against its cached keys/values) plus the open rows each request projects through
the LM head. Its cost has three parts:

  device   max(FLOPs / (peak * compute_efficiency), bytes / (bandwidth * bandwidth_efficiency)): FLOPs of the
           linear layers (2 * weights per row), of attention (4 * rows * keys * heads * head_dim per layer) and
           of the LM head over the projected rows; bytes of the weights (once per step), of every request's KV
           cache (a Reuse reads its sequence's keys/values, a Refresh writes them) and of the LM head (once per
           request per step: engine.logits projects each request's rows apart);
  launch   the kernels the engine issues, counted from the code (`OPS_PER_*` below); eager PyTorch issues them
           from the host, so a step takes at least launches * launch_s;
  host     per request per step, the engine's Python (policy, commits, bookkeeping), after the forward.

A step's time is max(device, launch) + host. `RooflineCost` is this model for a GPU; `LinearCost` is the CPU model
fitted on measured CPU step times (dllm_constrain.sim.calibrate), over the same counted features.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

OPS_PER_LAYER = 41  # packed projections, norms, RoPE, SwiGLU, residuals (engine/models/layers.py, llada.py)
OPS_PER_REQUEST_LAYER = 4  # a request's attention in the per-request loop: cache write(s), attention, copy out
OPS_PER_REQUEST_LOGITS = 8  # a request's logits chunk: gather rows, project, mask, statistics


@dataclass(frozen=True)
class ModelShape:
    """The dimensions a step's cost depends on (dense, bf16 unless dtype_bytes says otherwise)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    mlp: int
    vocab: int
    dtype_bytes: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_weights(self) -> int:
        """Weights of one transformer layer: q, k, v, o projections and the SwiGLU MLP."""
        hd = self.head_dim
        return self.hidden * hd * (2 * self.heads + 2 * self.kv_heads) + 3 * self.hidden * self.mlp

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (keys, values) * layers * kv_heads * head_dim * dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes(self, tokens: int) -> int:
        return self.kv_bytes_per_token * tokens

    @staticmethod
    def from_model(model: Any, name: str = "model") -> "ModelShape":
        """The shape of a loaded LLaDA or Dream model (its config's fields), at its parameters' dtype."""
        cfg = model.config
        layers = getattr(cfg, "n_layers", None) or cfg.num_hidden_layers
        hidden = getattr(cfg, "d_model", None) or cfg.hidden_size
        heads = getattr(cfg, "n_heads", None) or cfg.num_attention_heads
        mlp = getattr(cfg, "mlp_hidden_size", None) or cfg.intermediate_size
        dtype = next(model.parameters()).element_size()
        return ModelShape(name, layers, hidden, heads, cfg.kv_heads, mlp, int(model.vocab_size), dtype)


# LLaDA-8B (GSAI-ML/LLaDA-8B-Instruct config.json: 32 layers, d_model 4096, 32 heads, MHA, mlp 12288,
# vocab 126464); Dream-7B (Dream-org/Dream-v0-Instruct-7B: the Qwen2.5-7B shape, 28 layers, hidden 3584, 28 heads,
# 4 KV heads, intermediate 18944, vocab 152064)
SHAPES = {
    "llada-8b": ModelShape("llada-8b", 32, 4096, 32, 32, 12288, 126464),
    "dream-7b": ModelShape("dream-7b", 28, 3584, 28, 4, 18944, 152064),
}


@dataclass(frozen=True)
class Hardware:
    """A device's public peak figures (dense bf16 tensor FLOP/s, memory bandwidth) and the host costs of driving
    it from eager PyTorch."""

    name: str
    peak_flops: float
    bandwidth: float  # bytes / s
    compute_efficiency: float = 0.7  # assumption: a large bf16 GEMM reaches ~70% of the datasheet peak
    bandwidth_efficiency: float = 0.85  # assumption: streaming reads reach ~85% of the datasheet bandwidth
    launch_s: float = 6e-6  # assumption: eager PyTorch's per-op dispatch on a server host
    host_per_request_s: float = 150e-6  # assumption: the engine's per-request Python per step (see docs/serving.md)


# datasheets: H100 SXM 989 TFLOP/s dense bf16, 3.35 TB/s HBM3; H200 SXM 989 TFLOP/s, 4.8 TB/s HBM3e; L40S
# 362 TFLOP/s dense bf16 (733 with sparsity), 864 GB/s; RTX 4090 165 TFLOP/s dense bf16 with fp32 accumulate
# (330 with fp16 accumulate), 1008 GB/s
HARDWARE = {
    "h100": Hardware("h100", 989e12, 3.35e12),
    "h200": Hardware("h200", 989e12, 4.8e12),
    "l40s": Hardware("l40s", 362e12, 0.864e12),
    "rtx4090": Hardware("rtx4090", 165e12, 1.008e12),
}


@dataclass(frozen=True)
class SegmentWork:
    """One request's part of a step: its forward rows, the keys its rows attend to (its whole sequence), whether
    it refreshes, and the open rows it projects through the LM head."""

    rows: int
    keys: int
    refresh: bool
    logit_rows: int


@dataclass(frozen=True)
class StepFeatures:
    """The counted work of one step (the features both cost models read)."""

    linear_flops: float
    attention_flops: float
    head_flops: float
    weight_bytes: float
    kv_bytes: float
    head_bytes: float
    launches: int
    requests: int
    rows: int

    @property
    def flops(self) -> float:
        return self.linear_flops + self.attention_flops + self.head_flops

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.head_bytes


@dataclass(frozen=True)
class Kernels:
    """How the engine issues a step's work. The defaults are what it does today; the others price what-ifs it does
    not do: one LM head projection over every request's rows (the head read once per step, one launch group), and
    one varlen attention launch group per layer for all requests instead of the per-request loop."""

    head_per_request: bool = True
    attention_per_request: bool = True


def step_features(shape: ModelShape, work: Sequence[SegmentWork], kernels: Kernels = Kernels()) -> StepFeatures:
    """Count a step's FLOPs, bytes and kernel launches from its segments (see the module docstring)."""
    rows = sum(w.rows for w in work)
    per_layer_attn = sum(4 * w.rows * w.keys * shape.heads * shape.head_dim for w in work)
    kv_elems = sum(w.keys for w in work)  # a Reuse reads, a Refresh writes, the request's whole sequence
    logit_rows = sum(w.logit_rows for w in work)
    with_logits = sum(1 for w in work if w.logit_rows)
    b = len(work)
    heads = with_logits if kernels.head_per_request else min(1, with_logits)
    attention_groups = b if kernels.attention_per_request else min(1, b)
    return StepFeatures(
        linear_flops=2.0 * rows * shape.layers * shape.layer_weights,
        attention_flops=float(per_layer_attn * shape.layers),
        head_flops=2.0 * logit_rows * shape.hidden * shape.vocab,
        weight_bytes=float(shape.layers * shape.layer_weights * shape.dtype_bytes) if b else 0.0,
        kv_bytes=float(shape.kv_bytes(kv_elems)),
        head_bytes=float(heads * shape.vocab * shape.hidden * shape.dtype_bytes),
        launches=(shape.layers * (OPS_PER_LAYER + OPS_PER_REQUEST_LAYER * attention_groups)
                  + OPS_PER_REQUEST_LOGITS * heads if b else 0),
        requests=b,
        rows=rows,
    )


@dataclass(frozen=True)
class StepTime:
    """A step's modelled time and its device-busy part."""

    seconds: float
    device_s: float


class CostModel(Protocol):
    """Seconds of one step from its counted work."""

    def step_time(self, features: StepFeatures) -> StepTime: ...


@dataclass(frozen=True)
class RooflineCost:
    """The GPU model: max(device roofline, launches) + per-request host time."""

    hardware: Hardware

    def step_time(self, f: StepFeatures) -> StepTime:
        hw = self.hardware
        if not f.requests:
            return StepTime(0.0, 0.0)
        device = max(f.flops / (hw.peak_flops * hw.compute_efficiency),
                     f.bytes / (hw.bandwidth * hw.bandwidth_efficiency))
        launch = f.launches * hw.launch_s
        return StepTime(max(device, launch) + f.requests * hw.host_per_request_s, device)


LINEAR_FEATURES = ("const", "linear_flops", "attention_flops", "head_flops", "bytes", "launches", "requests")


def linear_row(f: StepFeatures) -> list[float]:
    """The regressors of `LinearCost`, in LINEAR_FEATURES order."""
    return [1.0, f.linear_flops, f.attention_flops, f.head_flops, f.bytes, float(f.launches), float(f.requests)]


@dataclass(frozen=True)
class LinearCost:
    """The CPU model: a step takes sum(coef * feature) seconds over LINEAR_FEATURES, the coefficients fitted on
    measured CPU steps (non-negative least squares, dllm_constrain.sim.calibrate). On the CPU nothing overlaps:
    the forward, the op dispatch and the engine's Python run one after the other, so the terms add up."""

    coefficients: tuple[float, ...]
    name: str = "cpu"

    def step_time(self, f: StepFeatures) -> StepTime:
        if not f.requests:
            return StepTime(0.0, 0.0)
        x = linear_row(f)
        total = sum(c * v for c, v in zip(self.coefficients, x))
        host = self.coefficients[-1] * f.requests + self.coefficients[0]
        return StepTime(max(total, 0.0), max(total - host, 0.0))
