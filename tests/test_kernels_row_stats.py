"""The fused masked row-statistics kernels, run by Triton's CPU interpreter against the plain-torch reference.

TRITON_INTERPRET=1 is set for this module only (a module fixture restores it); the kernel loader re-imports the
kernel sources when the flag changes, and every Triton call asserts that the kernel path really ran.
"""
from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_constrain.kernels import _backend, hashed_noise
from dllm_constrain.kernels import masked_row_stats as mrs
from dllm_constrain.kernels.masked_row_stats import (
    RowStats,
    RowStatsWorkspace,
    budgeted_row_stats_from_hidden,
    masked_row_stats,
    masked_row_stats_from_hidden,
    pack_bool_mask,
    reference_masked_row_stats,
    reference_masked_row_stats_from_hidden,
    rows_per_chunk,
    unpack_bitmask,
)

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ATOL = 2e-6


@pytest.fixture(scope="module", autouse=True)
def interpreter():
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    yield
    if old is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = old


def run_triton(fn, *args, **kwargs) -> RowStats:
    """Call a dispatcher on the forced Triton path and check the interpreted kernel (not torch) ran."""
    out = fn(*args, backend="triton", **kwargs)
    assert _backend.last_backend(fn.__name__) == "triton"
    mod = _backend.load_kernels(mrs._KERNEL_MODULE)
    assert mod.INTERPRETED is True
    assert type(mod.masked_row_stats_kernel).__name__ == "InterpretedFunction"
    return out


