"""The GIL-free forward (EngineConfig.gil_free_forward): LLaDA's and Dream's packed span forward as a TorchScript twin,
started on torch's inter-op pool.

Specifications:
  * for any mix of Refresh, Reuse and cache-less rows in one packed forward, the twin's hidden states and the cache
    entries it leaves are bitwise those of the eager forward (grouped-query heads, the input token shift with a wide
    left window, q/k/v biases, Dream's shifted output);
  * the forward runs to its end while the calling thread holds the GIL (no tensor handed to it from Python makes it
    wait for the GIL: they are pinned);
  * generate() gives the same canvases and forward counts with and without it, constrained or not, serial or with
    mask workers;
  * by default it is on exactly when the loop has mask workers and the model runs on the CPU; never with the sparse
    (packed per-head) cache, whose kernels stay eager, nor with a single usable core; a bad value is a typed error.
"""
from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import build_tiny_llada, build_tiny_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.model_runner import ModelRunner
from dllm_constrain.engine.models.dream import DreamConfig, DreamModel
from dllm_constrain.engine.models.llada import LLaDAConfig, LLaDAModel
from dllm_constrain.engine.attention_step import StepAttention
from dllm_constrain.engine.kv_pool import KVPool
from dllm_constrain.engine.model_runner import Segment
from dllm_constrain.engine.models.scripted_forward import start_span_forward
from dllm_constrain.engine.placement import usable_cores
from dllm_constrain.engine.state import Request, SamplingParams
from dllm_constrain.errors import InvalidRequestError


def _shifted_llada() -> LLaDAModel:
    """Full heads, the input token shift with a 3-token left window, and q/k/v biases."""
    torch.manual_seed(1)
    cfg = LLaDAConfig(d_model=32, n_layers=2, n_heads=4, mlp_hidden_size=64, vocab_size=260, mask_token_id=3,
                      eos_token_id=1, pad_token_id=2, bos_token_id=0, max_sequence_length=256,
                      include_qkv_bias=True, input_token_shift=True, token_shift_left=3)
    model = LLaDAModel(cfg).eval()
    with torch.no_grad():  # taps start at zero in training; random here, so that they count
        for name, p in model.named_parameters():
            if "shift" in name or name.endswith("bias"):
                p.normal_(0, 0.2)
    return model


def _tiny_dream() -> DreamModel:
    """Dream's Qwen2 layout (q/k/v biases, grouped-query heads) and shifted output, with this suite's special ids."""
    torch.manual_seed(2)
    cfg = DreamConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=260, mask_token_id=3, eos_token_id=1, pad_token_id=2,
                      bos_token_id=0, rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=256)
    model = DreamModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.2)
    return model


MODELS = {"gqa": build_tiny_llada(), "shifted": _shifted_llada(), "dream": _tiny_dream()}
needs_two_cores = pytest.mark.skipif(usable_cores() < 2, reason="the GIL-free forward runs only with 2 usable cores")
TOKENIZER = build_tiny_tokenizer()
COMPILER = ConstraintCompiler(TokenizerInfo.from_tokenizer(TOKENIZER, eos_id=1, mask_id=3, vocab_size=260))
SCHEMA = COMPILER.compile_json_schema({"type": "object", "properties": {"n": {"type": "integer"}},
                                      "required": ["n"]}, additional_properties="forbid")


def _state(engine: LLMEngine, index: int, prompt: list[int], n: int, block: int):
    return engine._new_state(index, Request(prompt, SamplingParams(max_new_tokens=n, block_length=block)))


def _steps(model: LLaDAModel | DreamModel, config: EngineConfig, schedule: list[list[int]], commits: list[list[int]]):
    """Run `schedule` (the requests in each step's forward) through a runner; before each step, commit the given
    canvas positions of every request (so refreshes and reuse spans move). Returns every step's hidden rows and the
    final cache entries."""
    engine = LLMEngine(model)
    runner = ModelRunner(model, model.special.pad_id, config)
    assert (runner.scripted is not None) == bool(config.gil_free_forward)
    prompts = {0: [10, 11, 12], 1: [20], 2: [5, 6, 7, 8, 9], 3: [40, 41]}
    states = {i: _state(engine, i, p, 6, 2 + i % 2) for i, p in prompts.items()}
    out = []
    with torch.inference_mode():
        for step, (running, commit) in enumerate(zip(schedule, commits)):
            for i in running:
                s = states[i]
                for p in commit:
                    if p < s.canvas_len and not s.committed[p]:
                        s.canvas[p] = 20 + (p * 7 + step) % 200
                        s.committed[p] = True
                while s.block < s.canvas_len // s.params.block_length - 1 and \
                        bool(s.committed[slice(*s.block_bounds())].all()):
                    s.block += 1
            rows = runner.forward_rows([states[i] for i in running])
            out.append([(r.state.index, r.offset, r.hidden.clone()) for r in rows])
    pool = runner.cache
    entries = {} if pool is None else {i: ([k[:, pool.slots(i)] for k in pool.k],
                                           [v[:, pool.slots(i)] for v in pool.v]) for i in pool.owned}
    return out, entries


@needs_two_cores
@settings(max_examples=24, deadline=None)
@given(model=st.sampled_from(sorted(MODELS)), kv_cache=st.sampled_from(["dual", "none"]),
       schedule=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True), min_size=1, max_size=6),
       commits=st.lists(st.lists(st.integers(0, 5), max_size=3), min_size=6, max_size=6))
