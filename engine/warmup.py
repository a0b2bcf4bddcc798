"""Compile, at engine start, every Triton kernel variant the engine's steps will launch, so no request pays for it.

Triton compiles a kernel the first time it meets a new combination of its compile-time parameters (BLOCK_* sizes,
HAS_MASK, HAS_NOISE, ...) and of its integer arguments' specialisations (a value of 1, a multiple of 16): seconds
per variant on a GPU, paid by whichever request first meets it, in the middle of a step. `warm_up` runs each
variant once on dummy inputs of the model's shapes and device and returns the seconds it took (printed on stderr);
later starts find Triton's on-disk cache and take far less. On the CPU the kernels take their torch paths and it
does nothing.

What is planned (`plan_warm_up`), from the engine's settings and the model's shapes:
  row statistics from hidden states (kernels.masked_row_stats, the step's one LM-head pass): one row count per
      distinct (BLOCK_R bucket, specialisation of the rows, of the vocabulary split's tiles per program and of its
      program count) up to the most rows a chunk holds (`EngineConfig.max_logit_rows`, else MAX_STEP_ROWS), each
      with and without a mask, greedy and sampling (`head_row_counts`);
  the step's varlen attention (kernels/_triton_varlen_attention.py, every layer's attention) for families with
      the cached forward: one launch per BLOCK_M (16 for steps of at most 16 query rows per sequence, 64 above) at
      the model's head dimension, head counts and dtype, with the keep mask (HAS_KEEP) exactly when the sparse
      cache is on (`keep_ratio` < 1 with kv_cache "dual": the pool then passes it on every layer);
  the token-bitmask application (kernels.bitmask) on the device: its torch ops load their kernels once.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.logits import lm_head_weight
from dllm_constrain.engine.model_runner import model_device

MAX_STEP_ROWS = 64 * 64  # rows of one head pass without a max_logit_rows cap: 64 requests' blocks of up to 64
HEAD_BLOCK_V = 128  # the compiled head kernel's vocabulary tile (kernels.masked_row_stats)
QUERY_ROWS = (16, 64)  # one per BLOCK_M of the varlen attention (query rows of a step's longest sequence)


class WarmUpTarget(Protocol):
    """What warm_up reads: an LLMEngine or a ModelRunner (both hold the model and the engine settings)."""

    model: Any
    config: EngineConfig


@dataclass(frozen=True)
class Variant:
    """One kernel variant to compile: `kind` is "row_stats" (rows, masked, sampling), "varlen_attention" (rows = the
    longest sequence's query rows, masked = the keep mask) or "bitmask" (rows)."""

    kind: str
    rows: int
    masked: bool = False
    sampling: bool = False


def attention_shape(model: Any) -> tuple[int, int, int] | None:
    """(query heads, KV heads, head dimension) of a family with the cached forward (LLaDA, Dream), else None."""
    from dllm_constrain.engine.models.dream import DreamConfig
    from dllm_constrain.engine.models.llada import LLaDAConfig

    cfg = model.config
    if isinstance(cfg, LLaDAConfig):
        return cfg.n_heads, cfg.kv_heads, cfg.head_dim
    if isinstance(cfg, DreamConfig):
        return cfg.num_attention_heads, cfg.kv_heads, cfg.dim_per_head
    return None


def _specialisation(x: int) -> int:
    """How Triton specialises an integer argument: 1, a multiple of 16, or neither (0)."""
    return 1 if x == 1 else (16 if x % 16 == 0 else 0)


def head_row_counts(max_rows: int, vocab: int, sms: int) -> list[int]:
    """The fewest row counts in 1..max_rows that meet every compiled variant of the fused head kernel on a GPU with
    `sms` multiprocessors: one per (BLOCK_R, and the specialisations of rows, tiles per split and splits)."""
    from dllm_constrain.kernels.masked_row_stats import _split_plan

    seen: dict[tuple[int, ...], int] = {}
    for rows in range(1, max_rows + 1):
        block_r = 16 if rows <= 16 else (32 if rows <= 32 else 64)
        row_blocks = -(-rows // block_r)
        splits = max(1, -(-4 * sms // row_blocks))  # as the kernel's dispatcher chooses them on CUDA
        tiles, n_splits = _split_plan(rows, vocab, block_r, HEAD_BLOCK_V, splits, torch.device("cpu"))
        key = (block_r, _specialisation(rows), _specialisation(tiles), _specialisation(n_splits))
        seen.setdefault(key, rows)
    return sorted(seen.values())


def plan_warm_up(config: EngineConfig, device: torch.device, *, vocab: int, sms: int, has_lm_head: bool = True,
                 has_attention: bool = True, sampling: bool = True, max_rows: int | None = None) -> list[Variant]:
    """The kernel variants the engine launches on `device` (a GPU with `sms` multiprocessors) under `config` for a
    model with `vocab` tokens; empty on the CPU. has_lm_head: the model exposes its LM head (the fused head pass
    runs); has_attention: its family has the cached forward; sampling=False: greedy requests only; max_rows: the most
    rows one head pass holds (default: `config.max_logit_rows`, else MAX_STEP_ROWS)."""
    if device.type != "cuda":
        return []
    rows = head_row_counts(max_rows or config.max_logit_rows or MAX_STEP_ROWS, vocab, sms)
    plan: list[Variant] = []
    if has_lm_head and config.backend != "torch":
        plan += [Variant("row_stats", r, masked, noise)
                 for r in rows for masked in (False, True) for noise in ((False, True) if sampling else (False,))]
    if has_attention and config.backend != "torch":
        sparse = config.keep_ratio < 1.0 and config.kv_cache == "dual"
        plan += [Variant("varlen_attention", rows, masked=sparse) for rows in QUERY_ROWS]
    plan.append(Variant("bitmask", min(rows[-1], 16)))  # its torch ops load once, whatever the rows
    return plan


def run_variant(variant: Variant, model: Any, device: torch.device, backend: str) -> None:
    """One call of the variant's kernel on dummy inputs of the model's shapes (zeros; every token allowed)."""
    from dllm_constrain.kernels import masked_row_stats as mrs
    from dllm_constrain.kernels.bitmask import allocate_token_bitmask, apply_token_bitmask_inplace

    vocab = int(model.vocab_size)
    if variant.kind == "row_stats":
        weight = lm_head_weight(model)
        hidden = torch.zeros(variant.rows, weight.shape[1], dtype=weight.dtype, device=device)
        mask = allocate_token_bitmask(variant.rows, vocab).to(device) if variant.masked else None
        gen = torch.Generator(device=device).manual_seed(0) if variant.sampling else None
        mrs.masked_row_stats_from_hidden(hidden, weight, mask, 1.0 if variant.sampling else 0.0, gen,
                                         backend=backend)
    elif variant.kind == "varlen_attention":
        _run_varlen_attention(variant, model, device, backend)
    else:
        logits = torch.zeros(variant.rows, vocab, device=device)
        apply_token_bitmask_inplace(logits, allocate_token_bitmask(variant.rows, vocab).to(device))


def _run_varlen_attention(variant: Variant, model: Any, device: torch.device, backend: str) -> None:
    """One sequence of `variant.rows` queries over 64 pool slots, laid out as the engine's step: q a head-major view
    of the projections' [T, Hq, D], k/v the pool's [Hkv, S, D], the keep mask [Hkv, S] when masked."""
    from dllm_constrain.kernels.varlen_attention import VarlenLayout, varlen_attention

    shape = attention_shape(model)
    assert shape is not None  # planned only for families with the cached forward
    heads, kv, dim = shape
    dtype = next(model.parameters()).dtype
    slots = 64
    q = torch.zeros(variant.rows, heads, dim, dtype=dtype, device=device).transpose(0, 1)
    k = torch.zeros(kv, slots, dim, dtype=dtype, device=device)
    keep = torch.ones(kv, slots, dtype=torch.bool, device=device) if variant.masked else None
    layout = VarlenLayout.build([0], [variant.rows], [torch.arange(slots)], [variant.masked], variant.rows, device,
                                grouped=False)
    varlen_attention(q, k, torch.zeros_like(k), layout, keep, backend=backend)


def warm_up(target: WarmUpTarget, *, sampling: bool = True, max_rows: int | None = None) -> float:
    """Compile every planned kernel variant on the target's device (see the module docstring; `sampling` and
    `max_rows` as in `plan_warm_up`); returns the seconds it took, 0.0 on the CPU, where there is nothing to
    compile."""
    device = model_device(target.model)
    if device.type != "cuda":
        return 0.0
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    plan = plan_warm_up(target.config, device, vocab=int(target.model.vocab_size), sms=sms,
                        has_lm_head=lm_head_weight(target.model) is not None,
                        has_attention=attention_shape(target.model) is not None, sampling=sampling,
                        max_rows=max_rows)
    start = time.perf_counter()
    with torch.no_grad():
        for variant in plan:
            run_variant(variant, target.model, device, target.config.backend)
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    print(f"dllm-constrain: warmed up {len(plan)} kernel variants in {seconds:.1f} s", file=sys.stderr)
    return seconds
