"""Commit policies: given the statistics of the active block's open positions, which ones become final.

Each policy does one thing: `select(stats, state) -> Selection`, where `stats` holds one row per open
position of the active block (left to right) and the selection names rows, best first. Every policy
commits at least one row per call, so the loop always terminates. Scores (higher = commit first) are also
what constraint joint verification keeps greedily.

Quota policies (LLaDA and Dream) commit k = ceil(n_open / steps_left) rows per step. On an untouched
block this reproduces LLaDA's `get_num_transfer_tokens` schedule exactly (the remainder goes to the first
steps), and it adapts when forced tokens or remasks change the number of open positions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

from dllm_constrain.engine.sampling import RowStats
from dllm_constrain.engine.state import RequestState, SamplingParams
from dllm_constrain.errors import InvalidRequestError


@dataclass
class Selection:
    """Rows to commit (best first, with their scores) and rows to re-noise (entropy-bound only)."""

    commit: list[int]
    scores: list[float]
    renoise: list[int] = field(default_factory=list)


class CommitPolicy(Protocol):
    name: str

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


class QuotaPolicy:
    """Commit the k = ceil(open / steps_left) highest-scoring open positions of the block."""

    name = "quota"

    def score(self, stats: RowStats) -> torch.Tensor:
        raise NotImplementedError

    def select(self, stats: RowStats, state: RequestState) -> Selection:
        k = math.ceil(len(stats) / state.steps_left_in_block())
        return _top_rows(self.score(stats), _committable(stats), max(1, k))


class LowConfidenceQuota(QuotaPolicy):
    """LLaDA low-confidence remasking: score = p(chosen token); keep the most confident, remask the rest."""

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


def make_policy(params: SamplingParams) -> CommitPolicy:
    """The policy object for `params.policy`."""
    if params.policy == "quota":
        return LowConfidenceQuota()
    if params.policy == "threshold":
        return ConfidenceThreshold(tau=params.threshold)
    if params.policy == "entropy":
        return EntropyOrder()
    if params.policy == "margin":
        return MarginOrder()
    if params.policy == "entropy_bound":
        return EntropyBound(gamma=params.entropy_bound)
    raise InvalidRequestError(f"unknown policy {params.policy!r}")
