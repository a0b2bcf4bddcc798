"""Kernel warm-up at engine start: what it plans to compile, and that it does nothing on the CPU."""
from __future__ import annotations

import torch

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.model_runner import ModelRunner
from dllm_constrain.engine.warmup import Variant, attention_shape, head_row_counts, plan_warm_up, warm_up
from dllm_constrain.kernels.masked_row_stats import _split_plan

CUDA = torch.device("cuda")
SHAPE = dict(vocab=126_464, sms=132)  # LLaDA-8B's vocabulary on an H200


def plan(config: EngineConfig, **kw):
    return plan_warm_up(config, CUDA, **{**SHAPE, **kw})


def test_on_the_cpu_warm_up_is_a_no_op(tiny_llada) -> None:
    assert warm_up(LLMEngine(tiny_llada)) == 0.0
    assert warm_up(ModelRunner(tiny_llada, 2, EngineConfig())) == 0.0
    assert plan_warm_up(EngineConfig(), torch.device("cpu"), **SHAPE) == []


def _key(rows: int, vocab: int, sms: int) -> tuple[int, ...]:
    """What the head kernel compiles for a chunk of `rows` (its dispatcher's choices, Triton's specialisations)."""
    spec = lambda x: 1 if x == 1 else (16 if x % 16 == 0 else 0)  # noqa: E731
    block_r = 16 if rows <= 16 else (32 if rows <= 32 else 64)
    blocks = -(-rows // block_r)
    tiles, splits = _split_plan(rows, vocab, block_r, 128, max(1, -(-4 * sms // blocks)), torch.device("cpu"))
    return block_r, spec(rows), spec(tiles), spec(splits)


def test_the_planned_row_counts_meet_every_compiled_head_variant_once() -> None:
    counts = head_row_counts(4096, **SHAPE)
    planned = {_key(r, **SHAPE) for r in counts}
    assert planned == {_key(r, **SHAPE) for r in range(1, 4097)} and len(planned) == len(counts)
    assert counts[:3] == [1, 2, 16]  # the row count's own specialisations: 1, neither, a multiple of 16


def test_on_cuda_each_head_variant_is_planned_masked_or_not_greedy_or_sampling() -> None:
    full = plan(EngineConfig())
    heads = [v for v in full if v.kind == "row_stats"]
    assert {v.rows for v in heads} == set(head_row_counts(64 * 64, **SHAPE))
    assert {(v.masked, v.sampling) for v in heads} == {(False, False), (False, True), (True, False), (True, True)}
    assert len(heads) == 4 * len({v.rows for v in heads})
    assert [v.kind for v in full if v.kind != "row_stats"] == ["varlen_attention"] * 2 + ["bitmask"]


def test_a_row_cap_bounds_the_planned_chunks() -> None:
    assert {v.rows for v in plan(EngineConfig(max_logit_rows=16)) if v.kind == "row_stats"} == {1, 2, 16}
    assert {v.rows for v in plan(EngineConfig(), max_rows=16) if v.kind == "row_stats"} == {1, 2, 16}


def test_greedy_only_plans_no_sampling_variant() -> None:
    heads = [v for v in plan(EngineConfig(), sampling=False) if v.kind == "row_stats"]
    assert heads and not [v for v in heads if v.sampling]


def test_the_varlen_attention_is_planned_per_block_m_with_the_keep_mask_only_under_the_sparse_cache() -> None:
    dense = [(v.rows, v.masked) for v in plan(EngineConfig()) if v.kind == "varlen_attention"]
    sparse = [(v.rows, v.masked) for v in plan(EngineConfig(keep_ratio=0.5)) if v.kind == "varlen_attention"]
    assert dense == [(16, False), (64, False)] and sparse == [(16, True), (64, True)]
    assert not [v for v in plan(EngineConfig(keep_ratio=0.5), has_attention=False) if v.kind == "varlen_attention"]


def test_the_planned_query_rows_meet_both_block_m_of_the_kernel() -> None:
    """The kernel picks BLOCK_M from a step's longest sequence's query rows; the plan holds one count of each."""
    from dllm_constrain.kernels._triton_varlen_attention import block_sizes

    compiled = lambda rows: block_sizes(rows, 128, interpreted=False)[0]  # noqa: E731 (as on a GPU)
    planned = {compiled(v.rows) for v in plan(EngineConfig()) if v.kind == "varlen_attention"}
    assert planned == {compiled(rows) for rows in range(1, 4097)} == {16, 64}


def test_the_torch_backend_plans_no_triton_kernel_and_a_headless_model_no_head_kernel() -> None:
    assert [v.kind for v in plan(EngineConfig(backend="torch", keep_ratio=0.5))] == ["bitmask"]
    assert [v.kind for v in plan(EngineConfig(), has_lm_head=False)] == ["varlen_attention"] * 2 + ["bitmask"]
    assert [v.kind for v in plan(EngineConfig(), has_lm_head=False, has_attention=False)] == ["bitmask"]


def test_the_attention_shape_is_read_from_the_family_config(tiny_llada) -> None:
    assert attention_shape(tiny_llada) == (4, 2, 8)


def test_each_planned_variant_runs_its_kernel_on_dummy_inputs(tiny_llada) -> None:
    """Under Triton's interpreter (tests without CUDA) the dummy inputs go through the real kernels' signatures."""
    from dllm_constrain.engine.warmup import run_variant
    from dllm_constrain.kernels._backend import last_backend

    cpu = torch.device("cpu")
    for variant, op in [(Variant("row_stats", 16, masked=True, sampling=True), "masked_row_stats_from_hidden"),
                        (Variant("row_stats", 1), "masked_row_stats_from_hidden"),
                        (Variant("varlen_attention", 16), "varlen_attention"),
                        (Variant("varlen_attention", 64, masked=True), "varlen_attention")]:
        run_variant(variant, tiny_llada, cpu, "triton")
        assert last_backend(op) == "triton"
    run_variant(Variant("bitmask", 8), tiny_llada, cpu, "auto")
