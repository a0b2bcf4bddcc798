"""Triton kernels and their plain-torch references (import: dllm_constrain.kernels).

- `dllm_constrain.kernels.masked_row_stats`: grammar-mask application fused with the per-row reductions a commit
  policy needs (token, probability, entropy, top-2 margin), over a logits chunk or straight from hidden states and
  the LM head (`masked_row_stats`, `masked_row_stats_from_hidden`, `budgeted_row_stats_from_hidden`, `RowStats`).
- `dllm_constrain.kernels.packed_kv_attention`: head-centric sparse attention over a per-KV-head packed cache of
  salient keys (`select_salient_keys`, `packed_kv_attention`, `PackedKV`).

Import from the submodules: the package deliberately does not re-export the functions, whose names equal their
modules' names. Every op has a `backend` argument: "auto" runs Triton on CUDA and torch elsewhere; "triton" forces
the kernel (on CPU through Triton's interpreter, TRITON_INTERPRET=1); `_backend.last_backend(op)` says which ran.
"""
