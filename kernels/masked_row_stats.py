"""Fused grammar-mask application and per-row reductions of logits: token, probability, entropy, margin.

For a row of logits l over V tokens and an allowed set A: x_j = l_j if j in A else -inf (masking before any softmax),
p = softmax(x) (temperature-free, as LLaDA's confidence), token = argmax_j x_j at T = 0, argmax_j (x_j / T + g_j)
in float64 at T > 0 (Gumbel-max; ties to the lowest index, as torch.argmax), prob = p_token, entropy = log S -
(sum_j (x_j - m) e^{x_j - m}) / S, margin = p_(1) - p_(2) (p_(1) when |A| = 1), with m = max x and S = sum e^{x - m}.
A row with no allowed token gets token -1, prob 0, entropy +inf, margin 0 (the engine never commits it).

Noise g is the caller's (`noise=`: the engine's head pass hashes it per row, kernels.hashed_noise) or drawn from
the caller's generator on the logits' device (`gumbel_noise`), float64 on the CPU and float32 elsewhere.
Masks use xgrammar's packed layout, int32 [rows, ceil(V / 32)] (kernels.bitmask, re-exported here); bool [rows, V]
masks are accepted too. This module is the one implementation of the math: the torch reference (one reused
workspace, `RowStatsWorkspace`) on the CPU, the Triton kernels on CUDA, which stream each row's vocabulary in tiles
with an online (max, sum-exp, sum (x - m) exp) state, the running best score and the top-2 logits, so each logit is
read once (`masked_row_stats`) or never written at all (`masked_row_stats_from_hidden`: logits tiles computed in
registers from hidden [rows, D] and the LM head [V, D]); vocabulary splits (`num_splits`) are merged by the same
rescaling (`_combine_partials`). Their tokens are bit-identical to the reference's; the other statistics agree up
to float rounding. `budgeted_row_stats_from_hidden` chunks rows under a byte budget.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch

from dllm_constrain.kernels._backend import interpreting, load_kernels, record, resolve_backend
from dllm_constrain.kernels.bitmask import (  # noqa: F401  (pack/unpack re-exported: their historical home)
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    pack_bool_mask,
    packed_width,
    unpack_bitmask,
    unpack_bitmask_into,
)

_KERNEL_MODULE = "dllm_constrain.kernels._triton_masked_row_stats"
NEG_INF = float("-inf")
# just above ln(FLT_MIN) = -87.3365: exp of it is a normal float32. Torch's vectorised exp on the CPU takes a slow path
# for inputs whose result underflows (-inf among them): 4x for a row of disallowed tokens, up to 30x just below this
# floor, with denormals flushed or not. The masked path clamps to the floor and subtracts its exp again.
EXP_FLOOR = -87.33


@dataclass
class RowStats:
    """Per-row reductions of one logits chunk; every field has shape [rows] (same fields as engine.sampling)."""

    token: torch.Tensor  # int64, -1 for a row with no allowed token
    prob: torch.Tensor  # float32, probability of `token` under the masked softmax
    entropy: torch.Tensor  # float32, nats
    margin: torch.Tensor  # float32, top1 - top2 probability

    def __len__(self) -> int:
        return int(self.token.shape[0])

    def span(self, start: int, stop: int) -> "RowStats":
        """Rows start .. stop - 1 (views)."""
        return RowStats(self.token[start:stop], self.prob[start:stop], self.entropy[start:stop],
                        self.margin[start:stop])

    def take(self, index: torch.Tensor | list[int]) -> "RowStats":
        """The rows at `index`, in that order."""
        idx = torch.as_tensor(index, dtype=torch.long, device=self.token.device)
        return RowStats(self.token[idx], self.prob[idx], self.entropy[idx], self.margin[idx])

    @staticmethod
    def cat(parts: list["RowStats"]) -> "RowStats":
        """Concatenate chunk results back into one set of rows."""
        if not parts:
            empty = torch.empty(0)
            return RowStats(torch.empty(0, dtype=torch.long), empty, empty, empty)
        return RowStats(
            torch.cat([p.token for p in parts]),
            torch.cat([p.prob for p in parts]),
            torch.cat([p.entropy for p in parts]),
            torch.cat([p.margin for p in parts]),
        )


class RowStatsWorkspace:
    """Scratch buffers reused across calls of the torch path, so chunk after chunk allocates nothing large.

    Without it every chunk allocates and frees its logits, mask and exp tensors; CPU allocators (glibc's dynamic
    mmap threshold) may then keep freed blocks resident and the process grows well past the budget. With it the big
    buffers are allocated once, at the size of the largest chunk:
      "logits"  float32 [rows, V]                      the chunk's logits (a float32 copy for the logits variant)
      "scratch" bytes, max(rows * 32 W, 4 or 8 * rows * V) the unpacked mask, then the float64 scores, then the exp
                                                       (each dead before the next is written)
      "noise"   float64 (CPU) / float32 [rows, V]       Gumbel noise drawn from the generator (T > 0)
    """

    def __init__(self) -> None:
        self._bufs: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A [shape] view of buffer `name` (grown when too small; contents are garbage)."""
        numel = math.prod(shape)
        buf = self._bufs.get(name)
        if buf is None or buf.dtype != dtype or buf.device != torch.device(device) or buf.numel() < numel:
            self._bufs.pop(name, None)
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._bufs[name] = buf
        return buf[:numel].view(shape)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._bufs.values())