def test_the_twin_gives_bitwise_the_eager_hidden_states_and_cache(model, kv_cache, schedule, commits) -> None:
    """Refresh, Reuse and cache-less rows of several requests in each forward, blocks moving as positions commit:
    every hidden state and every cached key/value is bitwise the eager one."""
    m = MODELS[model]
    eager, eager_cache = _steps(m, EngineConfig(kv_cache=kv_cache, gil_free_forward=False), schedule, commits)
    twin, twin_cache = _steps(m, EngineConfig(kv_cache=kv_cache, gil_free_forward=True), schedule, commits)
    assert len(eager) == len(twin)
    for a, b in zip(eager, twin):
        assert [(i, o) for i, o, _ in a] == [(i, o) for i, o, _ in b]
        for (_, _, ha), (_, _, hb) in zip(a, b):
            assert torch.equal(ha, hb)
    assert eager_cache.keys() == twin_cache.keys()
    for i, (ks, vs) in eager_cache.items():
        tk, tv = twin_cache[i]
        assert all(torch.equal(x, y) for x, y in zip(ks + vs, tk + tv)) and len(ks) == len(tk)


def _ends_while_holding_the_gil(start):
    """Start a forward, then spin on this thread with a switch interval of a minute, so that this thread keeps the GIL
    while it spins: the forward must end meanwhile (bounded: 30 s)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        running = start()
        deadline = time.monotonic() + 30.0
        while not running.future.done() and time.monotonic() < deadline:
            pass
        finished = running.future.done()
    finally:
        sys.setswitchinterval(interval)
    assert finished
    return running.wait()


@needs_two_cores
@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_forward_ends_while_the_calling_thread_holds_the_gil(model) -> None:
    """A refresh, then a reuse step that writes into the refresh's pool slots (tensors handed in from Python)."""
    weights = MODELS[model].scripted_weights()
    n = 12
    ids = torch.arange(20, 20 + n)[None]
    pos = torch.arange(n)[None]
    nb = torch.full((1, n, len(weights.shifts)), -1, dtype=torch.long)
    pool = KVPool(None)
    pool.admit(0, n)
    pool.ensure(len(weights.layers), weights.n_kv, weights.head_dim, weights.wte.dtype)
    request = SimpleNamespace(index=0)
    refresh = StepAttention.build([Segment(request, "refresh", 0, 0, n, (8, n))], pool, n, torch.device("cpu"))
    reuse = StepAttention.build([Segment(request, "reuse", 0, 8, 4, (8, n))], pool, 4, torch.device("cpu"))
    with torch.inference_mode():
        _ends_while_holding_the_gil(lambda: start_span_forward(weights, ids, pos, nb, refresh, pool.k, pool.v))
        _ends_while_holding_the_gil(
            lambda: start_span_forward(weights, ids[:, 8:], pos[:, 8:], nb[:, 8:], reuse, pool.k, pool.v))


def _requests(forced: bool) -> list[Request]:
    def params(n: int, block: int, seed: int) -> SamplingParams:
        return SamplingParams(max_new_tokens=n, block_length=block, temperature=0.9, seed=seed, policy="threshold",
                              threshold=0.3, forced_tokens=forced)
    return [Request([70, 71], params(12, 6, 1), SCHEMA.new_canvas_state(12, expand_budget=None,
                                                                        timeout_s=None)),
            Request([100, 101], params(8, 4, 2)), Request([60, 61, 62], params(6, 3, 3))]


@needs_two_cores
@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("workers", [0, 1])
def test_generate_gives_the_same_outputs_with_the_twin(model, workers) -> None:
    engine = LLMEngine(MODELS[model], TOKENIZER)
    for forced in (True, False):
        base = engine.generate(_requests(forced), config=EngineConfig(mask_workers=workers, gil_free_forward=False))
        twin = engine.generate(_requests(forced), config=EngineConfig(mask_workers=workers, gil_free_forward=True))
        assert [(r.canvas_ids, r.nfe) for r in base] == [(r.canvas_ids, r.nfe) for r in twin]
        assert SCHEMA.accepts_tokens(twin[0].token_ids)


def _loop_runner(config: EngineConfig) -> ModelRunner:
    engine = LLMEngine(MODELS["gqa"], TOKENIZER)
    loop = engine._new_loop(config.validate(), engine.scheduler_config)
    try:
        return loop.runner
    finally:
        loop.close()


@needs_two_cores
def test_by_default_the_twin_runs_when_the_loop_has_mask_workers_on_the_cpu() -> None:
    assert _loop_runner(EngineConfig(mask_workers=1)).scripted is not None
    assert _loop_runner(EngineConfig(mask_workers=0)).scripted is None
    assert _loop_runner(EngineConfig(mask_workers=1, gil_free_forward=False)).scripted is None
    assert _loop_runner(EngineConfig(mask_workers=0, gil_free_forward=True)).scripted is not None


def test_the_sparse_cache_keeps_the_eager_forward() -> None:
    assert _loop_runner(EngineConfig(mask_workers=1, keep_ratio=0.5)).scripted is None
    assert _loop_runner(EngineConfig(gil_free_forward=True, keep_ratio=0.5)).scripted is None


def test_a_single_usable_core_keeps_the_eager_forward(monkeypatch) -> None:
    """Nothing can run beside the forward on one core (and torch aborts at exit after a fork there)."""
    monkeypatch.setattr("dllm_constrain.engine.model_runner.usable_cores", lambda: 1)
    assert _loop_runner(EngineConfig(mask_workers=1)).scripted is None
    assert _loop_runner(EngineConfig(gil_free_forward=True)).scripted is None


def test_a_bad_value_is_a_typed_error() -> None:
    with pytest.raises(InvalidRequestError, match="gil_free_forward"):
        EngineConfig(gil_free_forward="yes").validate()
