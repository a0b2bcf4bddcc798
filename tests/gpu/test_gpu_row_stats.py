"""The fused LM-head kernel (hidden x head in registers, mask, row statistics) against the torch reference at
LLaDA-8B's head shape: vocabulary 126,464 x hidden 4096, bfloat16, on the GPU."""
from __future__ import annotations

import pytest
import torch
from gpu_support import GPU

from dllm_constrain.kernels import masked_row_stats as mrs
from dllm_constrain.kernels._backend import last_backend
from dllm_constrain.kernels.bitmask import pack_bool_mask

pytestmark = GPU
VOCAB, HIDDEN, ROWS = 126_464, 4096, 64


@pytest.fixture(scope="module")
def head():
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = (torch.randn(VOCAB, HIDDEN, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    hidden = torch.randn(ROWS, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    allowed = torch.rand(ROWS, VOCAB, device="cuda", generator=gen) < 0.5
    allowed[: ROWS // 2] = True  # half the rows unconstrained
    allowed[-1] = False
    allowed[-1, 17] = True  # one forced row
    return hidden, weight, pack_bool_mask(allowed)


def _both(hidden, weight, mask):
    fused = mrs.masked_row_stats_from_hidden(hidden, weight, mask, 0.0, None, backend="triton")
    assert last_backend("masked_row_stats_from_hidden") == "triton"
    ref = mrs.masked_row_stats_from_hidden(hidden, weight, mask, 0.0, None, backend="torch")
    return fused, ref


def test_the_fused_head_chooses_the_reference_tokens(head) -> None:
    fused, ref = _both(*head)
    agree = (fused.token == ref.token).float().mean().item()
    assert agree >= 0.98, agree  # float32 sums in another order may swap a near tie, nothing more
    assert fused.token[-1].item() == 17


def test_the_fused_head_statistics_match_the_reference(head) -> None:
    fused, ref = _both(*head)
    same = fused.token == ref.token
    for name in ("prob", "entropy", "margin"):
        a, b = getattr(fused, name)[same].float(), getattr(ref, name)[same].float()
        torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3, msg=name)


def test_the_fused_head_honours_the_mask(head) -> None:
    hidden, weight, mask = head
    fused, _ = _both(hidden, weight, mask)
    from dllm_constrain.kernels.bitmask import unpack_bitmask

    allowed = unpack_bitmask(mask, VOCAB)
    assert allowed[torch.arange(ROWS, device="cuda"), fused.token].all()
