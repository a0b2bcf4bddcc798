"""The step's packed forward has no host sync and no Python branch on tensor values: with its metadata built (once
per step, on the host), the forward of every layer compiles as one graph with torch.compile(fullgraph=True), the
varlen attention an opaque custom op inside it (torch.ops.dllm_constrain.varlen_attention; the sparse cache's
keep-mask selection another), under the default inductor backend as under aot_eager."""
from __future__ import annotations

import pytest
import torch
import torch._inductor.config
from conftest import build_tiny_llada

from dllm_constrain.engine.attention_step import StepAttention
from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.model_runner import ModelRunner
from dllm_constrain.engine.state import Request, SamplingParams


@pytest.mark.parametrize("backend, keep_ratio", [("inductor", 1.0), ("aot_eager", 1.0), ("aot_eager", 0.5)])
def test_a_mixed_refresh_and_reuse_step_compiles_as_one_graph_and_matches_eager(backend: str, keep_ratio: float
                                                                                ) -> None:
    """keep_ratio < 1: the sparse cache, whose Refresh writes the keep mask (one op declared to mutate it)."""
    model = build_tiny_llada()
    engine = LLMEngine(model)
    params = SamplingParams(max_new_tokens=8, block_length=4)
    states = [engine._new_state(i, Request(p, params)) for i, p in enumerate([[10, 11, 12], [20, 21, 22, 23, 24]])]
    runner = ModelRunner(model, model.special.pad_id, EngineConfig(gil_free_forward=False, keep_ratio=keep_ratio))
    runner.reset(states)
    with torch.inference_mode():
        runner.forward_rows(states[:1])  # request 0 has its cache: it reuses, request 1 refreshes
        segments = runner.plan(states)
        assert [seg.kind for seg in segments] == ["reuse", "refresh"]
        ids, pos, neighbors, total = runner._packed_inputs(segments)
        step = StepAttention.build(segments, runner.cache, ids.shape[1], runner.device, keep_ratio)

        def forward(ids: torch.Tensor, pos: torch.Tensor, neighbors: torch.Tensor) -> torch.Tensor:
            return model.hidden_states_cached(ids, pos, step.attend, neighbor_ids=neighbors)

        eager = forward(ids, pos, neighbors)
        torch._dynamo.reset()
        graphs = []

        def counting(gm: torch.fx.GraphModule, inputs: list) -> object:
            graphs.append(gm)
            return torch._dynamo.lookup_backend(backend)(gm, inputs)

        with torch._inductor.config.patch(force_disable_caches=True):  # a cached graph may predate the op's code
            compiled = torch.compile(forward, fullgraph=True, backend=counting)(ids, pos, neighbors)
    assert len(graphs) == 1
    ops = torch.ops.dllm_constrain
    for op, per_layer in [(ops.varlen_attention, 1), (ops.mark_salient_keys_, int(keep_ratio < 1))]:
        calls = [n for n in graphs[0].graph.nodes if n.target in (op, op.default)]
        assert len(calls) == per_layer * model.config.n_layers  # one opaque call per layer
    torch.testing.assert_close(compiled[0, :total], eager[0, :total], rtol=1e-5, atol=1e-5)
