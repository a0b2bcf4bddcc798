"""Specification of the commit policies: which open positions of the active block become final."""
from __future__ import annotations

import math

import torch

from dllm_constrain.engine.policies import (
    ConfidenceThreshold,
    EntropyBound,
    EntropyOrder,
    LowConfidenceQuota,
    MarginOrder,
    get_num_transfer_tokens,
    make_policy,
)
from dllm_constrain.engine.sampling import RowStats
from dllm_constrain.engine.state import RequestState, SamplingParams


def _state(open_positions: int, steps: int, block_step: int = 0) -> RequestState:
    """A one-block request with `steps` steps, `block_step` of them already spent."""
    params = SamplingParams(max_new_tokens=open_positions, block_length=open_positions, steps=steps)
    return RequestState(index=0, prompt_ids=[0], params=params, canvas=torch.full((open_positions,), 3),
                        committed=torch.zeros(open_positions, dtype=torch.bool), generator=None,
                        block_step=block_step)


def _stats(prob: list[float], entropy: list[float] | None = None, margin: list[float] | None = None,
           token: list[int] | None = None) -> RowStats:
    n = len(prob)
    return RowStats(
        token=torch.tensor(token if token is not None else [10 + i for i in range(n)]),
        prob=torch.tensor(prob),
        entropy=torch.tensor(entropy if entropy is not None else [0.0] * n),
        margin=torch.tensor(margin if margin is not None else [0.0] * n),
    )


def test_llada_transfer_schedule_spreads_the_remainder_over_the_first_steps() -> None:
    assert get_num_transfer_tokens(10, 4) == [3, 3, 2, 2]
    assert get_num_transfer_tokens(8, 8) == [1] * 8


def test_quota_policy_reproduces_the_llada_schedule_on_an_untouched_block() -> None:
    """k = ceil(open / steps_left) step after step equals get_num_transfer_tokens(open, steps)."""
    n, steps = 10, 4
    open_now, ks = n, []
    for step in range(steps):
        sel = LowConfidenceQuota().select(_stats([0.5] * open_now), _state(n, steps, block_step=step))
        ks.append(len(sel.commit))
        open_now -= len(sel.commit)
    assert ks == get_num_transfer_tokens(n, steps)


def test_low_confidence_quota_commits_the_most_confident_positions() -> None:
    sel = LowConfidenceQuota().select(_stats([0.2, 0.9, 0.5, 0.7]), _state(4, 2))
    assert sel.commit == [1, 3]
    assert sel.scores == sorted(sel.scores, reverse=True)


def test_quota_commits_everything_left_when_the_budget_is_spent() -> None:
    """A remask can outlast the step budget; the last step then commits all open positions."""
    sel = LowConfidenceQuota().select(_stats([0.2, 0.9, 0.5]), _state(3, 2, block_step=5))
    assert sorted(sel.commit) == [0, 1, 2]


def test_threshold_commits_every_position_above_tau() -> None:
    sel = ConfidenceThreshold(tau=0.8).select(_stats([0.85, 0.2, 0.95, 0.81]), _state(4, 1))
    assert sel.commit == [2, 0, 3]


def test_threshold_commits_the_best_position_when_none_clears_tau() -> None:
    """Fast-dLLM's at-least-one rule: every forward makes progress."""
    sel = ConfidenceThreshold(tau=0.99).select(_stats([0.3, 0.6, 0.1]), _state(3, 1))
    assert sel.commit == [1]


def test_entropy_order_commits_the_lowest_entropy_positions() -> None:
    sel = EntropyOrder().select(_stats([0.5] * 4, entropy=[2.0, 0.1, 1.0, 0.5]), _state(4, 2))
    assert sel.commit == [1, 3]


def test_margin_order_commits_the_largest_top1_top2_margins() -> None:
    sel = MarginOrder().select(_stats([0.5] * 4, margin=[0.1, 0.8, 0.3, 0.05]), _state(4, 2))
    assert sel.commit == [1, 2]


def test_entropy_bound_accepts_the_prefix_whose_entropy_sum_without_its_max_stays_under_gamma() -> None:
    """Sorted entropies 0.01, 0.04, 0.05, 0.5, 1.0 with gamma 0.1: partial sums before each are
    0, 0.01, 0.05, 0.10, 0.60, so four are accepted and the last one is re-noised."""
    entropy = [0.5, 0.01, 1.0, 0.05, 0.04]
    sel = EntropyBound(gamma=0.1).select(_stats([0.5] * 5, entropy=entropy), _state(5, 1))
    assert sel.commit == [1, 4, 3, 0]
    assert sel.renoise == [2]


def test_entropy_bound_always_accepts_the_most_certain_position() -> None:
    sel = EntropyBound(gamma=0.01).select(_stats([0.5] * 3, entropy=[3.0, 2.0, 4.0]), _state(3, 1))
    assert sel.commit == [1]
    assert sorted(sel.renoise) == [0, 2]


def test_no_policy_commits_a_row_without_allowed_tokens() -> None:
    """Token -1 marks a row whose constrained distribution is empty."""
    stats = _stats([0.99, 0.1], entropy=[0.0, 1.0], margin=[0.99, 0.0], token=[-1, 12])
    for policy in ("quota", "threshold", "entropy", "margin", "entropy_bound"):
        sel = make_policy(SamplingParams(policy=policy)).select(stats, _state(2, 1))
        assert sel.commit == [1], policy
        assert 0 not in sel.renoise


def test_ties_are_broken_left_to_right() -> None:
    """Equal scores commit the left-most position first, so runs are reproducible."""
    sel = LowConfidenceQuota().select(_stats([0.5, 0.5, 0.5]), _state(3, 3))
    assert sel.commit == [0]
    assert math.isclose(sel.scores[0], 0.5)
