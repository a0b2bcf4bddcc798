"""Specification of `reduce_logits`, the one seam between logits and the commit policies."""
from __future__ import annotations

import math

import torch

from dllm_constrain.engine.sampling import reduce_logits


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_greedy_picks_the_argmax_and_draws_no_noise() -> None:
    """Temperature 0 is plain argmax; it must not consume the request's random stream."""
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, -1.0, 0.5]])
    gen = _gen(0)
    before = gen.get_state()
    stats = reduce_logits(logits, None, 0.0, gen)
    assert stats.token.tolist() == [1, 0]
    assert torch.equal(gen.get_state(), before)


def test_gumbel_sampling_follows_softmax_of_logits_over_temperature() -> None:
    """argmax(l/T + Gumbel) is a sample of softmax(l/T): empirical frequencies match it."""
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    temperature = 2.0
    expected = torch.softmax(logits / temperature, -1)
    tokens = reduce_logits(logits.expand(20000, -1), None, temperature, _gen(1)).token
    freq = torch.bincount(tokens, minlength=4).double() / 20000
    assert torch.allclose(freq, expected.double(), atol=0.015)


def test_same_seed_same_samples_and_other_seed_other_samples() -> None:
    """Sampling is a pure function of the request's seed."""
    logits = torch.zeros(64, 50)
    a = reduce_logits(logits, None, 1.0, _gen(7)).token
    b = reduce_logits(logits, None, 1.0, _gen(7)).token
    c = reduce_logits(logits, None, 1.0, _gen(8)).token
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_disallowed_tokens_are_never_chosen_and_probabilities_are_renormalised() -> None:
    """The allowed mask is applied before anything else: stats describe the constrained distribution."""
    logits = torch.tensor([[5.0, 1.0, 1.0, 0.0]])
    allowed = torch.tensor([[False, True, True, False]])
    for seed in range(20):
        stats = reduce_logits(logits, allowed, 1.0, _gen(seed))
        assert stats.token.item() in (1, 2)
        assert math.isclose(stats.prob.item(), 0.5, rel_tol=1e-6)


def test_entropy_and_margin_of_a_known_distribution() -> None:
    """entropy = -sum p log p; margin = p_(1) - p_(2); prob = p(chosen)."""
    p = torch.tensor([0.6, 0.3, 0.1])
    stats = reduce_logits(p.log()[None], None, 0.0, None)
    assert stats.token.item() == 0
    assert math.isclose(stats.prob.item(), 0.6, rel_tol=1e-5)
    assert math.isclose(stats.entropy.item(), float(-(p * p.log()).sum()), rel_tol=1e-5)
    assert math.isclose(stats.margin.item(), 0.3, rel_tol=1e-5)


def test_a_single_allowed_token_has_full_confidence_zero_entropy_and_full_margin() -> None:
    """A forced row is certain: prob 1, entropy 0, margin 1."""
    allowed = torch.tensor([[False, False, True]])
    stats = reduce_logits(torch.randn(1, 3), allowed, 0.7, _gen(0))
    assert stats.token.item() == 2
    assert stats.prob.item() == 1.0 and stats.entropy.item() == 0.0 and stats.margin.item() == 1.0


def test_a_row_with_no_allowed_token_is_marked_uncommittable() -> None:
    """Token -1 tells every policy to skip the row instead of committing garbage."""
    allowed = torch.tensor([[False, False], [True, False]])
    stats = reduce_logits(torch.zeros(2, 2), allowed, 0.0, None)
    assert stats.token.tolist() == [-1, 0]
    assert stats.prob[0].item() == 0.0 and math.isinf(stats.entropy[0].item())


def test_huge_logits_do_not_overflow() -> None:
    """Log-space Gumbel: LLaDA's exp(l)/(-log U)^T form would overflow float64 at l > 709."""
    logits = torch.tensor([[1000.0, 999.0, -1000.0]])
    stats = reduce_logits(logits, None, 1.0, _gen(0))
    assert stats.token.item() in (0, 1)
    assert torch.isfinite(stats.prob).all() and torch.isfinite(stats.entropy).all()


def test_row_chunks_give_the_same_stats_as_the_whole() -> None:
    """Reductions are per row, so the engine may split rows into chunks freely (greedy case)."""
    logits = torch.randn(10, 30, generator=_gen(3))
    whole = reduce_logits(logits, None, 0.0, None)
    parts = [reduce_logits(logits[i:i + 3], None, 0.0, None) for i in range(0, 10, 3)]
    for name in ("token", "prob", "entropy", "margin"):
        assert torch.equal(getattr(whole, name), torch.cat([getattr(p, name) for p in parts]))
