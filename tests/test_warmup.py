"""Kernel warm-up at engine start: what it plans to compile, and that it does nothing on the CPU."""
from __future__ import annotations

import torch

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.model_runner import ModelRunner
from dllm_constrain.engine.warmup import ROW_COUNTS, Variant, attention_shape, plan_warm_up, warm_up

CUDA = torch.device("cuda")


def test_on_the_cpu_warm_up_is_a_no_op(tiny_llada) -> None:
    assert warm_up(LLMEngine(tiny_llada)) == 0.0
    assert warm_up(ModelRunner(tiny_llada, 2, EngineConfig())) == 0.0
    assert plan_warm_up(EngineConfig(), torch.device("cpu")) == []


def test_on_cuda_every_row_bucket_and_specialisation_of_the_head_pass_is_planned() -> None:
    plan = plan_warm_up(EngineConfig(), CUDA)
    heads = [v for v in plan if v.kind == "row_stats"]
    assert {v.rows for v in heads} == set(ROW_COUNTS)  # BLOCK_R 16 / 32 / 64; row counts 1, x16, other
    assert {(v.masked, v.sampling) for v in heads} == {(False, False), (False, True), (True, False), (True, True)}
    assert len(heads) == len(ROW_COUNTS) * 4
    assert Variant("bitmask", 64) in plan
    assert not [v for v in plan if v.kind == "packed_attention"]  # dense cache: no sparse attention kernel


def test_a_row_cap_bounds_the_planned_chunks() -> None:
    plan = plan_warm_up(EngineConfig(max_logit_rows=16), CUDA)
    assert {v.rows for v in plan if v.kind == "row_stats"} == {1, 8, 16}


def test_sparse_reuse_plans_the_packed_attention_per_span_bucket() -> None:
    plan = plan_warm_up(EngineConfig(keep_ratio=0.5), CUDA)
    assert [v.rows for v in plan if v.kind == "packed_attention"] == [16, 32]
    assert not [v for v in plan_warm_up(EngineConfig(keep_ratio=0.5), CUDA, has_attention=False)
                if v.kind == "packed_attention"]


def test_the_torch_backend_and_headless_models_plan_no_triton_kernels() -> None:
    assert [v.kind for v in plan_warm_up(EngineConfig(backend="torch", keep_ratio=0.5), CUDA)] == ["bitmask"]
    assert [v.kind for v in plan_warm_up(EngineConfig(), CUDA, has_lm_head=False)] == ["bitmask"]


def test_the_attention_shape_is_read_from_the_family_config(tiny_llada) -> None:
    assert attention_shape(tiny_llada) == (4, 2, 8)


def test_each_planned_variant_runs_its_kernel_on_dummy_inputs(tiny_llada) -> None:
    """Under Triton's interpreter (tests without CUDA) the dummy inputs go through the real kernels' signatures."""
    from dllm_constrain.engine.warmup import run_variant
    from dllm_constrain.kernels._backend import last_backend

    cpu = torch.device("cpu")
    for variant, op in [(Variant("row_stats", 16, masked=True, sampling=True), "masked_row_stats_from_hidden"),
                        (Variant("row_stats", 1), "masked_row_stats_from_hidden"),
                        (Variant("packed_attention", 16), "packed_kv_attention")]:
        run_variant(variant, tiny_llada, cpu, "triton")
        assert last_backend(op) == "triton"
    run_variant(Variant("bitmask", 8), tiny_llada, cpu, "auto")
