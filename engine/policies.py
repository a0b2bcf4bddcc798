"""Commit policies: given the statistics of the active block's open positions, which ones become final.

Each policy does one thing: `select(stats, state) -> Selection`, where `stats` holds one row per open
position of the active block (left to right) and the selection names rows, best first. Every policy
commits at least one row per call, so the loop always terminates. Scores (higher = commit first) are also
what constraint joint verification keeps greedily.

Quota policies (LLaDA and Dream) commit `commit_count(state, n_open)` rows per step, on the request's schedule
(`SamplingParams.schedule`):
  "uniform"  (LLaDA's generate) k = ceil(n_open / steps_left) over each block's step budget. On an untouched
             block this is LLaDA's `get_num_transfer_tokens` exactly (base = n // steps per step, the remainder
             one extra on the first steps), and it adapts when forced tokens or remasks change n_open.
  "linspace" (Dream's diffusion_generate) timesteps = linspace(1, eps, steps + 1) in float32; at schedule step i
             with t = timesteps[i], s = timesteps[i + 1], k = int(n_open * (1 - s / t)) if i < steps - 1 else
             n_open. A step whose k is 0 changes nothing in Dream's loop but spends a forward; here it is skipped
             (the schedule moves on to the first step with k > 0), which for a greedy run gives the same canvas
             with fewer forwards, since an unchanged canvas gives the same logits.
The ranking is the policy's own: LLaDA's low-confidence remasking (p of the chosen token; Dream's
`maskgit_plus`), Dream's `entropy` (negative entropy) and `topk_margin` (top1 - top2 probability).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

import torch

from dllm_constrain.engine.sampling import RowStats, gumbel_noise
from dllm_constrain.errors import InvalidRequestError
from dllm_constrain.kernels.hashed_noise import hashed_gumbel_noise, noise_key, noise_row_key

if TYPE_CHECKING:  # annotations only: engine.state validates policy names against this module's registry
    from dllm_constrain.engine.state import RequestState, SamplingParams


@dataclass
class Selection:
    """Rows to commit (best first, with their scores) and rows to re-noise (entropy-bound only)."""

    commit: list[int]
    scores: list[float]
    renoise: list[int] = field(default_factory=list)


class CommitPolicy(Protocol):
    """name: the registry's name (`SamplingParams.policy`); spends_step_budget: whether it commits on the block's
    step budget (a quota policy: a block that forced tokens close saves the rest of its budget) or adaptively."""

    name: str
    spends_step_budget: ClassVar[bool]

    @classmethod
    def from_params(cls, params: SamplingParams) -> CommitPolicy: ...

    def select(self, stats: RowStats, state: RequestState) -> Selection: ...


def get_num_transfer_tokens(mask_count: int, steps: int) -> list[int]:
    """LLaDA's schedule: mask_count tokens over `steps` steps, base = mask_count // steps each, the
    remainder one extra on the first steps (the linear noise schedule of masked diffusion)."""
    base, rem = divmod(mask_count, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


def _committable(stats: RowStats) -> torch.Tensor:
    """Rows that have at least one allowed token (the others must never be committed)."""
    return stats.token >= 0


def _top_rows(score: torch.Tensor, ok: torch.Tensor, k: int) -> Selection:
    """The k best committable rows by score (ties: the left-most row first)."""
    score = score.double().masked_fill(~ok, float("-inf"))
    k = max(0, min(k, int(ok.sum())))
    # stable descending sort keeps left-to-right order among equal scores, so results are reproducible
    order = torch.sort(score, descending=True, stable=True).indices[:k]
    return Selection(commit=order.tolist(), scores=score[order].tolist())


def linspace_count(n_open: int, step: int, steps: int, eps: float) -> int:
    """Dream's count at schedule step `step` of `steps`: int(n * (1 - s / t)) on float32 linspace(1, eps, steps + 1)
    timesteps (the arithmetic of diffusion_generate, float32 throughout), all of them at the last step."""
    if step >= steps - 1:
        return n_open
    timesteps = torch.linspace(1, eps, steps + 1)
    t, s = timesteps[step], timesteps[step + 1]
    return int(torch.tensor(n_open, dtype=torch.float32) * (1 - s / t))


def commit_count(state: RequestState, n_open: int) -> int:
    """How many of the block's `n_open` positions this step commits under the request's schedule (at least 1),
    advancing `state.schedule_step` past the "linspace" steps that would commit none (see the module docstring)."""
    params = state.params
    if params.schedule == "uniform":
        return max(1, math.ceil(n_open / state.steps_left_in_block()))
    steps = state.budget[state.block]
    step = state.schedule_step
    k = linspace_count(n_open, step, steps, params.schedule_eps)
    while k == 0:
        step += 1
        k = linspace_count(n_open, step, steps, params.schedule_eps)
    state.schedule_step = step + 1
    return k


class QuotaPolicy:
    """Commit the `commit_count` highest-scoring open positions of the block (the request's schedule)."""

    name = "quota"
    spends_step_budget: ClassVar[bool] = True

    @classmethod
    def from_params(cls, params: SamplingParams) -> QuotaPolicy:
        return cls()

    def score(self, stats: RowStats) -> torch.Tensor:
        raise NotImplementedError

    def select(self, stats: RowStats, state: RequestState) -> Selection:
        k = commit_count(state, len(stats))
        score, tau = self.score(stats), state.params.order_temperature
        if tau > 0:
            return _drawn_rows(score, _committable(stats), k, tau, noise=_order_noise(state, len(stats)))
        return _top_rows(score, _committable(stats), k)


ORDER_SALT = 0x6F72646572  # keeps the order draws' noise apart from the token noise of the same step


def _order_noise(state: RequestState, rows: int) -> torch.Tensor:
    """float64 [rows] Gumbel noise on the host for the order draw of the request's step: hashed from its seed, step
    and row (kernels.hashed_noise), so it needs no device and does not depend on the batch."""
    row_key = noise_row_key(state.seed ^ ORDER_SALT, state.nfe)
    keys = torch.tensor([noise_key(row_key, r) for r in range(rows)], dtype=torch.long)
    return hashed_gumbel_noise(keys, 1, torch.float64)[:, 0]


def _drawn_rows(score: torch.Tensor, ok: torch.Tensor, k: int, tau: float,
                generator: torch.Generator | None = None, *, noise: torch.Tensor | None = None) -> Selection:
    """k committable rows drawn without replacement with probabilities softmax(score / tau) (Dream's alg_temp):
    the k largest score / tau + Gumbel noise, which samples that sequence exactly (the Gumbel-top-k trick); the
    noise is `noise` (float64 [rows]) or drawn from `generator`."""
    if noise is None:
        noise = gumbel_noise(tuple(score.shape), generator, score.device, torch.float64)
    drawn = _top_rows(score.double() / tau + noise, ok, k).commit
    return Selection(commit=drawn, scores=score.double()[drawn].tolist())


class LowConfidenceQuota(QuotaPolicy):
    """LLaDA low-confidence remasking (Dream `alg="maskgit_plus"`): score = p(chosen token); keep the most
    confident, remask the rest."""

    name = "quota"

    def score(self, stats: RowStats) -> torch.Tensor:
        return stats.prob


class EntropyOrder(QuotaPolicy):
    """Dream `alg="entropy"`: score = -H(p) = sum_t p_t log p_t; the most certain positions go first."""

    name = "entropy"

    def score(self, stats: RowStats) -> torch.Tensor:
        return -stats.entropy


class MarginOrder(QuotaPolicy):
    """Dream `alg="topk_margin"`: score = p_(1) - p_(2); positions with a clear winner go first."""

    name = "margin"

    def score(self, stats: RowStats) -> torch.Tensor:
        return stats.margin


@dataclass
class ConfidenceThreshold:
    """Fast-dLLM parallel decoding: commit every open position of the block with p(chosen) > tau, and at
    least the single most confident one, so each forward makes progress."""

    tau: float = 0.9
    name: str = "threshold"
    spends_step_budget: ClassVar[bool] = False

    @classmethod
    def from_params(cls, params: SamplingParams) -> ConfidenceThreshold:
        return cls(tau=params.threshold)

    def select(self, stats: RowStats, state: RequestState) -> Selection:
        ok = _committable(stats)
        k = int(((stats.prob > self.tau) & ok).sum())
        return _top_rows(stats.prob, ok, max(1, k))


@dataclass
class EntropyBound:
    """DiffusionGemma's entropy-bound acceptance (EB-sampler, arXiv 2505.24857) with re-noising.

    Sort open positions by entropy ascending, H_(1) <= H_(2) <= ...; accept the longest prefix k with
    sum_{i<=k} H_(i) - max_{i<=k} H_(i) = sum_{i<k} H_(i) <= gamma (an upper bound on the joint mutual
    information of the accepted tokens, so they are approximately independent); the first is always
    accepted. Every other open position of the block is re-noised: back to the mask token for masked
    models, a fresh noise token for uniform-state models. Unlike transformers' sampler, accepted tokens
    stay final (constraints need a monotone canvas).
    """

    gamma: float = 0.1
    name: str = "entropy_bound"
    spends_step_budget: ClassVar[bool] = False

    @classmethod
    def from_params(cls, params: SamplingParams) -> EntropyBound:
        return cls(gamma=params.entropy_bound)

    def select(self, stats: RowStats, state: RequestState) -> Selection:
        ok = _committable(stats)
        entropy = stats.entropy.double().masked_fill(~ok, float("inf"))
        order = torch.sort(entropy, stable=True).indices
        sorted_h = entropy[order]
        cum = torch.cumsum(sorted_h, 0)
        accept = (cum - sorted_h) <= self.gamma
        accept &= torch.isfinite(sorted_h)
        n_ok = int(ok.sum())
        k = max(min(1, n_ok), int(accept.sum()))
        commit = order[:k]
        renoise = [r for r in order[k:].tolist() if bool(ok[r])]
        return Selection(commit=commit.tolist(), scores=(-sorted_h[:k]).tolist(), renoise=renoise)


# the policies by name (`SamplingParams.policy`); each makes itself from the request's parameters (`from_params`)
POLICIES: dict[str, type[CommitPolicy]] = {
    "quota": LowConfidenceQuota,
    "threshold": ConfidenceThreshold,
    "entropy": EntropyOrder,
    "margin": MarginOrder,
    "entropy_bound": EntropyBound,
}
POLICY_NAMES = tuple(POLICIES)


def make_policy(params: SamplingParams) -> CommitPolicy:
    """The policy object for `params.policy` (from `POLICIES`)."""
    policy = POLICIES.get(params.policy)
    if policy is None:
        raise InvalidRequestError(f"unknown policy {params.policy!r}")
    return policy.from_params(params)
