"""preset="reference" reproduces the published decoding loops of LLaDA and Dream token for token (greedy).

The oracles below are written from the families' published decoding rules (not from their code) and run the same
model's full forward at every step, as the authors' loops do:

LLaDA generate(prompt, steps, gen_length, block_length, temperature=0, remasking="low_confidence"):
    the answer starts all-mask; num_blocks = gen_length / block_length, steps per block = steps / num_blocks; per
    block the count committed at each step is get_num_transfer_tokens: base = mask_count // steps_per_block, the
    first (mask_count % steps_per_block) steps one more; at each step x0 = argmax of the logits at every position,
    confidence = softmax probability of x0, -inf outside the current block and at committed positions; the
    `count` most confident masked positions take x0.
Dream diffusion_generate(max_new_tokens, steps, eps=1e-3, alg, temperature=0):
    timesteps = linspace(1, eps, steps + 1) (float32); at step i, t = timesteps[i], s = timesteps[i + 1], n = the
    number of masked positions of the answer; it commits int(n * (1 - s / t)) if i < steps - 1 else n positions,
    the ones of highest confidence: alg="entropy" negative entropy of the softmax, "maskgit_plus" the top-1
    probability, "topk_margin" top-1 minus top-2 probability; x0 = argmax.
Special-token handling (stated in docs/checkpoints.md): a position never takes the mask token, BOS (when distinct
from EOS/pad) or an id past the tokenizer's vocabulary (the padded embedding rows), so the oracle's softmax runs
over the other ids; the answer ends at the first EOS or stop id (the authors' demos cut the text there).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dllm_constrain as dc
from dllm_constrain.engine.policies import linspace_count
from checkpoints import build_dream_instruct
from llm_fixtures import dream, llada  # noqa: F401 - module-scoped fixtures, used by name


def _banned(llm: dc.LLM) -> torch.Tensor:
    """Ids no canvas position may take (the engine's rule, stated in the module docstring)."""
    sp = llm.model.special
    banned = torch.zeros(llm.engine.vocab_size, dtype=torch.bool)
    for tok in (sp.mask_id, sp.bos_id, sp.pad_id):
        if tok is not None and tok != sp.eos_id:
            banned[tok] = True
    banned[llm.tokenizer.vocab_size:] = True
    return banned


def _probs(llm: dc.LLM, x: torch.Tensor) -> torch.Tensor:
    """[L, V] float32 softmax over the allowed ids of the model's full forward on the sequence x [L]."""
    with torch.inference_mode():
        logits = llm.model.logits(llm.model.hidden_states(x[None]))[0].float()
    return torch.softmax(logits.masked_fill(_banned(llm), float("-inf")), dim=-1)


def llada_generate(llm: dc.LLM, prompt: list[int], gen_length: int, block_length: int, steps: int) -> list[int]:
    mask = llm.model.special.mask_id
    x = torch.tensor(prompt + [mask] * gen_length)
    num_blocks = gen_length // block_length
    per_block = steps // num_blocks
    for b in range(num_blocks):
        lo, hi = len(prompt) + b * block_length, len(prompt) + (b + 1) * block_length
        n = int((x[lo:hi] == mask).sum())
        counts = [n // per_block + (1 if i < n % per_block else 0) for i in range(per_block)]
        for count in counts:
            p = _probs(llm, x)
            conf, x0 = p.max(dim=-1)
            conf[:lo] = float("-inf")
            conf[hi:] = float("-inf")
            conf[x != mask] = float("-inf")
            take = torch.topk(conf, count).indices
            x[take] = x0[take]
    return x[len(prompt):].tolist()


def dream_generate(llm: dc.LLM, prompt: list[int], max_new_tokens: int, steps: int, alg: str,
                   eps: float = 1e-3) -> list[int]:
    mask = llm.model.special.mask_id
    x = torch.tensor(prompt + [mask] * max_new_tokens)
    timesteps = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        masked = x == mask
        p = _probs(llm, x)
        top2 = p.topk(2, dim=-1).values
        conf = {"entropy": (p * torch.log(p.clamp_min(1e-30))).nansum(dim=-1),
                "maskgit_plus": top2[:, 0], "topk_margin": top2[:, 0] - top2[:, 1]}[alg]
        x0 = p.argmax(dim=-1)
        t, s = timesteps[i], timesteps[i + 1]
        n = masked.sum() / 1  # a float32 count, as in the published loop
        count = int(n * (1 - s / t)) if i < steps - 1 else int(n)
        if count > 0:
            take = torch.topk(conf.masked_fill(~masked, float("-inf")), count).indices
            x[take] = x0[take]
    return x[len(prompt):].tolist()


def _until_stop(ids: list[int], stops: set[int]) -> list[int]:
    end = next((i for i, t in enumerate(ids) if t in stops), len(ids))
    return ids[:end]


def _stops(llm: dc.LLM) -> set[int]:
    return {llm.model.special.eos_id, *llm.defaults.stop_token_ids}


@pytest.mark.parametrize(("prompt", "gen_length", "block_length", "steps"),
                         [("Hi there", 16, 8, 8), ("Name Ada, age 36.", 24, 8, 12), ("Tell me", 12, 4, 12)])
def test_llada_reference_preset_equals_the_published_generate_loop(llada: dc.LLM, prompt: str, gen_length: int,
                                                                   block_length: int, steps: int) -> None:
    ids = llada.prompt_ids(prompt)
    expected = _until_stop(llada_generate(llada, ids, gen_length, block_length, steps), _stops(llada))
    [res] = llada.generate(prompt, max_new_tokens=gen_length, block_length=block_length, steps=steps,
                           preset="reference")
    assert res.token_ids == expected


@pytest.mark.parametrize("alg", ["entropy", "maskgit_plus", "topk_margin"])
@pytest.mark.parametrize(("prompt", "max_new_tokens", "steps"), [("Hi there", 16, 16), ("Name Ada.", 20, 7)])
def test_dream_reference_preset_equals_the_published_diffusion_generate_loop(
        dream: dc.LLM, alg: str, prompt: str, max_new_tokens: int, steps: int) -> None:
    policy = {"entropy": "entropy", "maskgit_plus": "quota", "topk_margin": "margin"}[alg]
    ids = dream.prompt_ids(prompt)
    expected = _until_stop(dream_generate(dream, ids, max_new_tokens, steps, alg), _stops(dream))
    [res] = dream.generate(prompt, max_new_tokens=max_new_tokens, steps=steps, policy=policy, preset="reference")
    assert res.token_ids == expected
    assert res.nfe <= steps  # the schedule's steps that commit nothing cost no forward here


def test_dream_generation_config_alg_picks_the_ranking(tmp_path: Path) -> None:
    model = build_dream_instruct(tmp_path, seed=5, generation_config={"eos_token_id": 1, "alg": "topk_margin",
                                                                       "eps": 0.01, "steps": 9})
    del model
    llm = dc.LLM(tmp_path, freeze_gc_heap=False)
    assert (llm.defaults.policy, llm.defaults.schedule_eps, llm.defaults.steps) == ("margin", 0.01, 9)
    ids = llm.prompt_ids("Hi there")
    expected = _until_stop(dream_generate(llm, ids, 12, 9, "topk_margin", eps=0.01), _stops(llm))
    assert llm.generate("Hi there", max_new_tokens=12, preset="reference")[0].token_ids == expected


def test_linspace_count_is_int_n_times_one_minus_s_over_t_in_float32() -> None:
    """k(i) = int(n * (1 - s / t)), t, s = torch.linspace(1, eps, steps + 1)[i, i + 1] (float32, torch's own
    linspace: numpy's float64 one rounds to other float32 values); n at the last step."""
    import numpy as np

    for steps, eps in [(8, 1e-3), (64, 1e-3), (7, 0.05)]:
        ts = torch.linspace(1, eps, steps + 1).numpy()
        for n in (1, 5, 31, 64, 500):
            for i in range(steps):
                want = n if i == steps - 1 else int(np.float32(n) * (np.float32(1) - ts[i + 1] / ts[i]))
                assert linspace_count(n, i, steps, eps) == want, (steps, eps, n, i)


def test_the_linspace_schedule_commits_everything_by_its_last_step(dream: dc.LLM) -> None:
    for steps in (1, 3, 16, 40):
        [res] = dream.generate("Hi", max_new_tokens=16, steps=steps, preset="reference")
        assert res.nfe <= steps and len(res.canvas_ids) == 16 and res.finish_reason in ("eos", "length")


def test_order_temperature_draws_positions_with_softmax_of_score_over_tau() -> None:
    """Dream's alg_temp: the k positions are drawn without replacement with p = softmax(confidence / alg_temp)."""
    from collections import Counter

    from dllm_constrain.engine.policies import _drawn_rows

    gen = torch.Generator().manual_seed(0)
    score = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    ok = torch.ones(3, dtype=torch.bool)
    for tau, want in [(1.0, [0.6, 0.3, 0.1]), (0.5, [0.36 / 0.46, 0.09 / 0.46, 0.01 / 0.46])]:
        counts = Counter(_drawn_rows(score, ok, 1, tau, gen).commit[0] for _ in range(4000))
        assert all(abs(counts[i] / 4000 - want[i]) < 0.03 for i in range(3)), (tau, counts)
    assert sorted(_drawn_rows(score, ok, 3, 1.0, gen).commit) == [0, 1, 2]  # without replacement
    assert _drawn_rows(score, torch.tensor([False, True, True]), 3, 1.0, gen).commit.count(0) == 0


def test_order_temperature_is_seeded_and_near_zero_is_the_greedy_order(dream: dc.LLM) -> None:
    options = {"max_new_tokens": 16, "steps": 8, "preset": "reference"}
    greedy = dream.generate("Hi there", **options)[0].token_ids
    assert dream.generate("Hi there", order_temperature=1e-9, seed=1, **options)[0].token_ids == greedy
    drawn = [dream.generate("Hi there", order_temperature=5.0, seed=s, **options)[0].token_ids for s in (1, 1, 2, 3)]
    assert drawn[0] == drawn[1] and any(d != greedy for d in drawn)


def _block_state(n: int, steps: int, schedule: str) -> Any:
    from dllm_constrain.engine.state import RequestState, SamplingParams

    params = SamplingParams(max_new_tokens=n, block_length=n, steps=steps, schedule=schedule)
    return RequestState(index=0, prompt_ids=[0], params=params, canvas=torch.zeros(n, dtype=torch.long),
                        committed=torch.zeros(n, dtype=torch.bool), generator=None)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), steps=st.integers(1, 300))