# ----------------------------------------------------------------------------------------------- masks and noise


def _as_packed(allowed: torch.Tensor | None, rows: int, vocab: int, device: torch.device) -> torch.Tensor | None:
    """Accept None, bool [rows, vocab] or int32 [rows, >= ceil(vocab/32)]; return the packed int32 mask."""
    if allowed is None:
        return None
    if allowed.dtype == torch.bool:
        if tuple(allowed.shape) != (rows, vocab):
            raise ValueError(f"bool mask must be [{rows}, {vocab}], got {tuple(allowed.shape)}")
        return pack_bool_mask(allowed.to(device))
    if allowed.dtype != torch.int32:
        raise TypeError(f"allowed mask must be bool [rows, vocab] or packed int32, got {allowed.dtype}")
    if allowed.dim() != 2 or allowed.shape[0] != rows or allowed.shape[1] < packed_width(vocab):
        raise ValueError(
            f"packed mask must be int32 [{rows}, >= {packed_width(vocab)}], got {tuple(allowed.shape)}"
        )
    return allowed.to(device)


def _as_packed_or_bool(allowed: torch.Tensor | None, rows: int, vocab: int,
                       device: torch.device) -> torch.Tensor | None:
    """Validate a mask and move it to `device`, keeping bool masks unpacked (the torch path reads either)."""
    if allowed is None:
        return None
    if allowed.dtype == torch.bool:
        if tuple(allowed.shape) != (rows, vocab):
            raise ValueError(f"bool mask must be [{rows}, {vocab}], got {tuple(allowed.shape)}")
        return allowed.to(device)
    return _as_packed(allowed, rows, vocab, device)


def _disallowed_view(allowed: torch.Tensor, vocab: int, scratch: torch.Tensor) -> torch.Tensor:
    """bool [rows, vocab], True where the bool mask `allowed` does NOT allow the token, written into the byte buffer
    `scratch` (packed masks go through apply_token_bitmask_inplace instead)."""
    rows = allowed.shape[0]
    out = scratch[: rows * vocab].view(torch.bool).view(rows, vocab)
    return torch.bitwise_not(allowed, out=out)


