"""The Refresh/Reuse KV cache: a Reuse step right after a Refresh reproduces the full forward on the active block
(LLaDA and Dream's shifted head), dense and packed layouts; refresh policies; batching; settings."""
from __future__ import annotations

import pytest
import torch
from checkpoints import build_dream, build_llada
from conftest import build_tiny_llada

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.kv_pool import KVPool
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.loader import load_checkpoint
from dllm_constrain.engine.model_runner import ModelRunner, supports_kv_cache
from dllm_constrain.engine.state import Request, SamplingParams
from dllm_constrain.errors import InvalidRequestError


@pytest.fixture(scope="module")
def llada(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("llada_kv") / "ckpt"
    build_llada(folder, max_sequence_length=256)
    return load_checkpoint(folder)


@pytest.fixture(scope="module")
def llada_shift(tmp_path_factory: pytest.TempPathFactory):
    """LLaDA with the input token shift: a span forward's first and last tokens mix in neighbours outside it."""
    folder = tmp_path_factory.mktemp("llada_shift_kv") / "ckpt"
    build_llada(folder, max_sequence_length=256, input_token_shift=True)
    return load_checkpoint(folder)


@pytest.fixture(scope="module")
def llada_shift3(tmp_path_factory: pytest.TempPathFactory):
    """LLaDA with a three-token left window in the token shift: a span's first three tokens mix in ids outside it."""
    folder = tmp_path_factory.mktemp("llada_shift3_kv") / "ckpt"
    build_llada(folder, max_sequence_length=256, input_token_shift=True, token_shift_left=3)
    return load_checkpoint(folder)


@pytest.fixture(scope="module")
def dream(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("dream_kv") / "ckpt"
    build_dream(folder)
    return load_checkpoint(folder)


def _states(engine: LLMEngine, prompts: list[list[int]], **params):
    p = SamplingParams(**{**dict(max_new_tokens=12, block_length=4), **params})
    return [engine._new_state(i, Request(ids, p)) for i, ids in enumerate(prompts)]


def _commit_some(state, positions: list[int], token: int = 40) -> None:
    state.commit(positions, [token] * len(positions))


@pytest.mark.parametrize("family", ["llada", "llada-shift", "llada-shift3", "dream"])
@pytest.mark.parametrize("packed", [False, True])
def test_reuse_right_after_refresh_equals_the_full_forward(family, packed, llada, llada_shift, llada_shift3,
                                                           dream) -> None:
    """Same canvas, no commit in between: the Reuse forward of the block (with Dream's extra left query) gives the
    hidden states the full forward gives at the block's positions, in a left-padded batch at different blocks."""
    loaded = {"llada": llada, "llada-shift": llada_shift, "llada-shift3": llada_shift3, "dream": dream}[family]
    model = loaded.model
    assert supports_kv_cache(model)
    engine = LLMEngine(model, loaded.tokenizer, config=EngineConfig(kv_cache="none"))
    states = _states(engine, [[10, 11, 12, 13, 14, 15, 16], [20, 21]])
    _commit_some(states[0], [0, 1, 2, 3, 5])  # request 0 is in block 1, with some of it committed
    states[0].block = 1
    _commit_some(states[1], [1])
    _, full, offsets = engine.runner.full_forward(states)
    runner = ModelRunner(model, model.special.pad_id, EngineConfig(keep_ratio=1.0))
    runner.reset(states)
    runner.cache = KVPool(None, sparse=packed)  # sparse keeping every key: the keep-mask path
    [(_, refreshed, r_offsets)] = runner.forward(states)
    [(_, reused, u_offsets)] = runner.forward(states)
    assert runner.refreshes == {0: 1, 1: 1}
    for r, s in enumerate(states):
        start, end = s.block_bounds()
        for p in range(start, end):
            want = full[r, offsets[r] + p]
            torch.testing.assert_close(refreshed[r, r_offsets[r] + p], want, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(reused[r, u_offsets[r] + p], want, rtol=1e-4, atol=1e-4)


def test_sparse_reuse_with_fewer_keys_differs_but_stays_close(llada) -> None:
    model = llada.model
    engine = LLMEngine(model, llada.tokenizer)
    states = _states(engine, [list(range(10, 40))], max_new_tokens=16, block_length=8)
    runner = ModelRunner(model, model.special.pad_id, EngineConfig(keep_ratio=0.5))
    runner.reset(states)
    runner.forward(states)
    [(_, sparse, offs)] = runner.forward(states)
    _, full, offsets = engine.runner.full_forward(states)
    a = sparse[0, offs[0]:offs[0] + 8]
    b = full[0, offsets[0]:offsets[0] + 8]
    assert not torch.allclose(a, b, atol=1e-6)
    assert torch.nn.functional.cosine_similarity(a, b, dim=-1).min() > 0.5
    a, b = runner._span(states[0])
    slots = runner.cache.slots(0)
    outside = torch.cat([slots[:a], slots[b:]])
    for keep in runner.cache.keep:  # per layer and KV head: ceil(0.5 * (30 + 16 - 8) outside keys), the span kept
        assert keep[:, outside].sum(1).tolist() == [19] * keep.shape[0] and keep[:, slots[a:b]].all()


def _run(model, tokenizer, prompts, config: EngineConfig, **params):
    engine = LLMEngine(model, tokenizer, config=config)
    p = SamplingParams(**{**dict(max_new_tokens=16, block_length=4), **params})
    return engine.generate([Request(ids, p) for ids in prompts]), engine


@pytest.mark.parametrize("sampling", [
    dict(temperature=0.0),
    dict(temperature=0.0, policy="threshold", threshold=0.3),
    dict(temperature=0.7, seed=3),
], ids=["greedy-quota", "greedy-threshold", "sampled-quota"])
@pytest.mark.parametrize("shift", [0, 1, 3], ids=["plain", "token-shift", "token-shift3"])
def test_refresh_every_step_is_the_full_recompute(llada, llada_shift, llada_shift3, sampling, shift) -> None:
    """Refreshing at every forward makes the cached path a full recompute: the same canvases, token for token."""
    loaded = {0: llada, 1: llada_shift, 3: llada_shift3}[shift]
    prompts = [[10, 11, 12, 13], [20, 21]]
    full, _ = _run(loaded.model, loaded.tokenizer, prompts, EngineConfig(kv_cache="none"), **sampling)
    every, _ = _run(loaded.model, loaded.tokenizer, prompts, EngineConfig(refresh="steps", refresh_steps=1),
                    **sampling)
    assert [r.canvas_ids for r in every] == [r.canvas_ids for r in full]
    assert all(r.refreshes == r.nfe for r in every)


def test_packed_cache_keeping_every_key_equals_the_dense_cache(llada) -> None:
    """keep_ratio=1 in the packed per-head layout keeps every key: Reuse steps after commits (and the refreshes
    at block changes) give the dense cache's hidden states, for a left-padded batch at different blocks."""
    model = llada.model
    engine = LLMEngine(model, llada.tokenizer)
    dense_states = _states(engine, [[10, 11, 12, 13, 14, 15, 16], [20, 21]])
    packed_states = _states(engine, [[10, 11, 12, 13, 14, 15, 16], [20, 21]])
    runners = []
    for states, packed in ((dense_states, False), (packed_states, True)):
        runner = ModelRunner(model, model.special.pad_id, EngineConfig())
        runner.reset(states)
        runner.cache = KVPool(None, sparse=packed)  # sparse keeping every key: the keep-mask path
        runners.append(runner)
    for step in range(8):  # 4-token blocks, one commit per request per step: two blocks, two refreshes each
        outputs = []
        for runner, states in zip(runners, (dense_states, packed_states)):
            [(_, hidden, offsets)] = runner.forward(states)
            outputs.append([hidden[r, offsets[r] + p] for r, s in enumerate(states) for p in s.open_in_block()])
        for a, b in zip(*outputs):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        for states in (dense_states, packed_states):
            for s in states:
                s.commit([s.open_in_block()[0]], [40 + step])
                if not s.open_in_block():
                    s.block += 1
    assert runners[1].cache.sparse and not runners[0].cache.sparse
    assert runners[0].refreshes == runners[1].refreshes == {0: 2, 1: 2}


def test_reuse_forwards_are_the_forwards_that_did_not_refresh(llada) -> None:
    """Counters: every forward of a request is either a Refresh (counted in `refreshes`) or a Reuse (seen by the
    reuse hook), and with the default settings most of them reuse the cache."""
    engine = LLMEngine(llada.model, llada.tokenizer)
    reused: dict[int, int] = {}

    def count(states, hidden, offsets) -> None:
        for s in states:
            reused[s.index] = reused.get(s.index, 0) + 1

    engine.reuse_hook = count
    p = SamplingParams(max_new_tokens=16, block_length=4)
    results = engine.generate([Request([10, 11, 12], p), Request([20, 21], p)])
    for i, res in enumerate(results):
        assert res.refreshes == res.nfe // 4  # one per block
        assert reused[i] == res.nfe - res.refreshes


def test_without_the_cache_no_forward_reuses(llada) -> None:
    """kv_cache="none": no cache is built, every forward is full and the reuse hook never runs."""
    engine = LLMEngine(llada.model, llada.tokenizer, config=EngineConfig(kv_cache="none"))
    engine.reuse_hook = lambda *a: pytest.fail("a Reuse forward ran without the cache")
    (res,) = engine.generate([Request([10, 11, 12], SamplingParams(max_new_tokens=8, block_length=4))])
    assert engine.runner.cache is None and not engine.runner.cached
    assert res.refreshes == res.nfe == 8


@pytest.mark.parametrize("config, per_block", [
    (EngineConfig(), 1),
    (EngineConfig(refresh="steps", refresh_steps=2), 2),
    (EngineConfig(refresh="adaptive", refresh_threshold=0.5), 2),
])
def test_refresh_policies(llada, config, per_block) -> None:
    """quota, 4 steps per 4-token block (one commit per forward): per block a refresh, then reuse; "steps" every
    2 forwards; "adaptive" when half the block was committed since the last refresh."""
    (res,), engine = _run(llada.model, llada.tokenizer, [[10, 11, 12]], config)
    blocks = 16 // 4
    assert res.nfe == 16
    assert res.refreshes == blocks * per_block


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("keep_ratio", [1.0, 0.5])
def test_cached_runs_give_the_same_answer_alone_and_in_a_batch(family, keep_ratio, llada, dream) -> None:
    loaded = llada if family == "llada" else dream
    prompts = [[10, 11, 12, 13, 14, 15, 16], [20, 21], [30, 31, 32]]
    config = EngineConfig(keep_ratio=keep_ratio)
    batched, engine = _run(loaded.model, loaded.tokenizer, prompts, config, temperature=0.8, seed=5,
                           policy="threshold", threshold=0.2)
    for ids, res in zip(prompts, batched):
        (alone,), _ = _run(loaded.model, loaded.tokenizer, [ids], config, temperature=0.8, seed=5,
                           policy="threshold", threshold=0.2)
        assert alone.canvas_ids == res.canvas_ids and alone.nfe == res.nfe


def test_mixed_block_lengths_in_one_batch(llada) -> None:
    """Requests whose spans differ in length run as separate Reuse groups; finished requests leave the cache."""
    engine = LLMEngine(llada.model, llada.tokenizer)
    reqs = [Request([10, 11, 12], SamplingParams(max_new_tokens=12, block_length=4)),
            Request([20, 21], SamplingParams(max_new_tokens=10, block_length=6)),
            Request([30], SamplingParams(max_new_tokens=3, block_length=3))]
    batched = engine.generate(reqs)
    for req, res in zip(reqs, batched):
        (alone,) = engine.generate([req])
        assert alone.canvas_ids == res.canvas_ids


def test_models_without_a_cached_forward_fall_back_to_full_forwards() -> None:
    from engine_fakes import ScriptedModel

    model = ScriptedModel([{5: 0.9}] * 4, prompt_len=2)
    engine = LLMEngine(model)
    (res,) = engine.generate([Request([0, 4], SamplingParams(max_new_tokens=4, block_length=4))])
    assert not engine.runner.cached and res.refreshes == res.nfe == model.forwards


def test_cached_is_faster_per_forward_than_full() -> None:
    """The point of the cache: a Reuse forward costs a fraction of a full one (here ~5x fewer token positions)."""
    import time

    model = build_tiny_llada(max_sequence_length=512)
    engine = LLMEngine(model)
    states = _states(engine, [list(range(10, 200))], max_new_tokens=32, block_length=8)
    runner = ModelRunner(model, model.special.pad_id, EngineConfig())
    runner.reset(states)
    with torch.inference_mode():
        runner.forward(states)

        def best(fn, n=5):
            times = []
            for _ in range(n):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            return min(times)

        reuse = best(lambda: runner.forward(states))
        full = best(lambda: engine.runner.full_forward(states))
    assert reuse < full


def test_bad_settings_are_refused() -> None:
    for bad in (dict(kv_cache="yes"), dict(refresh="never"), dict(refresh_steps=0), dict(keep_ratio=0.0),
                dict(keep_ratio=1.5), dict(refresh_threshold=0.0), dict(logits_budget_bytes=0), dict(backend="cuda")):
        with pytest.raises(InvalidRequestError):
            EngineConfig(**bad).validate()
    model = build_tiny_llada()
    with pytest.raises(InvalidRequestError):
        LLMEngine(model, config=EngineConfig(keep_ratio=2.0))
