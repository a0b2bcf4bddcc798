"""Triton kernels and their plain-torch references (import: dllm_constrain.kernels).

- masked_row_stats: grammar-mask application fused with the per-row reductions a commit policy needs (token,
  probability, entropy, top-2 margin), over a logits chunk or straight from hidden states and the LM head.
- packed_kv_attention: head-centric sparse attention over a per-KV-head packed cache of salient keys.

Every op has a `backend` argument: "auto" runs Triton on CUDA and torch elsewhere; "triton" forces the kernel
(on CPU through Triton's interpreter, TRITON_INTERPRET=1); `last_backend(op)` says which path ran.
"""
from dllm_constrain.kernels._backend import last_backend
from dllm_constrain.kernels.masked_row_stats import (
    RowStats,
    budgeted_row_stats_from_hidden,
    masked_row_stats,
    masked_row_stats_from_hidden,
    pack_bool_mask,
    reference_masked_row_stats,
    reference_masked_row_stats_from_hidden,
    rows_per_chunk,
    unpack_bitmask,
)
from dllm_constrain.kernels.packed_kv_attention import (
    PackedKV,
    packed_kv_attention,
    reference_packed_kv_attention,
    select_salient_keys,
)

__all__ = [
    "PackedKV",
    "RowStats",
    "budgeted_row_stats_from_hidden",
    "last_backend",
    "masked_row_stats",
    "masked_row_stats_from_hidden",
    "pack_bool_mask",
    "packed_kv_attention",
    "reference_masked_row_stats",
    "reference_masked_row_stats_from_hidden",
    "reference_packed_kv_attention",
    "rows_per_chunk",
    "select_salient_keys",
    "unpack_bitmask",
]
