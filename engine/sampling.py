"""Token choice and the per-row statistics the commit policies rank by: the engine's seam onto the kernels.

Everything a policy needs from one canvas position's logits row is reduced to four numbers (`RowStats`):
the chosen token, its probability, the entropy of the distribution and the top1-top2 probability margin.
There is one implementation of that math, `dllm_constrain.kernels.masked_row_stats` (its torch reference on CPU,
the fused Triton kernel on CUDA); `reduce_logits` is the engine's name for it on a [rows, vocab] chunk, and the
budgeted logits path (`engine.logits`) calls the same dispatcher chunk by chunk.

Math (l = logits row, A = allowed set, l_t = -inf for t not in A):
  p      = softmax(l)                         (the masked distribution, temperature-free as in LLaDA)
  token  = argmax_t l_t                       if T == 0 (greedy)
         = argmax_t l_t / T + g_t             if T > 0, g_t = -log(-log U_t), U_t ~ U[0, 1) in float64 on the
                                              CPU (float32 on CUDA; the score l / T + g is float64 on both)
           (Gumbel-max samples softmax(l / T): LLaDA's add_gumbel_noise in log space, no exp overflow)
  prob   = p[token]
  entropy= -sum_t p_t log p_t
  margin = p_(1) - p_(2)                      (largest minus second largest probability; p_(1) if |A| = 1)
The engine's noise is hashed per row from the request's seed (kernels.hashed_noise; docs/engine.md, "Randomness").
"""
from __future__ import annotations

import torch

from dllm_constrain.kernels import masked_row_stats as mrs
from dllm_constrain.kernels.masked_row_stats import RowStats, gumbel_noise

__all__ = ["RowStats", "gumbel_noise", "reduce_logits"]


def reduce_logits(
    logits_chunk: torch.Tensor,
    allowed_mask: torch.Tensor | None,
    temperature: float,
    generator: torch.Generator | None,
    *,
    backend: str = "auto",
    workspace: mrs.RowStatsWorkspace | None = None,
) -> RowStats:
    """Chosen token, its probability, entropy and top1-top2 margin for each row of a [rows, vocab] chunk.

    `allowed_mask` (the engine's token bitmask, int32 [rows, ceil(vocab / 32)] in xgrammar's layout, see
    `kernels.bitmask`; a bool [rows, vocab] mask is accepted too) is applied first (-inf elsewhere), so every
    statistic is of the constrained distribution. A row with no allowed token gets token -1,
    prob 0, entropy +inf, margin 0; the engine never commits such a row. Computed by
    `kernels.masked_row_stats.masked_row_stats` (backend "auto": torch on CPU, Triton on CUDA).
    """
    return mrs.masked_row_stats(logits_chunk, allowed_mask, temperature, generator, backend=backend,
                                workspace=workspace)
