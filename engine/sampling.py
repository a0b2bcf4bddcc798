"""Token choice and the per-row statistics the commit policies rank by.

Everything a policy needs from one canvas position's logits row is reduced to four numbers (`RowStats`):
the chosen token, its probability, the entropy of the distribution and the top1-top2 probability margin.
`reduce_logits` is the single seam that computes them from a [rows, vocab] chunk of logits; the engine
calls it chunk by chunk, so a fused kernel over chunks (under a memory budget) can replace it later
without touching the loop.

Math (l = logits row, A = allowed set, l_t = -inf for t not in A):
  p      = softmax(l)                         (the masked distribution, temperature-free as in LLaDA)
  token  = argmax_t l_t                       if T == 0 (greedy)
         = argmax_t l_t / T + g_t             if T > 0, g_t = -log(-log U_t), U_t ~ U[0, 1) in float64
           (the Gumbel-max trick samples from softmax(l / T); it equals LLaDA's add_gumbel_noise
            argmax exp(l) / (-log U)^T, written in log space so large logits cannot overflow exp)
  prob   = p[token]
  entropy= -sum_t p_t log p_t
  margin = p_(1) - p_(2)                      (largest minus second largest probability; p_(1) if |A| = 1)
Noise comes from a torch.Generator owned by the request, so a request's samples do not depend on what
else is in the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowStats:
    """Per-row reductions of one logits chunk; every field has shape [rows]."""

    token: torch.Tensor  # int64
    prob: torch.Tensor  # float32, probability of `token` under the masked softmax
    entropy: torch.Tensor  # float32, nats
    margin: torch.Tensor  # float32, top1 - top2 probability

    def __len__(self) -> int:
        return int(self.token.shape[0])

    def take(self, index: torch.Tensor | list[int]) -> "RowStats":
        """The rows at `index`, in that order."""
        idx = torch.as_tensor(index, dtype=torch.long)
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


def gumbel_noise(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """Standard Gumbel noise g = -log(-log U) in float64 (U = 0 gives g = -inf: that token is never chosen)."""
    u = torch.rand(shape, generator=generator, dtype=torch.float64, device=device)
    return -torch.log(-torch.log(u))


def sample_tokens(
    logits: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> torch.Tensor:
    """argmax(logits) at T = 0; argmax(logits / T + Gumbel) in float64 at T > 0 (a sample of softmax(l / T))."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    noisy = logits.to(torch.float64) / temperature + gumbel_noise(tuple(logits.shape), generator, logits.device)
    return noisy.argmax(dim=-1)


def reduce_logits(
    logits_chunk: torch.Tensor,
    allowed_mask: torch.Tensor | None,
    temperature: float,
    generator: torch.Generator | None,
) -> RowStats:
    """Chosen token, its probability, entropy and top1-top2 margin for each row of a [rows, vocab] chunk.

    `allowed_mask` (bool [rows, vocab], True = allowed) is applied first (-inf elsewhere), so every statistic
    is of the constrained distribution. A row with no allowed token gets token -1, prob 0, entropy +inf,
    margin 0; the engine never commits such a row.
    """
    logits = logits_chunk.float()
    if allowed_mask is not None:
        logits = logits.masked_fill(~allowed_mask, float("-inf"))
    rows = logits.shape[0]
    if rows == 0:
        return RowStats.cat([])
    token = sample_tokens(logits, temperature, generator)
    logp = torch.log_softmax(logits, dim=-1)  # NaN on rows that are all -inf; fixed below
    p = logp.exp()
    prob = p.gather(-1, token[:, None]).squeeze(-1)
    entropy = -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1)
    top = p.topk(min(2, p.shape[-1]), dim=-1).values
    margin = top[:, 0] - top[:, 1] if top.shape[-1] > 1 else top[:, 0]
    if allowed_mask is not None:
        empty = ~allowed_mask.any(-1)
        if bool(empty.any()):
            token = token.masked_fill(empty, -1)
            prob = prob.masked_fill(empty, 0.0)
            entropy = entropy.masked_fill(empty, float("inf"))
            margin = margin.masked_fill(empty, 0.0)
    return RowStats(token=token, prob=prob, entropy=entropy, margin=margin)