def test_the_uniform_schedule_is_get_num_transfer_tokens_on_an_untouched_block(n: int, steps: int) -> None:
    """LLaDA: per step base = n // steps, the first n % steps steps one more (steps <= n; more steps than
    positions commit one per step)."""
    from dllm_constrain.engine.policies import commit_count

    state, left, counts = _block_state(n, steps, "uniform"), n, []
    while left:
        counts.append(commit_count(state, left))
        left -= counts[-1]
        state.block_step += 1
    if steps <= n:
        assert counts == [n // steps + (1 if i < n % steps else 0) for i in range(steps)]
    else:
        assert counts == [1] * n


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), steps=st.integers(1, 300))
def test_the_linspace_schedule_follows_dreams_counts_and_skips_only_empty_steps(n: int, steps: int) -> None:
    """Dream: the count at step i is int(n_i * (1 - s / t)) on the positions still masked, n_i at the last step; the
    engine spends a forward only on the steps whose count is above 0."""
    from dllm_constrain.engine.policies import commit_count

    state, left, spent = _block_state(n, steps, "linspace"), n, 0
    expected_left = n
    for i in range(steps):
        want = linspace_count(expected_left, i, steps, 1e-3)
        expected_left -= want
        if want and state.schedule_step <= i:
            got = commit_count(state, left)
            assert got == want and state.schedule_step == i + 1
            left -= got
            spent += 1
    assert left == expected_left == 0 and spent <= steps