def noise_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype Gumbel noise is drawn in on `device`: float64 on the CPU, float32 elsewhere (a float64 draw
    costs a GPU far more, and float32 uniforms are ample for the Gumbel-max trick)."""
    return torch.float64 if torch.device(device).type == "cpu" else torch.float32


def gumbel_noise(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device,
                 dtype: torch.dtype | None = None) -> torch.Tensor:
    """Standard Gumbel noise g = -log(-log U), U ~ U[0, 1) drawn on `device` from `generator` (engine.sampling's;
    it must live on `device`), in `dtype` (None: `noise_dtype(device)`, float64 on the CPU)."""
    dtype = noise_dtype(device) if dtype is None else dtype
    u = torch.rand(shape, generator=generator, dtype=dtype, device=device)
    return -torch.log(-torch.log(u))


def _gumbel_noise_into(out: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """`gumbel_noise` written into `out` (its device and dtype): same draws from the generator, bit-identical."""
    torch.rand(tuple(out.shape), generator=generator, dtype=out.dtype, device=out.device, out=out)
    return out.log_().neg_().log_().neg_()


def _check_args(logits_shape: tuple[int, ...], temperature: float, noise: torch.Tensor | None) -> None:
    if len(logits_shape) != 2:
        raise ValueError(f"expected a [rows, vocab] chunk, got shape {tuple(logits_shape)}")
    if not (temperature >= 0.0) or math.isinf(temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if noise is not None and tuple(noise.shape) != tuple(logits_shape):
        raise ValueError(f"noise must have the logits shape {tuple(logits_shape)}, got {tuple(noise.shape)}")


def _noise_for(shape, temperature, generator, noise, device, ws: RowStatsWorkspace | None = None):
    """None at T = 0; else the caller's noise, or standard Gumbel noise drawn from `generator` (into `ws`)."""
    if temperature == 0.0:
        return None
    if noise is not None:
        return noise.to(device)
    if ws is None:
        return gumbel_noise(tuple(shape), generator, device)
    return _gumbel_noise_into(ws.get("noise", tuple(shape), noise_dtype(device), device), generator)


def _empty_stats(device: torch.device) -> RowStats:
    e = torch.empty(0, dtype=torch.float32, device=device)
    return RowStats(torch.empty(0, dtype=torch.long, device=device), e, e.clone(), e.clone())


# ------------------------------------------------------------------------------------------------ torch reference


def _torch_stats(x: torch.Tensor, allowed: torch.Tensor | None, temperature: float, noise: torch.Tensor | None,
                 ws: RowStatsWorkspace) -> RowStats:
    """The reductions on a float32 [rows, V] tensor `x` that this function may overwrite (it owns it).

    `allowed` is None, bool [rows, V] or packed int32. Workspace besides x and the noise: one scratch buffer of
    max(1 B/token mask, 8 B/token float64 scores when sampling, 4 B/token exp), reused in that order.
    """
    rows, vocab = x.shape
    mask_bytes = rows * (vocab if allowed is None or allowed.dtype == torch.bool else allowed.shape[1] * 32)
    scratch = ws.get("scratch", (max(mask_bytes, rows * vocab * (8 if temperature > 0 else 4)),), torch.uint8,
                     x.device)
    if allowed is not None:
        if allowed.dtype == torch.bool:
            x.masked_fill_(_disallowed_view(allowed, vocab, scratch), NEG_INF)
        else:  # packed: in place, natively on the CPU (apply_token_bitmask_inplace)
            apply_token_bitmask_inplace(x, allowed, NEG_INF, scratch)
    if temperature == 0.0:
        token = x.argmax(-1)
    else:
        score = scratch[: rows * vocab * 8].view(torch.float64).view(rows, vocab)
        score.copy_(x).div_(temperature).add_(noise)  # = x.double() / T + g, as engine.sampling computes it
        token = score.argmax(-1)
    m = x.amax(-1, keepdim=True)
    nothing_allowed = torch.isinf(m)  # only -inf happens: a row with nothing allowed
    m = torch.where(nothing_allowed, torch.zeros_like(m), m)
    z = x.sub_(m)
    e_out = scratch[: rows * vocab * 4].view(torch.float32).view(rows, vocab)
    if allowed is not None:
        # disallowed tokens' -inf: clamped to the floor (exp's fast path) and their exp taken away again, so that they
        # weigh exactly 0 as before; every other weight is its exp less exp(floor) (1.2e-38: no change above 1e-31),
        # and one further than 87.33 below its row's maximum weighs 0 (it gave 0 or a denormal)
        z.clamp_min_(EXP_FLOOR)
        e = torch.exp(z, out=e_out).sub_(_exp_at_floor(z.device))
    else:
        e = torch.exp(z, out=e_out)
    s = e.sum(-1)
    prob = e.gather(-1, token.clamp_min(0)[:, None]).squeeze(-1) / s
    if vocab > 1:
        top = e.topk(2, dim=-1).values
        margin = (top[:, 0] - top[:, 1]) / s
    else:
        margin = e[:, 0] / s
    # sum e z in place over x's storage (e = 0 where z = -inf: the clamp makes that term -0, not NaN; a masked z is
    # clamped already)
    t = (z if allowed is not None else z.clamp_min_(torch.finfo(torch.float32).min)).mul_(e).sum(-1)
    entropy = torch.log(s) - t / s
    empty = (s == 0) | nothing_allowed.squeeze(-1)
    # unconditionally (a few [rows] ops): asking whether any row is empty would read the device
    token = token.masked_fill(empty, -1)
    prob = prob.masked_fill(empty, 0.0)
    entropy = entropy.masked_fill(empty, float("inf"))
    margin = margin.masked_fill(empty, 0.0)
    return RowStats(token=token, prob=prob, entropy=entropy, margin=margin)


