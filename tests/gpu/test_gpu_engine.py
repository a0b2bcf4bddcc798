"""The engine on the GPU: a tiny LLaDA gives the CPU's tokens (greedy, same prompts) to within float differences,
and a sharded checkpoint (model-0000x-of-0000y.safetensors + index) loads onto the device."""
from __future__ import annotations

import json

import pytest
import torch
from checkpoints import build_llada
from gpu_support import GPU

import dllm_constrain as dc
from dllm_constrain.engine.loader import load_checkpoint

pytestmark = GPU
PROMPTS = ["hello", '{"name": "Ada"', "The quick brown fox", "Schema: ", "code = [1, 2", "naïve café", "x", "42"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llada")
    build_llada(folder, seed=3, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden_size=128)
    return folder


def test_cpu_and_cuda_commit_the_same_tokens(checkpoint) -> None:
    kw = dict(max_new_tokens=32, block_length=16, temperature=0.0)
    cpu = dc.LLM(checkpoint, device="cpu", dtype="float32", prompt_format="raw").generate(PROMPTS, **kw)
    gpu = dc.LLM(checkpoint, device="cuda", dtype="float32", prompt_format="raw").generate(PROMPTS, **kw)
    pairs = [(a, b) for x, y in zip(cpu, gpu) for a, b in zip(x.canvas_ids, y.canvas_ids)]
    agree = sum(a == b for a, b in pairs) / len(pairs)
    assert agree >= 0.95, agree


def test_a_sharded_checkpoint_loads_onto_the_gpu(tmp_path) -> None:
    model = build_llada(tmp_path, seed=5, max_shard_bytes=40_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all(s.startswith("model-0000") for s in shards)
    loaded = load_checkpoint(tmp_path, device="cuda")
    params = dict(loaded.model.named_parameters())
    assert {p.device.type for p in params.values()} == {"cuda"}
    for name, p in model.named_parameters():
        torch.testing.assert_close(params[name].cpu(), p, atol=0, rtol=0)
    [res] = dc.LLM(tmp_path, device="cuda", prompt_format="raw").generate(["hello"], max_new_tokens=8, block_length=8)
    assert len(res.canvas_ids) == 8