def assert_stats_close(a: RowStats, b: RowStats, atol: float = ATOL, rtol: float = 1e-5) -> None:
    assert a.token.dtype == torch.long and b.token.dtype == torch.long
    assert torch.equal(a.token, b.token), (a.token, b.token)
    for name in ("prob", "entropy", "margin"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == torch.float32
        torch.testing.assert_close(x, y, atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}")


@st.composite
def chunks(draw, max_rows=8, max_vocab=300):
    rows = draw(st.integers(1, max_rows))
    vocab = draw(st.integers(1, max_vocab))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    scale = draw(st.sampled_from([0.5, 3.0, 20.0]))
    logits = torch.randn(rows, vocab, generator=g) * scale
    mask_kind = draw(st.sampled_from(["none", "bool", "packed", "all"]))
    density = draw(st.sampled_from([0.02, 0.3, 0.9]))
    allowed = torch.rand(rows, vocab, generator=g) < density
    if draw(st.booleans()):
        allowed[draw(st.integers(0, rows - 1))] = False  # a fully masked row: the sentinel values
    if mask_kind == "none":
        mask = None
    elif mask_kind == "all":
        mask = pack_bool_mask(torch.ones(rows, vocab, dtype=torch.bool))
    elif mask_kind == "bool":
        mask = allowed
    else:
        mask = pack_bool_mask(allowed)
    temperature = draw(st.sampled_from([0.0, 0.0, 0.5, 1.0, 1.7]))
    splits = draw(st.sampled_from([1, 2, 3]))
    return logits, mask, temperature, seed, splits


# ------------------------------------------------------------------------------------------------------ masks


@given(st.integers(1, 3), st.integers(1, 200), st.integers(0, 2**31 - 1))
@settings(max_examples=40, deadline=None)
def test_pack_unpack_roundtrip_and_layout(rows, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    allowed = torch.rand(rows, vocab, generator=g) < 0.5
    packed = pack_bool_mask(allowed)
    assert packed.dtype == torch.int32 and packed.shape == (rows, (vocab + 31) // 32)
    assert torch.equal(unpack_bitmask(packed, vocab), allowed)
    for r in range(rows):  # xgrammar layout: bit j of word w allows token 32 w + j
        for tok in range(vocab):
            word = int(packed[r, tok // 32]) & 0xFFFFFFFF
            assert bool((word >> (tok % 32)) & 1) == bool(allowed[r, tok])
        for tok in range(vocab, packed.shape[1] * 32):  # bits past the vocabulary are 0
            assert (int(packed[r, tok // 32]) >> (tok % 32)) & 1 == 0


def test_sign_bit_word():
    allowed = torch.zeros(1, 32, dtype=torch.bool)
    allowed[0, 31] = True
    assert pack_bool_mask(allowed).item() == -(2**31)
    assert pack_bool_mask(torch.ones(1, 32, dtype=torch.bool)).item() == -1


# --------------------------------------------------------------------------------------------- logits kernel


@given(chunks())
@SETTINGS
def test_kernel_matches_reference(case):
    logits, mask, temperature, seed, splits = case
    ref = reference_masked_row_stats(logits, mask, temperature, torch.Generator().manual_seed(seed))
    got = run_triton(masked_row_stats, logits, mask, temperature, torch.Generator().manual_seed(seed),
                     num_splits=splits)
    assert_stats_close(got, ref)


@given(chunks(max_rows=4, max_vocab=200))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_kernel_bf16_logits(case):
    logits, mask, temperature, seed, splits = case
    logits = logits.to(torch.bfloat16)
    ref = reference_masked_row_stats(logits, mask, temperature, torch.Generator().manual_seed(seed))
    got = run_triton(masked_row_stats, logits, mask, temperature, torch.Generator().manual_seed(seed),
                     num_splits=splits)
    assert_stats_close(got, ref)


def test_statistics_have_their_closed_form():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 5.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    allowed = torch.tensor([[True, True, True, True, False], [True, True, False, False, False]])
    got = run_triton(masked_row_stats, logits, allowed, 0.0, None)
    p = torch.softmax(torch.tensor([2.0, 1.0, 0.0, -1.0]), -1)
    assert got.token.tolist() == [0, 0]  # 5.0 is masked out; the tie in row 1 goes to index 0
    torch.testing.assert_close(got.prob, torch.tensor([p[0], 0.5]), atol=ATOL, rtol=0)
    torch.testing.assert_close(got.entropy, torch.tensor([-(p * p.log()).sum(), math.log(2)]), atol=ATOL, rtol=0)
    torch.testing.assert_close(got.margin, torch.tensor([p[0] - p[1], 0.0]), atol=ATOL, rtol=0)


@pytest.mark.parametrize("splits", [1, 4])
def test_ties_lowest_index_wins(splits):
    g = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 3, (8, 257), generator=g).float()  # many exact ties, across tile boundaries
    logits[3] = 1.0  # a constant row: token 0
    logits[4, 200] = 7.0
    logits[4, 64] = 7.0  # tie between tiles: the earlier tile wins
    ref_tok = logits.argmax(-1)
    got = run_triton(masked_row_stats, logits, None, 0.0, None, num_splits=splits)
    assert torch.equal(got.token, ref_tok)
    assert got.token[3] == 0 and got.token[4] == 64
    # sampling path with zero noise: scores x / T tie exactly like the logits
    zero = torch.zeros(8, 257, dtype=torch.float64)
    got = run_triton(masked_row_stats, logits, None, 0.7, None, noise=zero, num_splits=splits)
    assert torch.equal(got.token, ref_tok)
    # ties with a mask: the lowest allowed index among the maxima
    allowed = torch.ones(8, 257, dtype=torch.bool)
    allowed[4, 64] = False
    got = run_triton(masked_row_stats, logits, allowed, 0.0, None, num_splits=splits)
    assert got.token[4] == 200
    assert torch.equal(got.token, logits.masked_fill(~allowed, float("-inf")).argmax(-1))


def test_fully_allowed_mask_equals_no_mask():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 300, generator=g)
    everything = pack_bool_mask(torch.ones(5, 300, dtype=torch.bool))
    for t in (0.0, 1.0):
        a = run_triton(masked_row_stats, logits, everything, t, torch.Generator().manual_seed(2), num_splits=2)
        b = run_triton(masked_row_stats, logits, None, t, torch.Generator().manual_seed(2), num_splits=2)
        assert torch.equal(a.token, b.token)
        for name in ("prob", "entropy", "margin"):
            assert torch.equal(getattr(a, name), getattr(b, name))


def test_fully_masked_row_sentinels_and_single_token_rows():
    logits = torch.randn(3, 70)
    allowed = torch.zeros(3, 70, dtype=torch.bool)
    allowed[1, 69] = True
    allowed[2, 5] = True
    for t in (0.0, 1.0):
        for stats in (reference_masked_row_stats(logits, allowed, t, torch.Generator().manual_seed(0)),
                      run_triton(masked_row_stats, logits, allowed, t, torch.Generator().manual_seed(0))):
            assert stats.token.tolist() == [-1, 69, 5]
            assert stats.prob.tolist() == [0.0, 1.0, 1.0]
            assert stats.entropy[0].item() == math.inf and stats.entropy[1:].abs().max().item() < 1e-6
            assert stats.margin.tolist() == [0.0, 1.0, 1.0]


def test_sampling_uses_the_generator_stream_like_the_engine():
    """Precomputed noise and generator-drawn noise give the same tokens; different seeds give different draws."""
    logits = torch.zeros(6, 300)  # uniform: the token is decided by the noise alone
    noise = mrs.gumbel_noise((6, 300), torch.Generator().manual_seed(5), torch.device("cpu"))
    a = run_triton(masked_row_stats, logits, None, 1.0, None, noise=noise)
    b = run_triton(masked_row_stats, logits, None, 1.0, torch.Generator().manual_seed(5))
    c = run_triton(masked_row_stats, logits, None, 1.0, torch.Generator().manual_seed(6))
    assert torch.equal(a.token, b.token) and torch.equal(a.token, noise.argmax(-1))
    assert not torch.equal(a.token, c.token)


def test_drop_in_for_engine_reduce_logits():
    sampling = pytest.importorskip("dllm_constrain.engine.sampling")
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(7, 300, generator=g) * 4
    allowed = torch.rand(7, 300, generator=g) < 0.2
    allowed[2] = False
    allowed[3] = True
    for t in (0.0, 0.8):
        want = sampling.reduce_logits(logits, allowed, t, torch.Generator().manual_seed(3))
        for stats in (masked_row_stats(logits, allowed, t, torch.Generator().manual_seed(3), backend="torch"),
                      run_triton(masked_row_stats, logits, allowed, t, torch.Generator().manual_seed(3),
                                 num_splits=3)):
            assert torch.equal(stats.token, want.token)
            for name in ("prob", "entropy", "margin"):
                torch.testing.assert_close(getattr(stats, name), getattr(want, name), atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------- hidden kernel


def assert_tokens_equal_up_to_near_ties(got, ref, logits, mask, temperature, noise):
    """Kernel and torch compute logits with different summation orders: a token may differ only on a near-tie."""
    x = logits.clone()
    if mask is not None:
        allowed = mask if mask.dtype == torch.bool else unpack_bitmask(mask, logits.shape[1])
        x = x.masked_fill(~allowed, float("-inf"))
    score = x.double() if temperature == 0 else x.double() / temperature + noise
    for r in range(x.shape[0]):
        if got.token[r] == ref.token[r]:
            continue
        assert got.token[r] >= 0 and ref.token[r] >= 0
        assert score[r, ref.token[r]] - score[r, got.token[r]] < 1e-4


@given(chunks(max_rows=8, max_vocab=300), st.integers(1, 64), st.sampled_from(["float32", "bfloat16"]))
@SETTINGS
def test_hidden_kernel_matches_reference(case, dim, dtype):
    logits_unused, mask, temperature, seed, splits = case
    rows, vocab = logits_unused.shape
    dtype = getattr(torch, dtype)
    g = torch.Generator().manual_seed(seed + 1)
    hidden = torch.randn(rows, dim, generator=g).to(dtype)
    weight = (torch.randn(vocab, dim, generator=g) * (3.0 / math.sqrt(dim))).to(dtype)
    noise = mrs.gumbel_noise((rows, vocab), torch.Generator().manual_seed(seed), torch.device("cpu")) \
        if temperature > 0 else None
    ref = reference_masked_row_stats_from_hidden(hidden, weight, mask, temperature, noise=noise)
    got = run_triton(masked_row_stats_from_hidden, hidden, weight, mask, temperature, noise=noise,
                     num_splits=splits)
    logits = hidden.float() @ weight.float().T
    assert_tokens_equal_up_to_near_ties(got, ref, logits, mask, temperature, noise)
    same = got.token == ref.token
    for name in ("prob", "entropy", "margin"):
        torch.testing.assert_close(getattr(got, name)[same], getattr(ref, name)[same], atol=2e-5, rtol=2e-5)


def test_hidden_kernel_equals_logits_kernel_on_exact_logits():
    """Integer-valued hidden and weights make every logit exact, so both kernels see identical logits."""
    g = torch.Generator().manual_seed(4)
    hidden = torch.randint(-2, 3, (6, 40), generator=g).float()
    weight = torch.randint(-2, 3, (300, 40), generator=g).float()
    logits = hidden @ weight.T
    allowed = torch.rand(6, 300, generator=g) < 0.5
    for t in (0.0, 1.5):
        a = run_triton(masked_row_stats_from_hidden, hidden, weight, allowed, t, torch.Generator().manual_seed(9),
                       num_splits=2)
        b = run_triton(masked_row_stats, logits, allowed, t, torch.Generator().manual_seed(9), num_splits=3)
        c = reference_masked_row_stats(logits, allowed, t, torch.Generator().manual_seed(9))
        assert_stats_close(a, b)
        assert_stats_close(a, c)


# ------------------------------------------------------------------------------------------ dispatch, budgets


def test_dispatch_auto_is_torch_on_cpu_and_forced_triton_needs_interpreter(monkeypatch):
    logits = torch.randn(2, 50)
    masked_row_stats(logits)
    assert _backend.last_backend("masked_row_stats") == "torch"
    monkeypatch.setenv("DLLM_CONSTRAIN_KERNEL_BACKEND", "triton")
    masked_row_stats(logits)
    assert _backend.last_backend("masked_row_stats") == "triton"
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        masked_row_stats(logits, backend="triton")
    with pytest.raises(ValueError):
        masked_row_stats(logits, backend="cuda")


def test_triton_path_never_calls_the_torch_reference(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("torch path ran")

    monkeypatch.setattr(mrs, "_torch_stats", boom)
    hidden, weight = torch.randn(3, 16), torch.randn(100, 16)
    run_triton(masked_row_stats, torch.randn(3, 100), None, 1.0, None)
    run_triton(masked_row_stats_from_hidden, hidden, weight, None, 0.0, None)
    with pytest.raises(AssertionError, match="torch path ran"):
        masked_row_stats(torch.randn(3, 100), backend="torch")


def test_bad_arguments():
    logits = torch.randn(2, 40)
    with pytest.raises(ValueError):
        masked_row_stats(logits, temperature=-1.0)
    with pytest.raises(ValueError):
        masked_row_stats(logits, torch.zeros(2, 1, dtype=torch.int32))  # 1 word < ceil(40 / 32)
    with pytest.raises(ValueError):
        masked_row_stats(logits, torch.ones(2, 39, dtype=torch.bool))
    with pytest.raises(ValueError):
        masked_row_stats(logits.view(1, 2, 40))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_budgeted_chunks_equal_one_shot(temperature):
    g = torch.Generator().manual_seed(8)
    hidden = torch.randn(37, 16, generator=g)
    weight = torch.randn(1000, 16, generator=g) * 0.5
    allowed = pack_bool_mask(torch.rand(37, 1000, generator=g) < 0.3)
    budget = 3 * mrs.workspace_bytes_per_row(1000, sampling=temperature > 0, fused=False)
    assert rows_per_chunk(1000, budget, sampling=temperature > 0) == 3
    one = masked_row_stats_from_hidden(hidden, weight, allowed, temperature, torch.Generator().manual_seed(1),
                                       backend="torch")
    chunked = budgeted_row_stats_from_hidden(hidden, weight, allowed, temperature, torch.Generator().manual_seed(1),
                                             budget_bytes=budget, backend="torch")
    assert torch.equal(one.token, chunked.token)
    for name in ("prob", "entropy", "margin"):
        torch.testing.assert_close(getattr(one, name), getattr(chunked, name), atol=1e-6, rtol=1e-6)
    tri = budgeted_row_stats_from_hidden(hidden[:20], weight, allowed[:20], temperature,
                                         torch.Generator().manual_seed(1), budget_bytes=budget, backend="triton")
    assert _backend.last_backend("masked_row_stats_from_hidden") == "triton"
    one = masked_row_stats_from_hidden(hidden[:20], weight, allowed[:20], temperature,
                                       torch.Generator().manual_seed(1), backend="torch")
    assert torch.equal(one.token, tri.token)


def test_workspace_reuse_gives_fresh_results():
    """One workspace across calls of different sizes, masks and temperatures: same results as fresh buffers."""
    ws = RowStatsWorkspace()
    g = torch.Generator().manual_seed(12)
    cases = ((6, 300, 0.0, "packed"), (2, 37, 1.0, "bool"), (9, 300, 0.5, None), (3, 1, 0.0, "bool"))
    for rows, vocab, t, kind in cases:
        logits = torch.randn(rows, vocab, generator=g)
        allowed = torch.rand(rows, vocab, generator=g) < 0.5
        allowed[:, 0] = True
        mask = None if kind is None else (allowed if kind == "bool" else pack_bool_mask(allowed))
        fresh = reference_masked_row_stats(logits, mask, t, torch.Generator().manual_seed(rows))
        reused = masked_row_stats(logits, mask, t, torch.Generator().manual_seed(rows), backend="torch", workspace=ws)
        assert_stats_close(reused, fresh, atol=0, rtol=0)
        tri = run_triton(masked_row_stats, logits, mask, t, torch.Generator().manual_seed(rows), workspace=ws)
        assert_stats_close(tri, fresh)
    assert ws.nbytes > 0


def test_default_budget_is_clamped_fraction_of_free_memory():
    b = mrs.default_budget_bytes("cpu")
    assert 64 << 20 <= b <= 1 << 30
    assert mrs.default_budget_bytes("cpu", fraction=1e-9) == 64 << 20
    assert mrs.default_budget_bytes("cpu", fraction=1.0, ceiling=100 << 20) == 100 << 20
    assert rows_per_chunk(126_464, b) >= 1


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 300), st.floats(0.5, 200.0), st.integers(0, 2**31 - 1))
def test_masked_statistics_equal_the_closed_form_on_the_allowed_tokens(rows, vocab, spread, seed):
    """With a mask, each statistic is the float64 closed form over the allowed tokens alone (disallowed tokens weigh
    exactly nothing), also for logits far below their row's maximum (the masked path's exp floor)."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.rand(rows, vocab, generator=g) * -spread).float()
    allowed = torch.rand(rows, vocab, generator=g) < 0.3
    allowed[:, 0] = True
    got = reference_masked_row_stats(logits, pack_bool_mask(allowed), 0.0, None)
    for r in range(rows):
        x = logits[r].double()[allowed[r]]
        ids = allowed[r].nonzero().flatten()
        p = torch.softmax(x, -1)
        assert got.token[r].item() == ids[int(x.argmax())].item()
        assert got.prob[r].item() == pytest.approx(float(p.max()), abs=1e-6)
        logp = torch.log_softmax(x, -1)
        assert got.entropy[r].item() == pytest.approx(float(-(p * logp).sum()), abs=1e-5)
        top = p.topk(min(2, p.numel())).values
        assert got.margin[r].item() == pytest.approx(float(top[0] - (top[1] if top.numel() > 1 else 0.0)), abs=1e-6)


@given(seed=st.integers(0, 2**63 - 1), step=st.integers(0, 10_000), positions=st.lists(st.integers(0, 4095), min_size=1,
                                                                                      max_size=6))
@settings(max_examples=25, deadline=None)
def test_hashed_noise_of_a_row_depends_on_its_key_alone(seed: int, step: int, positions: list[int]) -> None:
    keys = torch.tensor([hashed_noise.noise_key(hashed_noise.noise_row_key(seed, step), p) for p in positions])
    together = hashed_noise.hashed_gumbel_noise(keys, 257)
    for r in range(len(positions)):
        assert torch.equal(hashed_noise.hashed_gumbel_noise(keys[r:r + 1], 257)[0], together[r])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_hashed_noise_is_standard_gumbel(dtype: torch.dtype) -> None:
    keys = torch.tensor([hashed_noise.noise_key(hashed_noise.noise_row_key(3, 1), p) for p in range(16)])
    g = hashed_noise.hashed_gumbel_noise(keys, 20_000, dtype).double()
    assert torch.isfinite(g).all()
    assert abs(g.mean().item() - 0.5772) < 0.01  # Euler-Mascheroni
    assert abs(g.var().item() - torch.pi ** 2 / 6) < 0.03
    # samples of softmax(logits): Gumbel-max picks token j with frequency p_j
    logits = torch.tensor([0.0, 1.0, 2.0])
    picks = (logits + hashed_noise.hashed_gumbel_noise(torch.arange(30_000), 3, dtype)).argmax(-1)
    freq = torch.bincount(picks, minlength=3).double() / picks.numel()
    assert torch.allclose(freq, torch.softmax(logits.double(), 0), atol=0.01)
