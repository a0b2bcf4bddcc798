"""benchmarks/bench_gpu.py runs end to end at its tiny shape on the CPU, so the GPU check's code is tested here."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"


@pytest.fixture(scope="module")
def bench_gpu():
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tiny_shape_runs_every_step_kind_and_writes_its_json(bench_gpu, tmp_path) -> None:
    report = bench_gpu.main(["--tiny", "--device", "cpu", "--batches", "1,2", "--prompt", "8", "--canvas", "32",
                             "--block", "16", "--sections", "steps,constrained", "--constrained-batch", "2",
                             "--out", str(tmp_path)])
    assert json.loads((tmp_path / "bench_gpu.json").read_text()) == json.loads(json.dumps(report))
    one, two = report["steps"]
    assert (one["batch"], two["batch"]) == (1, 2)
    assert one["committed_tokens"] == 32 and two["committed_tokens"] == 64
    assert set(two["step_ms_median"]) == {"refresh", "reuse", "mixed"}  # the late request arrives mid-block
    assert one["head_passes_per_step"] == 1.0 and one["dispatched_device_ops_per_step"] > 0
    assert report["constrained"]["constrained"]["committed_tokens"] == 64


def test_the_8b_shape_is_llada_8b(bench_gpu) -> None:
    from dllm_constrain.engine.models.llada import LLaDAConfig

    cfg = LLaDAConfig(**bench_gpu.LLADA_8B, **bench_gpu.SPECIALS)
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.mlp_hidden_size, cfg.padded_vocab) == \
        (32, 4096, 32, 32, 12288, 126464)
    assert cfg.head_dim == 128


def test_the_ops_per_layer_of_a_mixed_step_do_not_grow_with_the_batch(bench_gpu) -> None:
    """The attention is one op per layer whatever the sequences' shapes (torch.ops.dllm_constrain.varlen_attention)."""
    report = bench_gpu.main(["--tiny", "--device", "cpu", "--batches", "1,8,32", "--sections", "layer_ops"])
    rows = report["layer_ops"]
    assert [(r["refresh"], r["reuse"]) for r in rows] == [(0, 1), (4, 4), (16, 16)]
    assert len({r["layer_ops_per_layer"] for r in rows}) == 1, rows