@functools.lru_cache(maxsize=None)
def _exp_at_floor(device: torch.device) -> float:
    """exp(EXP_FLOOR) as torch's exp computes it on `device` (a float32 value), so that exp(floor) - this is 0."""
    return float(torch.exp(torch.full((64,), EXP_FLOOR, dtype=torch.float32, device=device))[0])


def reference_masked_row_stats(
    logits: torch.Tensor,
    allowed: torch.Tensor | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    *,
    noise: torch.Tensor | None = None,
    workspace: RowStatsWorkspace | None = None,
) -> RowStats:
    """Plain-torch statistics of a [rows, vocab] logits chunk (float32 math; see the module docstring).

    `allowed`: None, bool [rows, vocab] or packed int32 [rows, >= ceil(vocab/32)]. At T > 0 the Gumbel noise is
    `noise` (float64 or float32 [rows, vocab], standard Gumbel) if given, else drawn from `generator` on the
    logits' device (`gumbel_noise`).
    `workspace` keeps the scratch buffers between calls (see RowStatsWorkspace); None allocates fresh ones.
    """
    _check_args(tuple(logits.shape), temperature, noise)
    rows, vocab = logits.shape
    if rows == 0:
        return _empty_stats(logits.device)
    allowed = _as_packed_or_bool(allowed, rows, vocab, logits.device)
    ws = workspace if workspace is not None else RowStatsWorkspace()
    noise = _noise_for(logits.shape, temperature, generator, noise, logits.device, ws)
    x = ws.get("logits", (rows, vocab), torch.float32, logits.device).copy_(logits)
    return _torch_stats(x, allowed, temperature, noise, ws)


def reference_masked_row_stats_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    allowed: torch.Tensor | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    *,
    noise: torch.Tensor | None = None,
    workspace: RowStatsWorkspace | None = None,
) -> RowStats:
    """The same statistics of logits = hidden @ weight^T computed in float32 (hidden [rows, D], weight [V, D])."""
    rows, vocab = hidden.shape[0], weight.shape[0]
    _check_args((rows, vocab), temperature, noise)
    if rows == 0:
        return _empty_stats(hidden.device)
    allowed = _as_packed_or_bool(allowed, rows, vocab, hidden.device)
    ws = workspace if workspace is not None else RowStatsWorkspace()
    noise = _noise_for((rows, vocab), temperature, generator, noise, hidden.device, ws)
    w = weight if weight.dtype == torch.float32 else weight.float()
    x = torch.mm(hidden.to(torch.float32), w.t(), out=ws.get("logits", (rows, vocab), torch.float32, hidden.device))
    return _torch_stats(x, allowed, temperature, noise, ws)


# -------------------------------------------------------------------------------------------------- Triton path


def _combine_partials(m, s, t, top2, best, idx, bx) -> RowStats:
    """Merge per-split states [rows, P] into final statistics (the online-softmax rescaling, done once more).

    M = max_p m_p, S = sum_p e^{m_p - M} s_p, Tt = sum_p e^{m_p - M} (t_p + (m_p - M) s_p); the second-largest logit
    is the largest of the splits' second-largest and of the non-winning splits' maxima; the token is the best
    score over splits, the first split winning ties (splits are in column order).
    """
    M = m.amax(1, keepdim=True)
    M = torch.where(torch.isinf(M), torch.zeros_like(M), M)
    w = torch.exp(m - M)
    shift = torch.where(s > 0, m - M, torch.zeros_like(s)) * s  # (-inf) * 0 would be NaN
    S = (w * s).sum(1)
    T = (w * (t + shift)).sum(1)
    win = m.argmax(1, keepdim=True)
    second = torch.maximum(top2.amax(1), m.scatter(1, win, NEG_INF).amax(1))
    j = best.argmax(1, keepdim=True)
    token = idx.gather(1, j).squeeze(1).long()
    xt = bx.gather(1, j).squeeze(1)
    M = M.squeeze(1)
    prob = torch.exp(xt - M) / S
    entropy = torch.log(S) - T / S
    margin = (1.0 - torch.exp(second - M)) / S
    empty = S == 0
    token = token.masked_fill(empty, -1)
    prob = prob.masked_fill(empty, 0.0)
    entropy = entropy.masked_fill(empty, float("inf"))
    margin = margin.masked_fill(empty, 0.0)
    return RowStats(token=token, prob=prob, entropy=entropy, margin=margin)


def _split_plan(rows: int, vocab: int, block_r: int, block_v: int, num_splits: int | None,
                device: torch.device) -> tuple[int, int]:
    """(tiles_per_split, n_splits) so that programs cover the vocabulary with no empty split."""
    n_tiles = max(1, (vocab + block_v - 1) // block_v)
    if num_splits is None:
        if device.type == "cuda":
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            row_blocks = (rows + block_r - 1) // block_r
            num_splits = max(1, (4 * sms + row_blocks - 1) // row_blocks)
        else:
            num_splits = 1
    num_splits = max(1, min(int(num_splits), n_tiles))
    tiles_per_split = (n_tiles + num_splits - 1) // num_splits
    return tiles_per_split, (n_tiles + tiles_per_split - 1) // tiles_per_split


def _partials(rows: int, n_splits: int, sampling: bool, device: torch.device):
    f32 = dict(dtype=torch.float32, device=device)
    return (
        torch.empty(rows, n_splits, **f32),  # m
        torch.empty(rows, n_splits, **f32),  # s
        torch.empty(rows, n_splits, **f32),  # t
        torch.empty(rows, n_splits, **f32),  # top2
        torch.empty(rows, n_splits, dtype=torch.float64 if sampling else torch.float32, device=device),  # best
        torch.empty(rows, n_splits, dtype=torch.int32, device=device),  # idx
        torch.empty(rows, n_splits, **f32),  # x at best
    )


def _triton_row_stats(logits, packed, temperature, noise, num_splits, block_v) -> RowStats:
    mod = load_kernels(_KERNEL_MODULE)
    rows, vocab = logits.shape
    device = logits.device
    block_r = 1
    if block_v is None:
        block_v = 64 if interpreting() else 2048
    tiles_per_split, n_splits = _split_plan(rows, vocab, block_r, block_v, num_splits, device)
    sampling = temperature > 0.0
    out = _partials(rows, n_splits, sampling, device)
    dummy = out[1]
    temp = torch.tensor([temperature], dtype=torch.float64, device=device)
    if sampling and noise.dtype not in (torch.float32, torch.float64):  # the kernel widens each value to float64
        noise = noise.to(torch.float64)
    grid = ((rows + block_r - 1) // block_r, n_splits)
    mod.masked_row_stats_kernel[grid](
        logits, packed if packed is not None else dummy, noise if sampling else dummy, temp,
        *out,
        rows, vocab, tiles_per_split, n_splits,
        logits.stride(0), logits.stride(1),
        packed.stride(0) if packed is not None else 0,
        noise.stride(0) if sampling else 0, noise.stride(1) if sampling else 0,
        HAS_MASK=packed is not None, HAS_NOISE=sampling,
        BLOCK_R=block_r, BLOCK_V=block_v,
        num_warps=4 if block_v <= 1024 else 8,
    )
    return _combine_partials(*out)


def _triton_row_stats_from_hidden(hidden, weight, packed, temperature, noise, num_splits, block_v,
                                  block_d) -> RowStats:
    mod = load_kernels(_KERNEL_MODULE)
    rows, dim = hidden.shape
    vocab = weight.shape[0]
    device = hidden.device
    if hidden.dtype != weight.dtype:
        hidden = hidden.to(weight.dtype)
    block_r = 16 if rows <= 16 else (32 if rows <= 32 else 64)
    if block_v is None:
        block_v = 32 if interpreting() else 128
    if block_d is None:
        block_d = 16 if interpreting() else 64
    tiles_per_split, n_splits = _split_plan(rows, vocab, block_r, block_v, num_splits, device)
    sampling = temperature > 0.0
    out = _partials(rows, n_splits, sampling, device)
    dummy = out[1]
    temp = torch.tensor([temperature], dtype=torch.float64, device=device)
    if sampling and noise.dtype not in (torch.float32, torch.float64):  # the kernel widens each value to float64
        noise = noise.to(torch.float64)
    grid = ((rows + block_r - 1) // block_r, n_splits)
    mod.masked_row_stats_hidden_kernel[grid](
        hidden, weight, packed if packed is not None else dummy, noise if sampling else dummy, temp,
        *out,
        rows, vocab, dim, tiles_per_split, n_splits,
        hidden.stride(0), hidden.stride(1), weight.stride(0), weight.stride(1),
        packed.stride(0) if packed is not None else 0,
        noise.stride(0) if sampling else 0, noise.stride(1) if sampling else 0,
        HAS_MASK=packed is not None, HAS_NOISE=sampling,
        DOT_FP32=weight.dtype == torch.float32 or interpreting(),
        BLOCK_R=block_r, BLOCK_V=block_v, BLOCK_D=block_d,
        num_warps=4 if block_r <= 32 else 8,
    )
    return _combine_partials(*out)


# ------------------------------------------------------------------------------------------------- dispatchers


def masked_row_stats(
    logits: torch.Tensor,
    allowed: torch.Tensor | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    *,
    noise: torch.Tensor | None = None,
    backend: str = "auto",
    num_splits: int | None = None,
    block_v: int | None = None,
    workspace: RowStatsWorkspace | None = None,
) -> RowStats:
    """Token, probability, entropy and top-2 margin of each row of a [rows, vocab] logits chunk (float32/bf16/fp16).

    What engine.sampling.reduce_logits(logits_chunk, allowed_mask, temperature, generator) calls. `allowed` is None,
    bool [rows, vocab] or xgrammar-packed int32 [rows, >= ceil(vocab/32)]. At T > 0 the standard Gumbel noise is
    `noise` (float64 or float32 [rows, vocab]) or is drawn from `generator` on the logits' device (`gumbel_noise`).
    backend: "auto" (Triton on CUDA, torch elsewhere), "triton" (forced; on CPU needs TRITON_INTERPRET=1), "torch".
    num_splits: vocabulary splits per row for the Triton kernel (default: enough programs to fill the GPU).
    workspace: reusable scratch buffers (torch path, and the drawn noise on both paths) for chunk-by-chunk callers.
    """
    _check_args(tuple(logits.shape), temperature, noise)
    chosen = resolve_backend(backend, logits.device)
    rows, vocab = logits.shape
    record("masked_row_stats", chosen)
    if rows == 0:
        return _empty_stats(logits.device)
    if chosen == "torch":
        return reference_masked_row_stats(logits, allowed, temperature, generator, noise=noise, workspace=workspace)
    packed = _as_packed(allowed, rows, vocab, logits.device)
    noise = _noise_for(logits.shape, temperature, generator, noise, logits.device, workspace)
    return _triton_row_stats(logits, packed, temperature, noise, num_splits, block_v)


def masked_row_stats_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    allowed: torch.Tensor | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    *,
    noise: torch.Tensor | None = None,
    backend: str = "auto",
    num_splits: int | None = None,
    block_v: int | None = None,
    block_d: int | None = None,
    workspace: RowStatsWorkspace | None = None,
) -> RowStats:
    """The statistics of logits = hidden @ weight^T (hidden [rows, D], LM head weight [V, D]), fused.

    On the Triton path each [rows, BLOCK_V] logits tile lives only in registers (float32 accumulation), so the
    logits are never written to memory; the torch path computes float32 logits then reduces them. Logits are float32
    products of the inputs in both paths (for bf16 weights that is more precise than rounding logits to bf16).
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"expected hidden [rows, D] and weight [V, D], got {tuple(hidden.shape)} "
                         f"and {tuple(weight.shape)}")
    rows, vocab = hidden.shape[0], weight.shape[0]
    _check_args((rows, vocab), temperature, noise)
    chosen = resolve_backend(backend, hidden.device)
    record("masked_row_stats_from_hidden", chosen)
    if rows == 0:
        return _empty_stats(hidden.device)
    if chosen == "torch":
        return reference_masked_row_stats_from_hidden(hidden, weight, allowed, temperature, generator, noise=noise,
                                                      workspace=workspace)
    packed = _as_packed(allowed, rows, vocab, hidden.device)
    noise = _noise_for((rows, vocab), temperature, generator, noise, hidden.device, workspace)
    return _triton_row_stats_from_hidden(hidden, weight, packed, temperature, noise, num_splits, block_v, block_d)


# ------------------------------------------------------------------------------------------ budgeted row chunks


def workspace_bytes_per_row(vocab: int, *, sampling: bool, fused: bool) -> int:
    """Transient bytes one row costs in the logits path (what a chunk budget must cover).

    torch path (`_torch_stats`, see RowStatsWorkspace): float32 logits (4 B/token) + one scratch buffer reused for
    the unpacked mask (1), then at T > 0 the float64 scores (8), then the exp (4); at T > 0 also the noise
    (8: float64 on the CPU; float32 elsewhere, still counted as 8): 8 B/token greedy, 20 sampling. Fused Triton
    path: the logits never exist; only the noise (8 B/token at T > 0) and the per-split partial states remain.
    """
    if fused:
        return vocab * (8 if sampling else 0) + 4096
    return vocab * (20 if sampling else 8)


def rows_per_chunk(vocab: int, budget_bytes: int, *, sampling: bool = False, fused: bool = False) -> int:
    """The largest row count whose workspace fits in `budget_bytes` (at least 1: one row is the floor)."""
    return max(1, int(budget_bytes) // workspace_bytes_per_row(vocab, sampling=sampling, fused=fused))


def default_budget_bytes(device: torch.device | str, *, fraction: float = 0.05, floor: int = 64 << 20,
                         ceiling: int = 1 << 30) -> int:
    """A chunk budget: `fraction` of the device's free memory, clamped to [floor, ceiling] (64 MiB .. 1 GiB).

    Free memory is torch.cuda.mem_get_info on CUDA and MemAvailable (/proc/meminfo) on CPU (4 GiB assumed when it
    cannot be read). 64 MiB already holds ~65 rows of a 126,464-token vocabulary on the torch path, enough to keep a
    matmul efficient; more only helps while the chunk's rows fill the device.
    """
    device = torch.device(device)
    free = 4 << 30
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        try:
            with open("/proc/meminfo") as fh:
                for line in fh:
                    if line.startswith("MemAvailable:"):
                        free = int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return int(min(ceiling, max(floor, fraction * free)))


def budgeted_row_stats_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    allowed: torch.Tensor | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    *,
    budget_bytes: int,
    noise_fn: Callable[[int, int], torch.Tensor] | None = None,
    backend: str = "auto",
) -> RowStats:
    """`masked_row_stats_from_hidden` over row chunks whose transient workspace stays under `budget_bytes`.

    Each chunk's statistics are computed before the next chunk overwrites its logits in the shared workspace, so
    the peak is flat in the number of rows. Noise at T > 0: `noise_fn(start, stop)` gives the chunk's float64
    Gumbel noise, else it is drawn from `generator` chunk after chunk (on CPU torch's generator yields the same
    stream as one [rows, V] draw, so the result equals the unchunked call; on CUDA pass a noise_fn that is a
    function of the row index).
    """
    rows, vocab = hidden.shape[0], weight.shape[0]
    chosen = resolve_backend(backend, hidden.device)
    sampling = temperature > 0.0
    step = rows_per_chunk(vocab, budget_bytes, sampling=sampling, fused=chosen == "triton")
    workspace = RowStatsWorkspace()  # allocated once at the chunk size, reused by every chunk
    parts = []
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        noise = noise_fn(start, stop) if (sampling and noise_fn is not None) else None
        parts.append(
            masked_row_stats_from_hidden(
                hidden[start:stop], weight, None if allowed is None else allowed[start:stop], temperature,
                generator, noise=noise, backend=chosen, workspace=workspace,
            )
        )
    if not parts:
        return _empty_stats(hidden.device)
    return RowStats.cat(parts)
